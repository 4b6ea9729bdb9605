//! Hibernated sessions that wake on any node of the fleet (docs/fleet.md).
//!
//! In a fleet, an operator's or a delegate's session hibernates with its
//! files and its globals, and this node publishes that snapshot to the
//! fleet's store. A run of it then waits while the fleet settles it:
//!
//! - on this node, its publication is claimed first; if another node
//!   claimed it already, this node's copy is closed and the run is told
//!   where the session went;
//! - on a node that does not have it, it is fetched, brought into the
//!   owner's store (each content checked against its hash, within the
//!   owner's room), claimed, and made here on a new disk, its globals
//!   loaded by its first interpreter.
//!
//! Only one claim of a publication succeeds, so a session wakes on one
//! node. The reactor never waits: each step is a job of the fleet's
//! thread or of the disks' thread, answered with a wake.

use agentos_proto::payload::{ExecReply, ExecRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use crate::address::{Answer, Reply, ReplyTo};
use crate::exec::{Exec, SessionRecord};
use crate::fleet::kept::{Held, HeldWork, Step};
use crate::fleet::owners::fleet_owner;
use crate::fleet::sessions::{Hibernated, Key, Publication, SessionJob, SessionNews};
use crate::fleet::{Fleet, FleetError};
use crate::identity::Principal;

/// Run `request` of `principal`'s, answered at `reply_to`: returned to go
/// on at once, or `None` while it waits for the fleet to settle its
/// session.
pub fn hold_run(
    fleet: &mut Fleet,
    exec: &mut Exec,
    request: ExecRequest,
    principal: Principal,
    reply_to: ReplyTo,
) -> Result<Option<ExecRequest>, ErrorReply> {
    let Some(name) = request.session.clone() else {
        return Ok(Some(request));
    };
    let key = (principal, name);
    if !must_wait(fleet, exec, &key)? {
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

/// Whether RESUME of `principal`'s session `name`, answered at
/// `reply_to`, waits for the fleet to settle it: answered once it has.
pub fn holds_resume(
    fleet: &mut Fleet,
    exec: &mut Exec,
    principal: Principal,
    name: &str,
    reply_to: ReplyTo,
) -> Result<bool, ErrorReply> {
    let key = (principal, name.to_owned());
    if !must_wait(fleet, exec, &key)? {
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
fn must_wait(fleet: &mut Fleet, exec: &mut Exec, key: &Key) -> Result<bool, ErrorReply> {
    if fleet.kept.step(key).is_some() {
        return Ok(true);
    }
    let (Ok(link), Ok(Some(owner))) = (fleet.link().cloned(), fleet_owner(key.0)) else {
        return Ok(false);
    };
    let disks = &exec.disks().store;
    let (job, step) = if disks.stored.record(key).is_some() {
        // This node's own: claimed first if it published it.
        let Some(generation) = fleet.kept.publication(key) else {
            return Ok(false);
        };
        (claim(key, owner, generation), Step::Claiming(generation))
    } else {
        if fleet.kept.find(&owner, &key.1).is_none() {
            return Ok(false);
        }
        let staging = disks.fleet_staging.dir_for(key).ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::Unavailable,
                "sessions have no disks here, so a session the fleet keeps cannot wake here",
            )
        })?;
        let name = key.1.clone();
        let job = SessionJob::Fetch {
            key: key.clone(),
            owner,
            name,
            staging,
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
    let key = (principal, name.to_owned());
    if into.is_some() || fleet.link().is_err() || fleet.kept.publication(&key).is_none() {
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
    forget(fleet, &key);
}

/// Takes back from the fleet this node's publication of session `key`,
/// which is here no more (closed, or ended by its lifetime).
fn forget(fleet: &mut Fleet, key: &Key) {
    let (Ok(link), Ok(Some(owner))) = (fleet.link().cloned(), fleet_owner(key.0)) else {
        return;
    };
    let Some(generation) = fleet.kept.publication(key) else {
        return;
    };
    if fleet.kept.step(key).is_some() {
        return;
    }
    match link.session(claim(key, owner, generation)) {
        Ok(()) => fleet.kept.set_step(key, Step::Forgetting(generation)),
        Err(err) => log::warn!(
            "fleet: session {:?} was closed, but the fleet still keeps it: {}",
            key.1,
            err.reason()
        ),
    }
}

/// Publishes the sessions hibernated for the fleet, and goes on with the
/// sessions the fleet and the disks have answered for: the runs to start
/// now. A run that cannot go on is answered in `replies`.
pub fn on_wake(
    fleet: &mut Fleet,
    exec: &mut Exec,
    news: Vec<SessionNews>,
    replies: &mut Vec<Reply>,
) -> Vec<HeldWork> {
    let mut go = Vec::new();
    let disks = exec.disks();
    // Published sessions closed here by other means (their lifetime).
    for key in fleet.kept.published_keys() {
        if disks.store.stored.record(&key).is_none() {
            forget(fleet, &key);
        }
    }
    for (key, files) in std::mem::take(&mut disks.to_fleet) {
        let Ok(Some(owner)) = fleet_owner(key.0) else {
            continue;
        };
        let Ok(link) = fleet.link() else {
            continue;
        };
        let name = key.1.clone();
        let publication = Publication {
            owner,
            name,
            manifest: files.manifest,
            contents: files.contents,
            bytes: files.bytes,
        };
        match link.session(SessionJob::Publish(key.clone(), publication)) {
            Ok(()) => fleet.kept.set_step(&key, Step::Publishing),
            Err(err) => log::warn!(
                "fleet: session {:?} stays on this node: {}",
                key.1,
                err.reason()
            ),
        }
    }
    for (key, imported) in std::mem::take(&mut disks.imported) {
        let (Some(Step::Importing(generation)), Ok(Some(owner))) =
            (fleet.kept.step(&key), fleet_owner(key.0))
        else {
            continue;
        };
        let sent = match imported {
            Ok(state) => fleet
                .link()
                .and_then(|link| link.session(claim(&key, owner, generation)))
                .map(|()| {
                    fleet
                        .kept
                        .set_step(&key, Step::ClaimingImport(generation, state))
                })
                .map_err(|err| err.into_reply()),
            Err(err) => Err(ErrorReply::new(
                if matches!(err, crate::exec::StoreError::Full(_)) {
                    ErrorCode::LimitExceeded
                } else {
                    ErrorCode::Unavailable
                },
                format!(
                    "session {:?} cannot be brought from the fleet: {err}",
                    key.1
                ),
            )),
        };
        if let Err(refusal) = sent {
            refuse_all(fleet.kept.settled(&key), &refusal, replies);
        }
    }
    for news in news {
        go.extend(on_news(fleet, exec, news, replies));
    }
    go
}

/// Goes on with what the fleet answered.
fn on_news(
    fleet: &mut Fleet,
    exec: &mut Exec,
    news: SessionNews,
    replies: &mut Vec<Reply>,
) -> Vec<HeldWork> {
    match news {
        SessionNews::Listed(Ok(sessions)) => fleet.kept.listed(sessions),
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
                (exec.disks().store).import(&key, fetched.manifest, fetched.staging);
                fleet
                    .kept
                    .set_step(&key, Step::Importing(fetched.generation));
            }
            // No longer kept: its runs open it afresh, as any.
            Ok(None) => return fleet.kept.settled(&key),
            Err(err) => out_of_reach(fleet, &key, "fetched", &err, replies),
        },
        SessionNews::Claimed(key, claimed) => {
            return claimed_news(fleet, exec, key, claimed, replies)
        }
    }
    Vec::new()
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
            return fleet.kept.settled(&key);
        }
        Err(err) => {
            log::warn!("fleet: session {:?} stays on this node: {err}", key.1);
            return fleet.kept.settled(&key);
        }
    };
    let node = link.node().to_owned();
    let name = key.1.clone();
    fleet.kept.published(&key, generation);
    let record = |record: &mut SessionRecord| record.published = Some(generation);
    exec.disks().store.change_record(&key, record);
    fleet.kept.insert(Hibernated {
        owner: owner.clone(),
        name,
        node,
        generation,
    });
    let runs = fleet.kept.settled(&key);
    if runs.is_empty() {
        return runs;
    }
    // Runs came while it was published: it is claimed before they wake it.
    let sent = link.session(claim(&key, owner, generation));
    fleet.kept.set_step(&key, Step::Claiming(generation));
    for run in runs {
        fleet.kept.hold(&key, run);
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
    fleet: &mut Fleet,
    exec: &mut Exec,
    key: Key,
    claimed: Result<bool, FleetError>,
    replies: &mut Vec<Reply>,
) -> Vec<HeldWork> {
    let step = fleet.kept.step(&key);
    if let Ok(Some(owner)) = fleet_owner(key.0) {
        if claimed.is_ok() {
            // Claimed, here or elsewhere: the fleet keeps it no more.
            fleet.kept.remove(&owner, &key.1);
            fleet.kept.unpublished(&key);
            let record = |record: &mut SessionRecord| record.published = None;
            exec.disks().store.change_record(&key, record);
        }
    }
    match (claimed, step) {
        (Ok(true), Some(Step::ClaimingImport(_, state))) => {
            exec.disks().store.wake_imported(&key, state);
            fleet.kept.settled(&key)
        }
        (Ok(true), _) | (Ok(false), Some(Step::Forgetting(_))) => fleet.kept.settled(&key),
        (Ok(false), step) => {
            if matches!(step, Some(Step::ClaimingImport(..))) {
                exec.disks().store.forget_import(&key);
            } else {
                log::info!(
                    "fleet: session {:?} was woken on another node: this node's copy goes",
                    key.1
                );
                exec.close(key.0, &key.1, replies);
            }
            let gone = ErrorReply::new(
                ErrorCode::NotFound,
                format!(
                    "session {:?} was woken on another node of the fleet; it is there now",
                    key.1
                ),
            );
            refuse_all(fleet.kept.settled(&key), &gone, replies);
            Vec::new()
        }
        (Err(err), step) => {
            if matches!(step, Some(Step::ClaimingImport(..))) {
                exec.disks().store.forget_import(&key);
            }
            out_of_reach(fleet, &key, "claimed (the fleet's database)", &err, replies);
            Vec::new()
        }
    }
}

fn claim(key: &Key, owner: crate::fleet::tasks::FleetOwner, generation: i64) -> SessionJob {
    SessionJob::Claim {
        key: key.clone(),
        owner,
        name: key.1.clone(),
        generation,
    }
}

/// Answers `work` with `refusal`: a run in EXEC's reply shape.
pub fn refuse(work: &HeldWork, refusal: ErrorReply, replies: &mut Vec<Reply>) {
    let answer = match work.what {
        Held::Run(_) => Answer::from(ExecReply::from(refusal)),
        Held::Resume(_) => Answer::from(refusal),
    };
    replies.push((work.reply_to, answer));
}

/// The fleet keeps session `key`, which cannot be `done` now (`err`):
/// what waited for it is told so.
fn out_of_reach(
    fleet: &mut Fleet,
    key: &Key,
    done: &str,
    err: &FleetError,
    replies: &mut Vec<Reply>,
) {
    let why = format!(
        "session {:?} is kept by the fleet, and cannot be {done} now: {}",
        key.1,
        err.reason()
    );
    let unavailable = ErrorReply::new(ErrorCode::Unavailable, why);
    refuse_all(fleet.kept.settled(key), &unavailable, replies);
}

/// Answers each of `held` with `refusal`.
fn refuse_all(held: Vec<HeldWork>, refusal: &ErrorReply, replies: &mut Vec<Reply>) {
    for work in &held {
        refuse(work, refusal.clone(), replies);
    }
}
