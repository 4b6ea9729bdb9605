//! The run children the kernel holds, by key: those preparing, those
//! ready for code, those running an order, and sessions' between runs.
//! Each child's descriptors are watched as EXEC's [`Sources`] while it is
//! held, and forgotten with it. Nothing here decides what a child does
//! next; it says what a child's socket brought ([`Heard`]) and leaves the
//! rest to the dispatcher.

use std::collections::HashSet;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Instant;

use agentos_proto::payload::SessionUsage;
use agentos_proto::{ErrorCode, ErrorReply};
use mio::Interest;
use slab::Slab;

use super::child::{RunChild, RunEndpoint, Stage};
use super::connections;
use super::order::{Finished, Kill, Running};
use super::output::Stream;
use super::queues::Share;
use super::run_cgroup::RunCgroup;
use super::sources::{ExecSource, Sources};
use super::wire::Ready;
use crate::address::ReplyTo;
use crate::cgroup::Freezer;
use crate::fd;
use crate::identity::Principal;
use crate::telemetry::tracer::OpenSpan;

/// How often a frozen run whose time is up is looked at again: it is
/// killed within this of being thawed.
const FROZEN_RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// What a child's socket brought.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Nothing to act on.
    Nothing,
    /// Its pidfd: it is ready to be prepared for a run.
    Pidfd,
    /// It cannot be used (it sent no pidfd): it goes.
    Unusable,
    /// It has gone (closed while it waited, or failed to renew).
    Gone,
    /// Its run moved on: it may have finished.
    Progress,
    /// A session's child handed over its next run's pipes.
    Renewed,
}

/// What a finished order leaves.
#[derive(Debug)]
pub struct Done {
    /// The share of EXEC the order held, if it held one.
    pub holds: Option<Share>,
    /// The order's reply.
    pub finished: Finished,
    /// The child lives on (a session's).
    pub alive: bool,
    /// The order's span, with tracing on.
    pub span: Option<OpenSpan>,
}

/// Every run child held, by key.
#[derive(Debug, Default)]
pub struct Children {
    slab: Slab<RunChild>,
}

impl Children {
    /// A child, to change, if it is still held.
    pub fn get_mut(&mut self, child: usize) -> Option<&mut RunChild> {
        self.slab.get_mut(child)
    }

    /// Takes in a child `host` handed over, in `cgroup` if it has one, and
    /// watches its socket and pipes; then whether it is ready already (its
    /// pidfd came with it). The key is the child's even if it cannot be
    /// watched: it is to be dropped then.
    pub fn take_in(
        &mut self,
        host: usize,
        ready: Ready,
        cgroup: Option<RunCgroup>,
        sources: &mut Sources,
    ) -> (usize, io::Result<bool>) {
        let child = self.slab.insert(RunChild::new(host, ready, cgroup));
        let socket = self.slab[child].socket.as_raw_fd();
        let watched = sources
            .register(socket, ExecSource::Socket(child), Interest::READABLE)
            .and_then(|token| {
                self.slab[child].socket_token = Some(token);
                self.watch_outputs(child, sources)
            });
        let ready = watched.map(|()| self.slab[child].receive_pidfd().unwrap_or(false));
        (child, ready)
    }

    /// Takes in what a child's socket brought.
    pub fn on_socket(&mut self, child: usize, sources: &Sources) -> Heard {
        let Some(run) = self.slab.get_mut(child) else {
            return Heard::Nothing;
        };
        match run.stage {
            Stage::Preparing => match run.receive_pidfd() {
                Ok(true) => Heard::Pidfd,
                Ok(false) => Heard::Nothing,
                Err(_) => Heard::Unusable,
            },
            // A waiting child says nothing: this is its close (its host
            // ended).
            Stage::Ready if run.has_hung_up() => Heard::Gone,
            Stage::Ready => Heard::Nothing,
            Stage::Running(_) => {
                let unsent = run.flush().unwrap_or_else(|err| {
                    log::debug!("exec run: cannot send the order: {err}");
                    run.kill(Kill::Unsent);
                    false
                });
                run.read_socket();
                if run.overflowed() {
                    run.kill_quietly();
                }
                self.watch_writable(child, unsent, sources);
                Heard::Progress
            }
            Stage::Renewing => match run.receive_pipes() {
                Ok(true) => Heard::Renewed,
                Ok(false) => Heard::Nothing,
                Err(_) => {
                    run.kill_quietly();
                    Heard::Gone
                }
            },
            Stage::Ended => Heard::Nothing,
        }
    }

