//! Hibernated sessions that wake on any node of the fleet (docs/fleet.md).
//!
//! In a fleet, an operator's or a delegate's session hibernates with its
//! files and its globals, and this node publishes that snapshot to the
//! fleet's store. A run (or RESUME) of it then waits while the fleet
//! settles it:
//!
//! - on this node, its publication is claimed first; if another node
//!   claimed it already, this node's copy is closed and the run is told
//!   where the session went;
//! - on a node that does not have it, it is fetched, brought into the
//!   owner's store (each content checked against its hash, within the
//!   owner's room), made here on a new disk, and only then claimed: if the
//!   claim is lost, what was made here goes; if anything before fails, the
//!   fleet keeps it as it was.
//!
//! Only one claim of a publication succeeds, so a session wakes on one
//! node. The reactor never waits: each step is a job of the fleet's
//! transfers thread or of the disks' thread, answered with a wake.

use agentos_proto::payload::{ExecReply, ExecRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use crate::address::{Answer, Reply, ReplyTo};
use crate::exec::{
    Exec, FleetFiles, ImportError, SessionRecord, Share, StoreError, TemplateMoveError,
};
use crate::fleet::kept::{Held, HeldWork, Step, PUBLISHING};
use crate::fleet::owners::fleet_owner;
use crate::fleet::sessions::{Claim, Key, Publication, SessionJob, SessionNews};
use crate::fleet::tasks::FleetOwner;
use crate::fleet::{Fleet, FleetError};
use crate::identity::Principal;
use crate::tasks::Tasks;

/// Work one session may have waiting for the fleet; more is `busy`.
const MAX_HELD: usize = 64;

/// Run `request` of `principal`'s (within `share`), answered at
/// `reply_to`: returned to go on at once, or `None` while it waits for the
/// fleet to settle its session.
pub fn hold_run(
    fleet: &mut Fleet,
    exec: &mut Exec,
    request: ExecRequest,
    (principal, share): (Principal, Share),
    reply_to: ReplyTo,
) -> Result<Option<ExecRequest>, ErrorReply> {
    let Some(name) = request.session.clone() else {
        return Ok(Some(request));
    };
    let key = (principal, name);
    if !must_wait(fleet, exec, &key, share)? {
        return Ok(Some(request));
    }
    let what = Held::Run(Box::new(request));
    let work = HeldWork {
        what,
        principal,
        reply_to,
    };
    fleet.kept.hold(&key, work);
    Ok(None)
}

/// Whether RESUME of `principal`'s session `name` (within `share`),
/// answered at `reply_to`, waits for the fleet to settle it: answered once
/// it has.
pub fn holds_resume(
    fleet: &mut Fleet,
    exec: &mut Exec,
    (principal, share): (Principal, Share),
    name: &str,
    reply_to: ReplyTo,
) -> Result<bool, ErrorReply> {
    let key = (principal, name.to_owned());
    if !must_wait(fleet, exec, &key, share)? {
        return Ok(false);
    }
    let work = HeldWork {
        what: Held::Resume(key.1.clone()),
        principal,
        reply_to,
    };
    fleet.kept.hold(&key, work);
    Ok(true)
}

/// Whether work on session `key` waits for the fleet to settle it: it is
/// being settled, or is to be now (its first step asked of the fleet).
fn must_wait(
    fleet: &mut Fleet,
    exec: &mut Exec,
    key: &Key,
    share: Share,
) -> Result<bool, ErrorReply> {
    if fleet.kept.step(key).is_some() {
        if fleet.kept.held(key) >= MAX_HELD {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!("{MAX_HELD} requests already wait for session {:?}", key.1),
            ));
        }
        return Ok(true);
    }
    let Ok(link) = fleet.link().cloned() else {
        return Ok(false);
    };
    let here = exec.disks().store.stored.record(key).is_some();
    let publication = fleet.kept.publication(key).filter(|_| here);
    let owner = match fleet_owner(key.0) {
        Ok(Some(owner)) => owner,
        Ok(None) => return Ok(false),
        // One this node published is never woken unclaimed.
        Err(err) if publication.is_some() => return Err(err.into_reply()),
        Err(_) => return Ok(false),
    };
    let (job, step) = if here {
        // This node's own: claimed first if it published it.
        let generation = match publication {
            None => return Ok(false),
            Some(PUBLISHING) => match fleet.kept.generation_here(&owner, &key.1, link.node())? {
                Some(generation) => generation,
                None => {
                    unpublish(fleet, exec, key);
                    return Ok(false);
                }
            },
            Some(generation) => generation,
        };
        (
            claim(key, owner, generation, false),
            Step::Claiming(generation),
        )
    } else {
        let disks = &exec.disks().store;
        let gone = fleet.kept.take_gone(key);
        if fleet.kept.find(&owner, &key.1).is_none() {
            return match gone {
                Some(by) => Err(went_to(key, by)),
                None => Ok(false),
            };
        }
        // Made here, it takes a disk of its owner's share, as do the
        // others being brought here.
        let settling = fleet.kept.settling_keys();
        disks.may_make(key, share, settling.iter())?;
        let staging = disks.fleet_staging.dir_for(key).ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::Unavailable,
                "sessions have no disks here, so a session the fleet keeps cannot wake here",
            )
        })?;
        let job = SessionJob::Fetch {
            key: key.clone(),
            owner,
            name: key.1.clone(),
            staging,
            max_bytes: disks.fleet_staging.max_bytes(),
            templates_here: disks.templates.names(),
        };
        (job, Step::Fetching)
    };
    link.session(job).map_err(|err| err.into_reply())?;
    fleet.kept.set_step(key, step);
    Ok(true)
}

