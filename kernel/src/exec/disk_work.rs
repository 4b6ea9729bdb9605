//! The disks of sessions and templates (`store`), and what waits on them:
//! runs whose children are being given their disks — a session's first,
//! which waits first in its session's queue, or one from a template, which
//! waits here — and template builds, from the moment one is asked for,
//! through its run, to its template being published, when its reply goes.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;

use agentos_proto::payload::{
    ExecReply, ExecRequest, RestoredReply, SessionPauseReply, SessionState, SnapshotReply,
    TemplateInfo, VolumeReply,
};
use agentos_proto::{ErrorCode, ErrorReply};

use super::children::Children;
use super::disks::volumes::{VolumeKey, VolumeUse};
use super::disks::{
    Attached, Brought, DiskError, Done, FleetFiles, SessionDisks, StoreError, TemplateUse,
};
use super::pool::Pool;
use super::queues::Share;
use super::sessions::Sessions;
use super::waiting::{refuse_each, SessionKey, Waiting};
use crate::address::{Answer, Reply, ReplyTo};
use crate::identity::Principal;

/// Children kept warm with each template.
const WARM_PER_TEMPLATE: usize = 1;

/// What the disks' thread's answers come to (see [`DiskWork::done`]).
#[derive(Debug, Default)]
pub struct DisksDone {
    /// Sessions whose children have their disks.
    pub sessions: Vec<SessionKey>,
    /// Runs whose children have theirs, each with its child.
    pub ready: Vec<(usize, Waiting)>,
    /// Children that could not be given theirs.
    pub refused: Vec<usize>,
    /// Children given a template to wait warm with, to settle into it.
    pub warmed: Vec<usize>,
    /// Sessions whose globals are saved: their interpreters end.
    pub hibernated: Vec<SessionKey>,
    /// Sessions whose hibernation the kernel asked for could not be
    /// stored, each with why: their interpreters end all the same.
    pub not_hibernated: Vec<(SessionKey, String)>,
}

/// The disks, and what waits on them.
#[derive(Debug)]
pub struct DiskWork {
    /// Sessions' and templates' disks.
    pub store: SessionDisks,
    waits: DiskWaits,
    /// Ready children already given a template, by template, each with
    /// the template's build time it was given: a run from a template
    /// starts on one as fast as a plain run on any.
    warm: HashMap<String, Vec<(usize, u64)>>,
    /// Children being given a template to wait warm.
    warming: HashMap<usize, (String, u64)>,
    /// Templates runs have started from: each keeps a child warm.
    kept_warm: HashSet<String>,
    /// Volumes being made, each with where its maker's reply goes.
    making: HashMap<VolumeKey, ReplyTo>,
    /// Sessions hibernated for the fleet to keep, each with where its
    /// snapshot lies: for the kernel to publish.
    pub to_fleet: Vec<(SessionKey, FleetFiles)>,
    /// Sessions brought from the fleet into the store, each with whether
    /// it keeps globals, or why it was not.
    pub imported: Vec<(SessionKey, Brought)>,
    /// Sessions brought from the fleet made here on disks of their own,
    /// or why they were not (their records gone).
    pub made_from_fleet: Vec<(SessionKey, Result<(), DiskError>)>,
}

impl DiskWork {
    /// Nothing waiting yet on `store`'s disks.
    pub fn new(store: SessionDisks) -> DiskWork {
        DiskWork {
            store,
            waits: DiskWaits::default(),
            warm: HashMap::new(),
            warming: HashMap::new(),
            kept_warm: HashSet::new(),
            making: HashMap::new(),
            to_fleet: Vec::new(),
            imported: Vec::new(),
            made_from_fleet: Vec::new(),
        }
    }