    /// Drains one of a child's pipes, and stops watching it once it has
    /// closed. Whether the child is still held.
    pub fn read_output(&mut self, child: usize, stream: Stream, sources: &mut Sources) -> bool {
        let Some(run) = self.slab.get_mut(child) else {
            return false;
        };
        if run.read_stream(stream) {
            self.forget_output(child, stream, sources);
        }
        true
    }

    /// Gives a ready child its first run's kernel connection, with a
    /// shell started if `shell`.
    pub fn prepare(&mut self, child: usize, shell: bool) -> io::Result<()> {
        let run = self.slab.get_mut(child).ok_or(io::ErrorKind::NotFound)?;
        let (ours, theirs) = connections::pair()?;
        run.prepare(ours, theirs, shell)
    }

    /// Has a child that waits warm with a template settle into it (see
    /// `RunChild::settle_template`); one that cannot is killed.
    pub fn settle_template(&mut self, child: usize) {
        if let Some(run) = self.slab.get_mut(child) {
            if let Err(err) = run.settle_template() {
                log::debug!("exec: a warm child cannot take its template: {err}");
                run.kill_quietly();
            }
        }
    }

    /// Watches a child's (new) stdout and stderr pipes.
    pub fn watch_outputs(&mut self, child: usize, sources: &mut Sources) -> io::Result<()> {
        let Some(run) = self.slab.get_mut(child) else {
            return Ok(());
        };
        for stream in Stream::BOTH {
            let Some(pipe) = run.pipe(stream) else {
                continue;
            };
            fd::set_nonblocking(pipe)?;
            let fd = pipe.as_raw_fd();
            let token =
                sources.register(fd, ExecSource::Output(child, stream), Interest::READABLE)?;
            run.output_tokens[stream.index()] = Some(token);
        }
        Ok(())
    }

    /// Watches a child's socket for writability while an order is unsent,
    /// and only then (a waiting child's socket is otherwise writable all
    /// along).
    pub fn watch_writable(&mut self, child: usize, writable: bool, sources: &Sources) {
        let Some(run) = self.slab.get_mut(child) else {
            return;
        };
        let Some(token) = run.socket_token.filter(|_| run.writable != writable) else {
            return;
        };
        let interest = if writable {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        };
        match sources.reregister(run.socket.as_raw_fd(), token, interest) {
            Ok(()) => run.writable = writable,
            Err(err) => log::warn!("exec run: cannot watch its socket: {err}"),
        }
    }

    /// Stops watching one of a child's pipes (closed already, or not).
    fn forget_output(&mut self, child: usize, stream: Stream, sources: &mut Sources) {
        let Some(run) = self.slab.get_mut(child) else {
            return;
        };
        let token = run.output_tokens[stream.index()].take();
        let pipe = match stream {
            Stream::Stdout => run.stdout.take(),
            Stream::Stderr => run.stderr.take(),
        };
        if let Some(token) = token {
            sources.release(token);
        }
        if let Some(pipe) = pipe {
            sources.deregister(pipe.as_raw_fd());
        }
    }

    /// Lets a child go: its descriptors are no longer watched. What it
    /// held (a share, its host's count, its cgroups) is the caller's to
    /// give back.
    pub fn remove(&mut self, child: usize, sources: &mut Sources) -> Option<RunChild> {
        if !self.slab.contains(child) {
            return None;
        }
        for stream in Stream::BOTH {
            self.forget_output(child, stream, sources);
        }
        let run = self.slab.remove(child);
        if let Some(token) = run.socket_token {
            sources.forget(run.socket.as_raw_fd(), token);
        }
        Some(run)
    }