/// This node's publications, as its sessions' records keep them through
/// a restart.
pub fn recall(fleet: &mut Fleet, exec: &mut Exec) {
    for (key, record) in exec.disks().store.stored.records() {
        if let Some(generation) = record.published {
            fleet.kept.published(key, generation);
        }
    }
}

/// A restore onto `principal`'s session `name` (not `into` a branch),
/// which would change what the fleet keeps of it, is refused while it
/// does: a run or a RESUME claims it first.
pub fn refuse_restore_if_kept(
    fleet: &Fleet,
    principal: Principal,
    name: &str,
    into: &Option<String>,
) -> Result<(), ErrorReply> {
    if let Some(into) = into {
        if fleet.kept.step(&(principal, into.clone())).is_some() {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!("session {into:?} is being brought here from the fleet: retry once it is"),
            ));
        }
    }
    let key = (principal, name.to_owned());
    let publishing = fleet.kept.step(&key) == Some(Step::Publishing);
    let kept = publishing || fleet.kept.publication(&key).is_some();
    if into.is_some() || fleet.link().is_err() || !kept {
        return Ok(());
    }
    Err(ErrorReply::new(
        ErrorCode::BadRequest,
        format!(
            "session {name:?} is hibernated and kept by the fleet: run it or RESUME it (which \
             claims it for this node) before restoring a snapshot onto it"
        ),
    ))
}

/// Session `name` of `principal`'s was closed here: a publication of it
/// this node made is taken back from the fleet.
pub fn closed(fleet: &mut Fleet, principal: Principal, name: &str) {
    let key = (principal, name.to_owned());
    ask_claim(fleet, &key, Step::Forgetting);
}

/// Claims this node's publication of session `key` (taking it back, or
/// learning whose it is), as `step` says why; `false` when nothing was
/// asked.
fn ask_claim(fleet: &mut Fleet, key: &Key, step: fn(i64) -> Step) -> bool {
    let (Ok(link), Ok(Some(owner))) = (fleet.link().cloned(), fleet_owner(key.0)) else {
        return false;
    };
    let Some(generation) = fleet.kept.publication(key) else {
        return false;
    };
    // One whose generation is not known yet is settled by the listing.
    if fleet.kept.step(key).is_some() || generation == PUBLISHING {
        return false;
    }
    let step = step(generation);
    let check = matches!(step, Step::Checking(_));
    match link.session(claim(key, owner, generation, check)) {
        Ok(()) => {
            fleet.kept.set_step(key, step);
            true
        }
        Err(err) => {
            log::warn!("fleet: session {:?}: {}", key.1, err.reason());
            false
        }
    }
}