    /// `waiting` has been given `child`, whose pidfd is `pidfd`: it waits
    /// while the child is given its disks — first in its session's queue
    /// (among `sessions`), or here. The child, if it has gone (a session
    /// with it): `waiting` is answered so.
    pub fn give(
        &mut self,
        child: usize,
        pidfd: Option<OwnedFd>,
        mut waiting: Waiting,
        sessions: &mut Sessions,
        replies: &mut Vec<Reply>,
    ) -> Option<usize> {
        let Some(pidfd) = pidfd else {
            let gone = ErrorReply::new(ErrorCode::Unavailable, "the run's sandbox ended");
            self.refuse(waiting, &gone, replies);
            return Some(child);
        };
        let session = waiting.session.clone().filter(|_| waiting.on_disk);
        if waiting.template.is_none() {
            // A stored session goes on from the template it was opened from.
            let of_session = session
                .as_ref()
                .and_then(|key| self.store.stored.opened(key));
            waiting.template = of_session.flatten().map(TemplateUse::Use);
        }
        let template = waiting.template.as_ref();
        let of_session = session.as_ref().map(|key| {
            // The record keeps what the session was opened with.
            let meta = sessions.meta(key).cloned().unwrap_or_default();
            (key, waiting.share, meta)
        });
        self.store
            .attach(child, pidfd, of_session, template, &waiting.volumes);
        if let Some(TemplateUse::Build(name)) = &waiting.template {
            self.waits.build_runs(name, child);
        }
        match session {
            Some(key) => {
                waiting.given_disk = true;
                sessions.queue_front(&key, waiting);
            }
            None => self.waits.attaching(child, waiting),
        }
        None
    }

    /// What the disks' thread has answered since the last call: sessions
    /// (among `sessions`) whose children have their disks, to be served;
    /// other runs whose children have theirs, to start; and children that
    /// could not be given them (what waited for them answered why), to go.
    /// A template published answers its build.
    pub fn done(&mut self, sessions: &mut Sessions, replies: &mut Vec<Reply>) -> DisksDone {
        let mut done = DisksDone::default();
        for answer in self.store.done() {
            match answer {
                Done::Attached { child, result } => {
                    self.attached(child, result, sessions, &mut done, replies)
                }
                Done::Published { name, result } => {
                    let record = result.as_ref().ok().cloned();
                    self.store.templates.build_ended(&name, record);
                    let info = self.store.templates.info(&name);
                    replies.extend(self.waits.published(&name, result.map(|_| info)));
                }
                Done::VolumeMade { key, result } => {
                    let info = self.store.volumes.made(&key, result.is_ok());
                    let reply_to = self.making.remove(&key);
                    let answer = match (result, info) {
                        (Ok(()), Some(volume)) => Answer::json(&VolumeReply {
                            success: true,
                            volume,
                        }),
                        (Err(err), _) => {
                            let why = format!("volume {:?} cannot be made: {err}", key.1);
                            ErrorReply::new(ErrorCode::Internal, why).into()
                        }
                        (Ok(()), None) => continue,
                    };
                    replies.extend(reply_to.map(|to| (to, answer)));
                }
                Done::VolumesMounted(keys) => {
                    for key in keys {
                        self.store.volumes.mounted(key);
                    }
                }
                Done::Imported {
                    key,
                    result,
                    template,
                } => {
                    let templates = &mut self.store.templates;
                    let name = template.map(|(name, arrived)| templates.arrived(name, arrived));
                    let state = result.map(|manifest| (manifest.state.is_some(), name));
                    self.imported.push((key, state));
                }
                Done::Snapshotted {
                    asked,
                    result,
                    files,
                } => {
                    // The session's next order may start.
                    sessions.release(&asked.key);
                    done.sessions.push(asked.key.clone());
                    let answer = match result {
                        Ok((manifest, _)) if asked.hibernate => {
                            self.store.hibernated(&asked.key, &manifest.name);
                            // One that work waits for wakes again at once:
                            // it stays this node's.
                            if !sessions.has_queued(&asked.key) {
                                self.to_fleet.extend(files.map(|f| (asked.key.clone(), f)));
                            }
                            done.hibernated.push(asked.key.clone());
                            Answer::json(&SessionPauseReply {
                                success: true,
                                session: asked.key.1.clone(),
                                state: SessionState::Hibernated,
                                not_saved: asked.not_saved,
                            })
                        }
                        Ok((manifest, left_out)) => {
                            let snapshot = manifest.info();
                            // Not listed if its session was closed meanwhile
                            // (and its snapshots removed after it).
                            if self.store.stored.record(&asked.key).is_some() {
                                self.store.snapshots.insert(&asked.key, snapshot.clone());
                            }
                            Answer::json(&SnapshotReply {
                                success: true,
                                snapshot,
                                left_out,
                                not_saved: asked.not_saved,
                            })
                        }
                        Err(err) => {
                            if asked.hibernate && asked.reply_to == ReplyTo::Nobody {
                                let why = err.to_string();
                                done.not_hibernated.push((asked.key.clone(), why));
                            }
                            let full = matches!(err, StoreError::Full(_));
                            store_refusal(
                                full,
                                &err,
                                "the snapshot was not taken (the earlier ones are intact)",
                            )
                            .into()
                        }
                    };
                    replies.push((asked.reply_to, answer));
                }
                Done::Restored {
                    asked,
                    into,
                    new,
                    result,
                } => {
                    let key = (asked.key.0, into);
                    let answer = match result {
                        Ok(record) => {
                            self.store.stored.restored_onto(&key, Some(record));
                            if asked.fleet {
                                self.made_from_fleet.push((key.clone(), Ok(())));
                            }
                            Answer::json(&RestoredReply {
                                success: true,
                                session: key.1,
                                left_out: Vec::new(),
                            })
                        }
                        Err(err) => {
                            if new {
                                self.store.stored.remove(&key);
                            } else {
                                self.store.stored.restored_onto(&key, None);
                            }
                            let nothing = if new {
                                "no session was made"
                            } else {
                                "the session's files are as they were"
                            };
                            let full = matches!(err, DiskError::Restore(StoreError::Full(_)));
                            let refusal = store_refusal(full, &err, nothing).into();
                            if asked.fleet {
                                self.made_from_fleet.push((key, Err(err)));
                            }
                            refusal
                        }
                    };
                    replies.push((asked.reply_to, answer));
                }
            }
        }
        done
    }