    /// The reply of a child's order, if it has finished (it said how it
    /// ended and its pipes are drained), and whether the child lives on.
    pub fn finish(&mut self, child: usize, now: Instant) -> Option<Done> {
        let run = self.slab.get_mut(child).filter(|c| c.is_finished())?;
        let holds = run.holds();
        let finished = run.finish(now)?;
        Some(Done {
            holds,
            finished,
            alive: run.is_kept(),
            span: run.span.take(),
        })
    }

    /// What the run whose reply goes to `reply_to` has printed so far
    /// (within `max` bytes), while it runs.
    pub fn output_so_far(&self, reply_to: ReplyTo, max: usize) -> Option<String> {
        self.running()
            .find(|running| running.reply_to == reply_to)
            .map(|running| running.output_so_far(max))
    }

    /// Counts a TOOL call answered with `bytes` for run `number`.
    pub fn tool_delivered(&mut self, number: u64, bytes: usize) {
        let running = self
            .slab
            .iter_mut()
            .find_map(|(_, child)| match &mut child.stage {
                Stage::Running(running) if running.of.run == Some(number) => Some(running),
                _ => None,
            });
        if let Some(running) = running {
            running.tool_calls += 1;
            running.tool_bytes += bytes as u64;
        }
    }

    /// The orders going.
    fn running(&self) -> impl Iterator<Item = &Running> {
        self.slab
            .iter()
            .filter_map(|(_, child)| match &child.stage {
                Stage::Running(running) => Some(&**running),
                _ => None,
            })
    }

    /// How many orders are going.
    pub fn running_count(&self) -> usize {
        self.running().count()
    }

    /// The runs that have a run of their own going (each may lend its place
    /// to one at a time).
    pub fn lending_runs(&self) -> HashSet<u64> {
        self.running()
            .filter_map(|running| match running.of.owner {
                Principal::Run { number } => Some(number),
                _ => None,
            })
            .collect()
    }

    /// Kills the orders `pick` picks, for `why`; whether there were any.
    pub fn kill_running(&mut self, pick: impl Fn(&Running) -> bool, why: Kill) -> bool {
        let mut found = false;
        for (_, run) in self.slab.iter_mut() {
            if matches!(&run.stage, Stage::Running(r) if pick(r)) {
                run.kill(why);
                found = true;
            }
        }
        found
    }

    /// Kills a child's run at its timeout, if it is still the run that
    /// started at `started` and its time is up: frozen time does not count.
    /// When to look again, if its time may yet run out.
    pub fn timed_out(&mut self, child: usize, started: Instant, now: Instant) -> Option<Instant> {
        let run = self.slab.get_mut(child)?;
        let (timeout, due) = match &run.stage {
            Stage::Running(r) if r.started == started => (r.timeout, r.deadline()),
            _ => return None,
        };
        if let Some(since) = run.frozen_since {
            // Not before it has been thawed and run what it had left; and,
            // frozen with nothing left, not at once again (that would wake
            // the reactor without end): it is killed once it is thawed.
            let left = due.saturating_duration_since(since);
            return Some(now + left.max(FROZEN_RECHECK));
        }
        if now < due {
            return Some(due);
        }
        run.kill(Kill::Timeout(timeout));
        None
    }

    /// Freezes a child's processes (`frozen`), or thaws them (see
    /// [`RunChild::freeze`]); `unavailable` saying why it cannot be.
    pub fn freeze(
        &mut self,
        child: usize,
        frozen: bool,
        now: Instant,
    ) -> Result<Freezer, ErrorReply> {
        let run = self.slab.get_mut(child).ok_or_else(|| {
            ErrorReply::new(ErrorCode::NotFound, "the session's interpreter has ended")
        })?;
        run.freeze(frozen, now).map_err(|err| {
            let verb = if frozen { "paused" } else { "resumed" };
            ErrorReply::new(
                ErrorCode::Unavailable,
                format!("the session cannot be {verb}: {err}"),
            )
        })
    }