/// Publishes the sessions hibernated for the fleet, and goes on with the
/// sessions the fleet and the disks have answered for: the work to start
/// now. Work that cannot go on is answered in `replies` (a task's fails).
pub fn on_wake(
    (fleet, exec, tasks): (&mut Fleet, &mut Exec, &mut Tasks),
    news: Vec<SessionNews>,
    replies: &mut Vec<Reply>,
) -> Vec<HeldWork> {
    let mut go = Vec::new();
    publish(fleet, exec);
    for (key, imported) in std::mem::take(&mut exec.disks().imported) {
        let Some(Step::Importing(generation)) = fleet.kept.step(&key) else {
            continue;
        };
        match imported {
            Ok((state, template)) => {
                // Made here, it is claimed before any work wakes it, even
                // after a restart: its record says so.
                let carried = (fleet.kept.carried(&key), template);
                exec.disks()
                    .store
                    .wake_imported(&key, state, carried, generation);
                fleet.kept.published(&key, generation);
                fleet.kept.set_step(&key, Step::Restoring(generation));
            }
            Err(err) => {
                let code = match err {
                    ImportError::Store(StoreError::Full(_))
                    | ImportError::Template(TemplateMoveError::TooLarge { .. }) => {
                        ErrorCode::LimitExceeded
                    }
                    _ => ErrorCode::Unavailable,
                };
                let why = format!(
                    "session {:?} cannot be brought from the fleet: {err}",
                    key.1
                );
                let refusal = ErrorReply::new(code, why);
                refuse_all(fleet.kept.settled(&key), &refusal, tasks, replies);
            }
        }
    }
    for (key, made) in std::mem::take(&mut exec.disks().made_from_fleet) {
        let Some(Step::Restoring(generation)) = fleet.kept.step(&key) else {
            continue;
        };
        let sent = match (made, fleet_owner(key.0)) {
            (Ok(()), Ok(Some(owner))) => (fleet.link())
                .and_then(|link| link.session(claim(&key, owner, generation, false)))
                .map_err(|err| err.into_reply()),
            (Ok(()), _) => Err(ErrorReply::new(
                ErrorCode::Internal,
                "no owner in the fleet",
            )),
            (Err(err), _) => {
                exec.disks().store.forget_import(&key);
                Err(ErrorReply::new(
                    ErrorCode::Unavailable,
                    format!("session {:?} cannot be made here: {err}", key.1),
                ))
            }
        };
        match sent {
            Ok(()) => fleet.kept.set_step(&key, Step::ClaimingImport(generation)),
            Err(refusal) => {
                // Not claimed: the fleet keeps it still, and what was made
                // here goes.
                fleet.kept.unpublished(&key);
                exec.close(key.0, &key.1, replies);
                refuse_all(fleet.kept.settled(&key), &refusal, tasks, replies);
            }
        }
    }
    for news in news {
        go.extend(on_news((fleet, exec, tasks), news, replies));
    }
    go
}

/// Sends the sessions hibernated for the fleet since the last call to
/// it; one that work waits for already is not (it wakes here at once).
fn publish(fleet: &mut Fleet, exec: &mut Exec) {
    for (key, files) in std::mem::take(&mut exec.disks().to_fleet) {
        let (Ok(link), Ok(Some(owner))) = (fleet.link().cloned(), fleet_owner(key.0)) else {
            continue;
        };
        // Its env and labels go with it; its lifetime is this node's. One
        // closed meanwhile is not published.
        let Some(record) = exec.disks().store.stored.record(&key) else {
            continue;
        };
        let mut meta = record.meta.clone();
        meta.ends = None;
        let meta = serde_json::to_vec(&meta).unwrap_or_default();
        // Its template's image goes as one more content.
        let FleetFiles { snapshot, template } = files;
        let mut contents = snapshot.contents;
        let mut carried = None;
        if let Some(image) = template {
            match serde_json::to_vec(&image.carried) {
                Ok(json) => carried = Some(json),
                Err(err) => {
                    log::warn!("fleet: session {:?} stays on this node: {err}", key.1);
                    continue;
                }
            }
            contents.push((image.carried.hash, image.path));
        }
        let publication = Publication {
            owner,
            name: key.1.clone(),
            meta,
            template: carried,
            manifest: snapshot.manifest,
            contents,
            bytes: snapshot.bytes,
        };
        match link.session(SessionJob::Publish(key.clone(), publication)) {
            Ok(()) => {
                // Until its answer is heard, even across a restart, it is
                // woken only once the fleet's listing says whether it is
                // kept.
                fleet.kept.set_step(&key, Step::Publishing);
                fleet.kept.published(&key, PUBLISHING);
                let record = |record: &mut SessionRecord| record.published = Some(PUBLISHING);
                exec.disks().store.change_record(&key, record);
            }
            Err(err) => log::warn!(
                "fleet: session {:?} stays on this node: {}",
                key.1,
                err.reason()
            ),
        }
    }
}