    fn attached(
        &mut self,
        child: usize,
        result: Result<Attached, DiskError>,
        sessions: &mut Sessions,
        done: &mut DisksDone,
        replies: &mut Vec<Reply>,
    ) {
        if let Some((name, built)) = self.warming.remove(&child) {
            match result {
                Ok(_) => {
                    self.warm.entry(name).or_default().push((child, built));
                    done.warmed.push(child);
                }
                Err(_) => done.refused.push(child),
            }
            return;
        }
        if let Some(waiting) = self.waits.take_attaching(child) {
            match result {
                Ok(_) => done.ready.push((child, waiting)),
                Err(why) => {
                    let why = format!("the run's disks cannot be given to it: {why}");
                    self.refuse(
                        waiting,
                        &ErrorReply::new(ErrorCode::Unavailable, why),
                        replies,
                    );
                    done.refused.push(child);
                }
            }
            return;
        }
        let Some(key) = sessions.of_child(child) else {
            // Its run or session went meanwhile.
            done.refused.push(child);
            return;
        };
        // What was to be restored onto its disk is done with, whether it
        // could be or not.
        self.store.stored.restored_onto(&key, None);
        match result {
            Ok(attached) => {
                let record = attached
                    .existed
                    .then(|| self.store.stored.record(&key))
                    .flatten();
                sessions.disk_given(&key, record, attached.state);
                done.sessions.push(key);
            }
            Err(why) => {
                let why = format!("session {:?} cannot be opened: {why}", key.1);
                let refusal = ErrorReply::new(ErrorCode::Unavailable, why);
                if let Some(session) = sessions.end(&key) {
                    refuse_each(session.queue, &refusal, replies);
                }
                done.refused.push(child);
            }
        }
    }

    /// A ready child already given `waiting`'s template (a run outside a
    /// session), if one waits warm: the run needs no other disk. Children
    /// warm with an earlier build of the template are let go.
    pub fn take_warm(&mut self, waiting: &Waiting, children: &Children) -> Option<usize> {
        let plain = !waiting.on_disk && waiting.volumes.is_empty();
        let Some(TemplateUse::Use(name)) = waiting.template.as_ref().filter(|_| plain) else {
            return None;
        };
        let built = self.store.templates.built_at(name)?;
        let warm = self.warm.get_mut(name)?;
        while let Some((child, at)) = warm.pop() {
            if at == built && children.is_ready(child) {
                return Some(child);
            }
            children.kill_quietly(child);
        }
        None
    }