    /// Kills a child without a reason of the kernel's.
    pub fn kill_quietly(&self, child: usize) {
        if let Some(run) = self.slab.get(child) {
            run.kill_quietly();
        }
    }

    /// Ends a child that was given an order it never started.
    pub fn end_unused(&mut self, child: usize) {
        if let Some(run) = self.slab.get_mut(child) {
            run.kill_quietly();
            run.stage = Stage::Ended;
        }
    }

    /// Kills a closed session's child; whether it can go at once (no run
    /// of it is going, whose reply must go out first).
    pub fn close(&mut self, child: usize) -> bool {
        let Some(run) = self.slab.get_mut(child) else {
            return false;
        };
        run.kill(Kill::Closed);
        !matches!(run.stage, Stage::Running(_))
    }

    /// Whether a child can take another order.
    pub fn is_alive(&self, child: usize) -> bool {
        self.slab.get(child).is_some_and(RunChild::is_alive)
    }

    /// Whether a child is ready and waiting for its first order.
    pub fn is_ready(&self, child: usize) -> bool {
        self.slab
            .get(child)
            .is_some_and(|c| matches!(c.stage, Stage::Ready))
    }

    /// Whether a child has a shell started.
    pub fn has_shell(&self, child: usize) -> bool {
        self.slab.get(child).is_some_and(|c| c.shell)
    }

    /// Whether the memory controller killed one of a child's processes
    /// since its last run ended.
    pub fn was_oom_killed(&self, child: usize) -> bool {
        self.slab.get(child).is_some_and(RunChild::was_oom_killed)
    }

    /// A copy of a child's pidfd, if it has sent it.
    pub fn pidfd(&self, child: usize) -> Option<std::os::fd::OwnedFd> {
        let pidfd = self.slab.get(child)?.pidfd.as_ref()?;
        pidfd.try_clone().ok()
    }

    /// Bytes of files in a session child's `/workspace`, as it last said.
    pub fn workspace_bytes(&self, child: usize) -> u64 {
        self.slab
            .get(child)
            .and_then(|c| c.workspace_bytes)
            .unwrap_or(0)
    }

    /// What the sandbox of `child`, a session's, uses now.
    pub fn session_usage(&self, child: usize) -> Option<SessionUsage> {
        self.slab.get(child)?.session_usage()
    }

    /// A session keeps `child` from now: its CPU time counts from here.
    pub fn count_session_usage(&mut self, child: usize) {
        if let Some(run) = self.slab.get_mut(child) {
            run.count_session_usage();
        }
    }

    /// A child no longer counts among those asked of its host: the host
    /// it belongs to, if it did.
    pub fn uncount(&mut self, child: usize) -> Option<usize> {
        let run = self.slab.get_mut(child)?;
        std::mem::take(&mut run.counted).then_some(run.host)
    }

    /// `host` has gone: its children count for no host (its key may name a
    /// new one).
    pub fn uncount_host(&mut self, host: usize) {
        for (_, child) in self.slab.iter_mut().filter(|(_, c)| c.host == host) {
            child.counted = false;
        }
    }

    /// The endpoints serving children's runs on the egress proxy.
    pub fn endpoints_mut(&mut self) -> impl Iterator<Item = &mut RunEndpoint> {
        self.slab
            .iter_mut()
            .filter_map(|(_, child)| child.endpoint.as_mut())
    }

    /// Every child's cgroups, taken (shutdown).
    pub fn take_cgroups(&mut self) -> Vec<RunCgroup> {
        self.slab
            .iter_mut()
            .flat_map(|(_, child)| child.cgroups())
            .collect()
    }
}