/// Goes on with what the fleet answered.
fn on_news(
    (fleet, exec, tasks): (&mut Fleet, &mut Exec, &mut Tasks),
    news: SessionNews,
    replies: &mut Vec<Reply>,
) -> Vec<HeldWork> {
    match news {
        SessionNews::Listed(Ok(sessions)) => {
            fleet.kept.listed(sessions);
            check_publications(fleet, exec);
        }
        SessionNews::Listed(Err(err)) => {
            log::debug!("fleet: the hibernated sessions cannot be listed: {err}")
        }
        SessionNews::Published(key, published) => {
            return published_news(fleet, exec, key, published)
        }
        SessionNews::Fetched(key, fetched) => match fetched {
            Ok(Some(fetched)) => {
                log::info!(
                    "fleet: session {:?} hibernated on node {:?} wakes here",
                    key.1,
                    fetched.node
                );
                let files = (fetched.manifest, fetched.staging);
                if let Err(refusal) = (exec.disks().store).import(&key, files, fetched.template) {
                    let why = format!(
                        "session {:?} cannot be brought from the fleet: {}",
                        key.1, refusal.error
                    );
                    let refusal = ErrorReply::new(refusal.code, why);
                    refuse_all(fleet.kept.settled(&key), &refusal, tasks, replies);
                    return Vec::new();
                }
                fleet
                    .kept
                    .set_step(&key, Step::Importing(fetched.generation));
                fleet.kept.carry(&key, fetched.meta);
            }
            // No longer kept: its work opens it afresh, as any.
            Ok(None) => {
                if let Ok(Some(owner)) = fleet_owner(key.0) {
                    fleet.kept.remove(&owner, &key.1, None);
                }
                return fleet.kept.settled(&key);
            }
            Err(err) => out_of_reach(fleet, &key, "fetched", &err, tasks, replies),
        },
        SessionNews::Claimed(key, claimed) => {
            return claimed_news((fleet, exec, tasks), key, claimed, replies)
        }
    }
    Vec::new()
}

/// After a listing, this node's publications: one whose session is here
/// no more (closed by its lifetime, say) is taken back; one whose answer
/// was never heard is settled by the listing; one the listing no longer
/// shows was claimed (here, unheard, or by another node) or taken back,
/// and asking whose it is closes a copy that is no longer this node's.
fn check_publications(fleet: &mut Fleet, exec: &mut Exec) {
    let Ok(node) = fleet.link().map(|link| link.node().to_owned()) else {
        return;
    };
    // A hibernated session here that the fleet keeps as this node's, but
    // whose record does not say so (the node stopped before writing it):
    // claimed before it wakes, as any.
    let unknown: Vec<Key> = (exec.disks().store.stored.records().keys())
        .filter(|key| fleet.kept.publication(key).is_none() && fleet.kept.step(key).is_none())
        .cloned()
        .collect();
    for key in unknown {
        let Ok(Some(owner)) = fleet_owner(key.0) else {
            continue;
        };
        let hibernated = exec.disks().store.stored.is_hibernated(&key);
        if let (true, Ok(Some(generation))) = (
            hibernated,
            fleet.kept.generation_here(&owner, &key.1, &node),
        ) {
            set_publication(fleet, exec, &key, generation);
        }
    }
    for key in fleet.kept.published_keys() {
        let (Some(mut generation), None) = (fleet.kept.publication(&key), fleet.kept.step(&key))
        else {
            continue;
        };
        let Ok(Some(owner)) = fleet_owner(key.0) else {
            continue;
        };
        if generation == PUBLISHING {
            match fleet.kept.generation_here(&owner, &key.1, &node) {
                Ok(Some(published)) => {
                    set_publication(fleet, exec, &key, published);
                    generation = published;
                }
                Ok(None) => {
                    unpublish(fleet, exec, &key);
                    continue;
                }
                Err(_) => continue,
            }
        }
        if exec.disks().store.stored.record(&key).is_none() {
            ask_claim(fleet, &key, Step::Forgetting);
            continue;
        }
        let shown = fleet.kept.find(&owner, &key.1).map(|kept| kept.generation);
        if shown != Some(generation) {
            ask_claim(fleet, &key, Step::Checking);
        }
    }
}