    /// Lets every child warm with a template go (the `tools` package has
    /// changed since they were prepared): later runs warm others.
    pub fn let_warm_go(&mut self, children: &Children) {
        let warm = self.warm.drain().flat_map(|(_, warm)| warm);
        let warming = self.warming.drain().map(|(child, _)| (child, 0));
        for (child, _) in warm.chain(warming) {
            children.kill_quietly(child);
        }
    }

    /// A run from a template (outside a session) has taken a child: the
    /// template is kept warm from now on (see [`DiskWork::top_up`]).
    pub fn warm_for(&mut self, waiting: &Waiting, pool: &mut Pool) {
        let Some(TemplateUse::Use(key)) = waiting.template.as_ref().filter(|_| !waiting.on_disk)
        else {
            return;
        };
        self.kept_warm.insert(key.clone());
        self.top_up(pool);
    }

    /// Gives each template kept warm a child, from `pool`'s ready ones, to
    /// wait for its next run — unless one waits already, or it would take
    /// the last ready child. Called as children become ready, so a run
    /// from a template finds one warm even right after another.
    pub fn top_up(&mut self, pool: &mut Pool) {
        let keys: Vec<String> = self.kept_warm.iter().cloned().collect();
        for key in keys {
            let waiting_warm = self.warm.get(&key).map_or(0, Vec::len)
                + self.warming.values().filter(|(k, _)| *k == key).count();
            if waiting_warm >= WARM_PER_TEMPLATE || pool.ready_count() < 2 {
                continue;
            }
            let Some(built) = self.store.templates.built_at(&key) else {
                self.kept_warm.remove(&key);
                continue;
            };
            let Some(child) = pool.take_ready(false) else {
                return;
            };
            let Some(pidfd) = pool.children().pidfd(child) else {
                pool.children().kill_quietly(child);
                return;
            };
            let template = TemplateUse::Use(key.clone());
            self.store.attach(child, pidfd, None, Some(&template), &[]);
            self.warming.insert(child, (key, built));
        }
    }

    /// Begins making `owner`'s volume `name`; the reply goes to `reply_to`
    /// once it is made.
    pub fn create_volume(
        &mut self,
        owner: (Principal, Share),
        name: &str,
        bytes: Option<u64>,
        reply_to: ReplyTo,
    ) -> Result<(), ErrorReply> {
        let key = self.store.create_volume(owner, name, bytes)?;
        self.making.insert(key, reply_to);
        Ok(())
    }