fn published_news(
    fleet: &mut Fleet,
    exec: &mut Exec,
    key: Key,
    published: Result<Option<i64>, FleetError>,
) -> Vec<HeldWork> {
    let (Ok(link), Ok(Some(owner))) = (fleet.link().cloned(), fleet_owner(key.0)) else {
        return fleet.kept.settled(&key);
    };
    let generation = match published {
        Ok(Some(generation)) => generation,
        Ok(None) => {
            log::warn!(
                "fleet: session {:?} stays on this node: the fleet keeps another node's \
                 session of that name",
                key.1
            );
            unpublish(fleet, exec, &key);
            return fleet.kept.settled(&key);
        }
        Err(err) => {
            // It may have been published all the same (the answer lost):
            // the fleet's listing settles it before it wakes here.
            log::warn!("fleet: session {:?} may not be published: {err}", key.1);
            return fleet.kept.settled(&key);
        }
    };
    set_publication(fleet, exec, &key, generation);
    fleet.kept.insert(crate::fleet::sessions::Hibernated {
        owner: owner.clone(),
        name: key.1.clone(),
        node: link.node().to_owned(),
        generation,
    });
    let held = fleet.kept.settled(&key);
    if exec.disks().store.stored.record(&key).is_none() {
        // Closed while it was published: taken back.
        ask_claim(fleet, &key, Step::Forgetting);
        return held;
    }
    if held.is_empty() {
        return held;
    }
    // Work came while it was published: it is claimed before it wakes.
    let sent = link.session(claim(&key, owner, generation, false));
    fleet.kept.set_step(&key, Step::Claiming(generation));
    for work in held {
        fleet.kept.hold(&key, work);
    }
    match sent {
        Ok(()) => Vec::new(),
        Err(err) => {
            log::warn!("fleet: session {:?} cannot be claimed: {err}", key.1);
            fleet.kept.settled(&key)
        }
    }
}

fn claimed_news(
    (fleet, exec, tasks): (&mut Fleet, &mut Exec, &mut Tasks),
    key: Key,
    claimed: Result<Claim, FleetError>,
    replies: &mut Vec<Reply>,
) -> Vec<HeldWork> {
    let step = fleet.kept.step(&key);
    let generation = match step {
        Some(
            Step::Claiming(g) | Step::ClaimingImport(g) | Step::Forgetting(g) | Step::Checking(g),
        ) => g,
        _ => return Vec::new(),
    };
    if claimed.as_ref().is_ok_and(|claim| *claim != Claim::Kept) {
        // Claimed, here or elsewhere: the fleet keeps it no more.
        if let Ok(Some(owner)) = fleet_owner(key.0) {
            fleet.kept.remove(&owner, &key.1, Some(generation));
        }
        unpublish(fleet, exec, &key);
    }
    match (claimed, step) {
        (Ok(Claim::Kept), _) => fleet.kept.settled(&key),
        (Ok(Claim::Won), _) | (Ok(Claim::Lost(_)), Some(Step::Forgetting(_))) => {
            fleet.kept.settled(&key)
        }
        (Ok(Claim::Lost(by)), _) => {
            let there = by.as_deref().unwrap_or("another node");
            log::info!(
                "fleet: session {:?} was woken on {there}: this node's copy goes",
                key.1
            );
            exec.close(key.0, &key.1, replies);
            // What waited wakes a newer hibernation the fleet keeps, or is
            // told where it went, as the next work here will be.
            let held = fleet.kept.settled(&key);
            let newer = fleet_owner(key.0).is_ok_and(|owner| {
                owner.is_some_and(|owner| fleet.kept.find(&owner, &key.1).is_some())
            });
            if newer || held.is_empty() {
                fleet.kept.went(&key, by);
                return held;
            }
            refuse_all(held, &went_to(&key, by.clone()), tasks, replies);
            fleet.kept.went(&key, by);
            Vec::new()
        }
        (Err(err), _) => {
            // Perhaps claimed all the same (the answer lost): whatever is
            // here stays, its record saying to claim it again first.
            let done = "claimed (the fleet's database)";
            out_of_reach(fleet, &key, done, &err, tasks, replies);
            Vec::new()
        }
    }
}