    /// The volumes a run `asked` for — the request, whose it is — as its
    /// caller may give them; given to run `run`, which may pass them on.
    pub fn volumes_for(
        &mut self,
        asked: (&ExecRequest, Principal),
        run: u64,
    ) -> Result<Vec<VolumeUse>, ErrorReply> {
        let (request, caller) = asked;
        if request.volumes.is_empty() {
            return Ok(Vec::new());
        }
        self.store.require("volumes")?;
        let in_workspace = |path: &str| path.starts_with("/workspace/");
        if request.session.is_none() && request.volumes.iter().any(|v| in_workspace(&v.path)) {
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                "EXEC field `volumes`: a run outside a session has a /workspace of its own in \
                 memory, where no volume goes; mount it at /data, or beneath /data or /mnt \
                 (or beneath /workspace in a session)",
            ));
        }
        let volumes = self
            .store
            .volumes
            .resolve(caller, "EXEC", &request.volumes)?;
        self.store
            .volumes
            .give(Principal::Run { number: run }, &volumes);
        Ok(volumes)
    }

    /// Answers a run waiting for its disks, which will not start.
    fn refuse(&mut self, waiting: Waiting, refusal: &ErrorReply, replies: &mut Vec<Reply>) {
        self.not_started(&waiting);
        replies.push((waiting.reply_to, refusal.clone().into()));
    }

    /// Takes the runs waiting for disks that `pick` picks (their children,
    /// once given disks, find no run and go).
    pub fn take_attaching_where(&mut self, pick: impl FnMut(&Waiting) -> bool) -> Vec<Waiting> {
        self.waits.take_attaching_where(pick)
    }

    /// Template `build.name` is to be built by the run whose reply goes
    /// to `build.reply_to`: reserved until its build ends.
    pub fn begin_build(&mut self, build: Build) -> Result<(), ErrorReply> {
        self.store.begin_build(&build.name)?;
        self.waits.build_asked(build);
        Ok(())
    }

    /// The build asked of the run whose reply goes to `reply_to` will not
    /// run (the run was refused).
    pub fn build_refused(&mut self, reply_to: ReplyTo) {
        if let Some(build) = self.waits.take_asked_by(reply_to) {
            self.store
                .build_ran(&build.name, false, build.uid, Vec::new());
        }
    }

    /// The template a run `asked` for — the request, whose it is, where
    /// its reply goes — is given: the one it builds, if a build asked for
    /// it; the one it names (`not_found` if none is built; `bad_request` if
    /// its session was opened from another); the one its session was
    /// opened from; or none.
    pub fn template_for(
        &self,
        asked: (&ExecRequest, Principal, ReplyTo),
    ) -> Result<Option<TemplateUse>, ErrorReply> {
        let (request, owner, reply_to) = asked;
        if let Some(build) = self.waits.asked_by(reply_to) {
            return Ok(Some(TemplateUse::Build(build.name.clone())));
        }
        let session = request.session.clone().map(|session| (owner, session));
        let opened_from = session.as_ref().and_then(|s| self.store.stored.opened(s));
        let Some(name) = &request.template else {
            // A session keeps what it was opened from, named or not.
            return Ok(opened_from.flatten().map(TemplateUse::Use));
        };
        let key = self.store.find_template(owner, name)?;
        if let Some(opened_from) = opened_from.filter(|from| from.as_deref() != Some(&key)) {
            let shown = |key: String| self.store.templates.info(&key).map_or(key, |t| t.template);
            let from = opened_from.map_or("no template".to_owned(), |t| {
                format!("template {:?}", shown(t))
            });
            return Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!(
                    "EXEC field `template`: session {:?} was opened from {from}; its runs \
                     keep it (close the session to open one from another)",
                    request.session.as_deref().unwrap_or_default()
                ),
            ));
        }
        Ok(Some(TemplateUse::Use(key)))
    }

    /// The run on `child` has ended with `reply`, which goes to
    /// `reply_to`: if it was a template's build that succeeded, the reply
    /// waits for the template to be published (`None`); one that failed
    /// says no template was made.
    pub fn build_ran(
        &mut self,
        child: usize,
        reply_to: ReplyTo,
        mut reply: ExecReply,
    ) -> Option<ExecReply> {
        let Some(build) = self.waits.take_build(child) else {
            return Some(reply);
        };
        let succeeded = reply.exit_code == Some(0) && !reply.timed_out;
        self.store
            .build_ran(&build.name, succeeded, build.uid, build.packages);
        if succeeded {
            self.waits.publishing(build.name, reply_to, reply);
            return None;
        }
        reply.success = false;
        let why = reply
            .error
            .take()
            .unwrap_or_else(|| "pip failed (its output says why)".into());
        reply.error = Some(format!("template {:?} was not built: {why}", build.name));
        Some(reply)
    }

    /// `child` has gone: a build it ran, if any, made no template.
    pub fn child_dropped(&mut self, child: usize) {
        if let Some(build) = self.waits.take_build(child) {
            self.store
                .build_ran(&build.name, false, build.uid, Vec::new());
        }
    }

    /// A waiting run that will not start: the template it was to build,
    /// if any, is not built.
    pub fn not_started(&mut self, waiting: &Waiting) {
        if let Some(TemplateUse::Build(name)) = &waiting.template {
            if let Some(build) = self.waits.build_dropped(name) {
                self.store.build_ran(name, false, build.uid, Vec::new());
            }
        }
    }
}