/// This node's session `key` is publication `generation` of the fleet's.
fn set_publication(fleet: &mut Fleet, exec: &mut Exec, key: &Key, generation: i64) {
    fleet.kept.published(key, generation);
    let record = |record: &mut SessionRecord| record.published = Some(generation);
    exec.disks().store.change_record(key, record);
}

/// This node's session `key` is published no more.
fn unpublish(fleet: &mut Fleet, exec: &mut Exec, key: &Key) {
    fleet.kept.unpublished(key);
    let record = |record: &mut SessionRecord| record.published = None;
    exec.disks().store.change_record(key, record);
}

/// `not_found`: session `key` was woken on node `by` (if known).
fn went_to(key: &Key, by: Option<String>) -> ErrorReply {
    let there = by.map_or_else(|| "another node".to_owned(), |by| format!("node {by:?}"));
    ErrorReply::new(
        ErrorCode::NotFound,
        format!(
            "session {:?} was woken on {there} of the fleet; it is there now",
            key.1
        ),
    )
}

/// Claims publication `generation` of session `key`; with `check`, only
/// asks whose it is.
fn claim(key: &Key, owner: FleetOwner, generation: i64, check: bool) -> SessionJob {
    SessionJob::Claim {
        key: key.clone(),
        owner,
        name: key.1.clone(),
        generation,
        check,
    }
}

/// The fleet keeps session `key`, which cannot be `done` now (`err`):
/// what waited for it is told so.
fn out_of_reach(
    fleet: &mut Fleet,
    key: &Key,
    done: &str,
    err: &FleetError,
    tasks: &mut Tasks,
    replies: &mut Vec<Reply>,
) {
    let why = format!(
        "session {:?} is kept by the fleet, and cannot be {done} now: {}",
        key.1,
        err.reason()
    );
    let unavailable = ErrorReply::new(ErrorCode::Unavailable, why);
    refuse_all(fleet.kept.settled(key), &unavailable, tasks, replies);
}

/// Answers `work` with `refusal`, as it would have been refused at once:
/// a run in EXEC's reply shape, an `open` and a RESUME as errors, and a
/// task's work fails the task.
pub fn refuse(work: &HeldWork, refusal: ErrorReply, tasks: &mut Tasks, replies: &mut Vec<Reply>) {
    if let ReplyTo::Task(number) = work.reply_to {
        tasks.failed_to_start(number, refusal, replies);
        return;
    }
    let answer = match &work.what {
        Held::Run(request) if request.opens.is_none() => Answer::from(ExecReply::from(refusal)),
        Held::Run(_) | Held::Resume(_) => Answer::from(refusal),
    };
    replies.push((work.reply_to, answer));
}

/// Answers each of `held` with `refusal`.
fn refuse_all(
    held: Vec<HeldWork>,
    refusal: &ErrorReply,
    tasks: &mut Tasks,
    replies: &mut Vec<Reply>,
) {
    for work in &held {
        refuse(work, refusal.clone(), tasks, replies);
    }
}