/// A template build asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Build {
    /// The template.
    pub name: String,
    /// Where its run's reply goes: the run that builds it.
    pub reply_to: ReplyTo,
    /// The operator who asked for it.
    pub uid: u32,
    /// What it is built from, for its record.
    pub packages: Vec<String>,
}

/// Runs waiting for their disks, and builds.
#[derive(Debug, Default)]
struct DiskWaits {
    /// Runs outside sessions whose children are being given disks, by
    /// child.
    attaching: HashMap<usize, Waiting>,
    /// Builds asked for, by template, until their run has a child.
    asked: HashMap<String, Build>,
    /// Builds running, by child.
    running: HashMap<usize, Build>,
    /// Builds that succeeded, by template, with the reply that goes once
    /// the template is published.
    publishing: HashMap<String, (ReplyTo, ExecReply)>,
}

impl DiskWaits {
    /// `waiting`'s child is being given its disks.
    pub fn attaching(&mut self, child: usize, waiting: Waiting) {
        self.attaching.insert(child, waiting);
    }

    /// The run whose child was being given its disks, if it still waits.
    pub fn take_attaching(&mut self, child: usize) -> Option<Waiting> {
        self.attaching.remove(&child)
    }

    /// Takes the runs waiting for disks that `pick` picks (their children,
    /// once given disks, find no run and go).
    pub fn take_attaching_where(&mut self, mut pick: impl FnMut(&Waiting) -> bool) -> Vec<Waiting> {
        let children: Vec<usize> = self
            .attaching
            .iter()
            .filter(|(_, waiting)| pick(waiting))
            .map(|(child, _)| *child)
            .collect();
        children
            .into_iter()
            .filter_map(|child| self.attaching.remove(&child))
            .collect()
    }

    /// A build has been asked for.
    pub fn build_asked(&mut self, build: Build) {
        self.asked.insert(build.name.clone(), build);
    }

    /// The build asked of the run whose reply goes to `reply_to`.
    pub fn asked_by(&self, reply_to: ReplyTo) -> Option<&Build> {
        self.asked.values().find(|build| build.reply_to == reply_to)
    }

    /// The build asked of the run whose reply goes to `reply_to`, taken.
    pub fn take_asked_by(&mut self, reply_to: ReplyTo) -> Option<Build> {
        let name = self.asked_by(reply_to)?.name.clone();
        self.asked.remove(&name)
    }

    /// Template `name`'s build runs on `child`.
    pub fn build_runs(&mut self, name: &str, child: usize) {
        if let Some(build) = self.asked.remove(name) {
            self.running.insert(child, build);
        }
    }

    /// The build `child` ran, if it ran one.
    pub fn take_build(&mut self, child: usize) -> Option<Build> {
        self.running.remove(&child)
    }

    /// A build asked for that never ran (refused, cancelled, its asker
    /// gone).
    pub fn build_dropped(&mut self, name: &str) -> Option<Build> {
        self.asked.remove(name)
    }

    /// Template `name`'s build succeeded: `reply` goes to `reply_to` once
    /// the template is published.
    pub fn publishing(&mut self, name: String, reply_to: ReplyTo, reply: ExecReply) {
        self.publishing.insert(name, (reply_to, reply));
    }

    /// Template `name` is published (with what it lists as), or could not
    /// be: its build's reply.
    pub fn published(
        &mut self,
        name: &str,
        result: Result<Option<TemplateInfo>, DiskError>,
    ) -> Option<Reply> {
        let (reply_to, mut reply) = self.publishing.remove(name)?;
        match result {
            Ok(info) => reply.template = info,
            Err(err) => {
                reply.success = false;
                reply.code = Some(ErrorCode::Internal);
                reply.error = Some(format!("template {name:?} was built, but {err}"));
            }
        }
        Some((reply_to, reply.into()))
    }
}

/// The refusal of a snapshot or restore the store could not do, `full` or
/// not (`nothing`: what was left as it was).
fn store_refusal(full: bool, err: &impl std::fmt::Display, nothing: &str) -> ErrorReply {
    let code = if full {
        ErrorCode::LimitExceeded
    } else {
        ErrorCode::Internal
    };
    ErrorReply::new(code, format!("{err}; {nothing}"))
}
