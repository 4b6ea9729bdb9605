//! Dispatch: waiting requests given to ready children, an order sent, the
//! reply built when the child has ended, and the child let go (or kept
//! for its session) — with the bookkeeping of the descriptors it holds.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Instant, SystemTime};

use agentos_proto::payload::{ExecRequest, Language, NetTotals};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::unix::SourceFd;
use mio::{Interest, Token};

use super::child::{RunChild, Stage};
use super::network::open_endpoint;
use super::order::{Kill, Order, OrderOf, Running};
use super::output::Stream;
use super::run_cgroup::{has_cgroup_for, take_agent_cgroup};
use super::waiting::{Carried, RunAsk, Session, SessionKey, Waiting};
use super::{wire, zygote, Exec, Source, Wake, MAX_LOST_SESSIONS};
use crate::address::{Adopted, Adoptee, Reply};
use crate::fd;
use crate::network::gateway::net_totals;

impl Exec {
    /// Gives waiting requests to ready children, owner by owner in turn,
    /// each within its share; a request for a session opened meanwhile
    /// joins that session's queue.
    pub(super) fn dispatch(&mut self, replies: &mut Vec<Reply>, now: Instant) {
        let sessions = &self.sessions;
        let opened = self
            .queues
            .take_where(|w| w.session.as_ref().is_some_and(|k| sessions.contains_key(k)));
        for waiting in opened {
            let Some(key) = waiting.session.clone() else {
                continue;
            };
            if let Some(session) = self.sessions.get_mut(&key) {
                session.queue.push_back(waiting);
            }
            self.serve_session(&key, replies, now);
        }
        self.ask_for_agent_cgroups();
        while !self.ready.is_empty() {
            let agent_cgroups = &self.agent_cgroups;
            let lending = self.lending_runs();
            let Some((_, mut waiting)) = self.queues.next(
                |w| has_cgroup_for(agent_cgroups, w.charged_to.as_ref()),
                |w| w.is_lent(&lending),
            ) else {
                return;
            };
            if let Err(narrowed) = self.network_at_start(&mut waiting) {
                self.refuse_at_start(waiting, narrowed, replies);
                continue;
            }
            let bash =
                matches!(waiting.order, Order::Run) && waiting.request.language == Language::Bash;
            let Some(child) = self.take_ready(bash) else {
                self.queues.push_front(waiting.share, waiting);
                return;
            };
            if let Some(key) = waiting.session.clone() {
                // A new session, or one a restore carries over.
                let created = SystemTime::now();
                let carried = waiting.carried.take().unwrap_or_else(|| Carried {
                    created_at: created,
                    runs: 0,
                    queue: VecDeque::new(),
                    grant: RunAsk::of(&waiting.request),
                });
                self.sessions.insert(
                    key,
                    Session {
                        child,
                        created_at: carried.created_at,
                        last_used_at: created,
                        last_used: now,
                        runs: carried.runs,
                        queue: carried.queue,
                        grant: carried.grant,
                        busy: true,
                    },
                );
            }
            self.start(child, waiting, replies, now);
        }
    }

    /// The ready child for a request: the oldest of those with a shell
    /// started for a bash run, of those without for anything else — or
    /// the oldest of all.
    fn take_ready(&mut self, bash: bool) -> Option<usize> {
        let children = &self.children;
        self.ready.retain(|c| {
            children
                .get(*c)
                .is_some_and(|c| matches!(c.stage, Stage::Ready))
        });
        let index = self
            .ready
            .iter()
            .position(|c| children.get(*c).is_some_and(|c| c.shell == bash))
            .unwrap_or(0);
        self.ready.remove(index)
    }

    /// Sends a request to a child (a session's keeps it for more). A run
    /// counts against its owner's share until it ends.
    pub(super) fn start(
        &mut self,
        child: usize,
        waiting: Waiting,
        replies: &mut Vec<Reply>,
        now: Instant,
    ) {
        let timeout = waiting.timeout;
        let keep = waiting.session.is_some();
        let collect_caps = (self.max_file_bytes, self.max_collect_bytes());
        let asked_limits = waiting.request.limits.is_some();
        let mut order = order_for(waiting.request, collect_caps, keep);
        order.op = waiting.order.op();
        let Some(run) = self.children.get_mut(child) else {
            return;
        };
        // Any order uses up the child's shell, or has it stopped.
        run.shell = false;
        let queued = now.saturating_duration_since(waiting.queued_at);
        self.counts.started(queued);
        if let Some(mut span) = waiting.span {
            span.int("agentos.exec.queue_ms", queued.as_millis() as i64);
            // The run's code, and the tool calls it makes, join its span.
            order.trace = Some(span.context.to_string());
            run.span = Some(span);
        }
        if let Some(policy) = waiting.policy.clone() {
            let of = (waiting.owner, waiting.run, waiting.net_record.as_ref());
            match open_endpoint(&self.gateway, run, of, policy) {
                Ok(env) => order.env.extend(env),
                Err(err) => {
                    // Without its endpoint the run would have no network at
                    // all: it is refused, and its child (and a session it
                    // held) ends, unused.
                    run.kill_quietly();
                    run.stage = Stage::Ended;
                    let refusal = ErrorReply::new(
                        ErrorCode::Unavailable,
                        format!(
                            "EXEC field `network`: the run's proxy endpoint cannot be made: {err}"
                        ),
                    );
                    replies.push((waiting.reply_to, refusal.into()));
                    return self.child_gone(child, replies);
                }
            }
        }
        // The first order of an agent's work moves the child into a cgroup
        // inside the agent's, before anything else: from then on what it
        // uses counts against the agent's limits.
        let mut attached: Vec<OwnedFd> = Vec::new();
        if run.charged.is_none() {
            if let Some(charged) = waiting
                .charged_to
                .as_ref()
                .and_then(|to| take_agent_cgroup(&mut self.agent_cgroups, to))
            {
                attached.extend(charged.join_files.iter().filter_map(|f| f.try_clone().ok()));
                order.join = attached.len();
                run.charge_to(charged);
            }
        }
        // A run gets its own kernel connection; a snapshot or restore, the
        // memfd that holds it.
        match (&waiting.order, waiting.run) {
            (Order::Run, Some(number)) => match run.first_connection.take() {
                // The child has it already (and a shell it started, too).
                Some(stream) => self.adopted.push(Adopted {
                    stream,
                    peer: Adoptee::Run(number),
                }),
                None => attached.extend(self.run_connection(number)),
            },
            (Order::Run, None) => {}
            (Order::Snapshot { data, .. } | Order::Restore { data }, _) => {
                attached.extend(data.try_clone().ok())
            }
        }
        let holds = matches!(waiting.order, Order::Run).then_some(waiting.share);
        if let Some(share) = holds {
            self.queues.started(share);
        }
        let of = OrderOf {
            run: waiting.run,
            owner: waiting.owner,
            holds,
        };
        let session = waiting.session.map(|(_, name)| name);
        let running = Running::new(
            of,
            waiting.reply_to,
            waiting.order,
            timeout,
            self.output_bytes,
            session,
            now,
        );
        let Some(run) = self.children.get_mut(child) else {
            return;
        };
        if let Err(err) = run.limit(&waiting.limits, asked_limits) {
            // Nothing of the run has started, but its limits are in doubt:
            // the child (and a session it held) ends.
            run.kill_quietly();
            run.stage = Stage::Ended;
            if let Some(share) = holds {
                self.queues.ended(share);
            }
            let refusal = ErrorReply::new(
                ErrorCode::BadRequest,
                format!(
                    "EXEC field `limits`: they cannot be given to the run: {err} (a memory \
                     limit must leave room for the interpreter)"
                ),
            );
            replies.push((waiting.reply_to, refusal.into()));
            return self.child_gone(child, replies);
        }
        let unsent = run.start(&order, running, attached).unwrap_or_else(|err| {
            log::debug!("exec run: cannot send the order: {err}");
            run.kill(Kill::Unsent);
            false
        });
        self.watch_writable(child, unsent);
        self.timers.schedule(
            now + timeout,
            Wake::Timeout {
                child,
                started: now,
            },
        );
        self.finish_if_done(child, replies, now);
    }

    /// Run `number`'s own connection to the kernel, whose calls are the
    /// run's: the kernel adopts one end, the run gets the other.
    fn run_connection(&mut self, number: u64) -> Option<OwnedFd> {
        let (ours, theirs) = match mio::net::UnixStream::pair() {
            Ok(pair) => pair,
            Err(err) => {
                log::warn!("exec run: no kernel connection for it: {err}");
                return None;
            }
        };
        let theirs = std::os::unix::net::UnixStream::from(theirs);
        // The run's end blocks, as any socket a program opens does.
        if let Err(err) = theirs.set_nonblocking(false) {
            log::warn!("exec run: no kernel connection for it: {err}");
            return None;
        }
        self.adopted.push(Adopted {
            stream: ours,
            peer: Adoptee::Run(number),
        });
        Some(OwnedFd::from(theirs))
    }

    /// Answers a run that has ended, and lets its child go — unless a
    /// session keeps it. Its owner's share has room again: what waited
    /// for that room starts.
    pub(super) fn finish_if_done(&mut self, child: usize, replies: &mut Vec<Reply>, now: Instant) {
        let Some(holds) = self
            .children
            .get(child)
            .filter(|c| c.is_finished())
            .map(RunChild::holds)
        else {
            return;
        };
        self.finish_order(child, replies, now);
        if let Some(share) = holds {
            self.queues.ended(share);
            self.serve_waiting(replies, now);
        }
    }

    /// Starts what waits, now that there may be room: queued requests, and
    /// sessions' queued runs whose child is free — each first in turn, so
    /// neither can keep the room from the other.
    pub(super) fn serve_waiting(&mut self, replies: &mut Vec<Reply>, now: Instant) {
        self.sessions_first = !self.sessions_first;
        if !self.sessions_first {
            self.dispatch(replies, now);
        }
        let waiting: Vec<SessionKey> = self
            .sessions
            .iter()
            .filter(|(_, session)| !session.busy && !session.queue.is_empty())
            .map(|(key, _)| key.clone())
            .collect();
        for key in waiting {
            self.serve_session(&key, replies, now);
        }
        if self.sessions_first {
            self.dispatch(replies, now);
        }
    }

    /// The reply to a finished order, and what becomes of its child.
    fn finish_order(&mut self, child: usize, replies: &mut Vec<Reply>, now: Instant) {
        let Some(run) = self.children.get_mut(child) else {
            return;
        };
        let finished = run.finish(now);
        let ran_code = finished
            .as_ref()
            .is_some_and(|f| matches!(f.order, Order::Run));
        let alive = run.is_kept();
        let key = self
            .sessions
            .iter()
            .find(|(_, session)| session.child == child)
            .map(|(key, _)| key.clone());
        if let Some(mut finished) = finished {
            if let (Order::Run, Some(open)) = (&finished.order, &run.endpoint) {
                let now = net_totals(open.endpoint.record());
                finished.reply.network = Some(since(run.net_before, now));
            }
            if let Order::Run = finished.order {
                self.counts.ended(&finished.reply);
            }
            if let Some(mut span) = run.span.take() {
                let reply = &finished.reply;
                if let Some(code) = reply.exit_code {
                    span.int("process.exit.code", i64::from(code));
                }
                let error = if reply.timed_out {
                    Some("timeout")
                } else if reply.oom_killed {
                    Some("oom")
                } else if reply.code.is_some() {
                    Some("error")
                } else if !reply.success {
                    Some("failed")
                } else {
                    None
                };
                if let Some(kind) = error {
                    span.text("error.type", kind);
                }
                self.tracer.end(
                    span,
                    error.map(|kind| reply.error.clone().unwrap_or_else(|| kind.to_owned())),
                );
            }
            let reply_to = finished.reply_to;
            let reply = match &key {
                Some(key) => self.snapshot_reply(key, finished),
                None => finished.reply.into(),
            };
            replies.push((reply_to, reply));
        }
        let Some(key) = key else {
            return self.drop_child(child);
        };
        if let Some(run) = self.children.get_mut(child) {
            // Kept for its session, it is no longer one of its host's
            // prepared children: the host prepares another.
            if std::mem::take(&mut run.counted) {
                let host = run.host;
                self.child_taken(host);
            }
        }
        if !alive {
            // Its interpreter is gone (killed at a timeout, or it died):
            // so is the session, its snapshots, and what waited for it.
            self.snapshots.remove(&key);
            if let Some(session) = self.sessions.remove(&key) {
                for waiting in session.queue {
                    let ended = ErrorReply::new(
                        ErrorCode::NotFound,
                        format!(
                            "session {:?} ended before this run could start (its interpreter \
                             was killed); run again to start a new one",
                            key.1
                        ),
                    );
                    replies.push((waiting.reply_to, ended.into()));
                }
            }
            return self.drop_child(child);
        }
        if let Err(err) = self.watch_outputs(child) {
            log::warn!("exec session: cannot watch its output: {err}");
            self.snapshots.remove(&key);
            self.sessions.remove(&key);
            return self.drop_child(child);
        }
        if let Some(session) = self.sessions.get_mut(&key) {
            session.busy = false;
            session.runs += u64::from(ran_code);
            session.last_used = now;
            self.timers.schedule(
                now + self.session_idle,
                Wake::SessionIdle {
                    key: key.clone(),
                    last_used: now,
                },
            );
        }
        self.serve_session(&key, replies, now);
    }

    /// A session's child has handed over its next run's pipes: watched,
    /// they let the session's next run start.
    pub(super) fn renewed(&mut self, child: usize, replies: &mut Vec<Reply>, now: Instant) {
        let key = self
            .sessions
            .iter()
            .find(|(_, session)| session.child == child)
            .map(|(key, _)| key.clone());
        let Some(key) = key else {
            return self.drop_child(child);
        };
        if let Err(err) = self.watch_outputs(child) {
            log::warn!("exec session: cannot watch its output: {err}");
            return self.child_gone(child, replies);
        }
        self.serve_session(&key, replies, now);
    }

    /// Watches a child's (new) stdout and stderr pipes.
    pub(super) fn watch_outputs(&mut self, child: usize) -> io::Result<()> {
        for stream in Stream::BOTH {
            let Some(run) = self.children.get(child) else {
                return Ok(());
            };
            let Some(pipe) = run.pipe(stream) else {
                continue;
            };
            fd::set_nonblocking(pipe)?;
            let fd = pipe.as_raw_fd();
            let token = self.register(fd, Source::Output(child, stream), Interest::READABLE)?;
            self.children[child].output_tokens[stream.index()] = Some(token);
        }
        Ok(())
    }

    /// Watches a child's socket for writability while an order is unsent,
    /// and only then (a waiting child's socket is otherwise writable all
    /// along).
    pub(super) fn watch_writable(&mut self, child: usize, writable: bool) {
        let Some(run) = self.children.get_mut(child) else {
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
        let fd = run.socket.as_raw_fd();
        match self
            .registry
            .reregister(&mut SourceFd(&fd), token, interest)
        {
            Ok(()) => run.writable = writable,
            Err(err) => log::warn!("exec run: cannot watch its socket: {err}"),
        }
    }

    /// A waiting child went away: a session it held ends with it. If the
    /// memory controller killed it (its agent's runs and sessions together
    /// went over the agent's limit, say), the session's next run is told.
    pub(super) fn child_gone(&mut self, child: usize, replies: &mut Vec<Reply>) {
        let key = self
            .sessions
            .iter()
            .find(|(_, session)| session.child == child)
            .map(|(key, _)| key.clone());
        if let Some((owner, name)) = key {
            let oom_killed = self
                .children
                .get(child)
                .is_some_and(RunChild::was_oom_killed);
            if oom_killed && self.lost_to_memory.len() < MAX_LOST_SESSIONS {
                log::debug!("exec session {name:?}: its idle interpreter was killed for memory");
                self.lost_to_memory.insert((owner, name.clone()));
            }
            self.close(owner, &name, replies);
        }
        self.drop_child(child);
    }

    pub(super) fn drop_child(&mut self, child: usize) {
        if !self.children.contains(child) {
            return;
        }
        for stream in Stream::BOTH {
            self.forget_output(child, stream);
        }
        let mut run = self.children.remove(child);
        if let Some(share) = run.holds() {
            self.queues.ended(share);
        }
        if run.counted {
            self.child_taken(run.host);
        }
        if let Some(token) = run.socket_token {
            self.forget_source(run.socket.as_raw_fd(), token);
        }
        if let Some(cgroups) = &self.run_cgroups {
            run.cgroups().for_each(|cgroup| cgroups.recycle(cgroup));
        }
        self.ready.retain(|c| *c != child);
    }

    /// Stops watching one of a child's pipes (closed already, or not).
    pub(super) fn forget_output(&mut self, child: usize, stream: Stream) {
        let Some(run) = self.children.get_mut(child) else {
            return;
        };
        let token = run.output_tokens[stream.index()].take();
        let pipe = match stream {
            Stream::Stdout => run.stdout.take(),
            Stream::Stderr => run.stderr.take(),
        };
        if let Some(token) = token {
            self.sources.try_remove(token.0 - self.token_base);
        }
        if let Some(pipe) = pipe {
            let _ = self.registry.deregister(&mut SourceFd(&pipe.as_raw_fd()));
        }
    }

    pub(super) fn register(
        &mut self,
        fd: RawFd,
        source: Source,
        interest: Interest,
    ) -> io::Result<Token> {
        let entry = self.sources.vacant_entry();
        let token = Token(self.token_base + entry.key());
        fd::watch(&self.registry, fd, token, interest)?;
        entry.insert(source);
        Ok(token)
    }

    pub(super) fn forget_source(&mut self, fd: RawFd, token: Token) {
        let _ = self.registry.deregister(&mut SourceFd(&fd));
        self.sources.try_remove(token.0 - self.token_base);
    }
}

impl Exec {
    /// What a run may collect in all: the reply's limit, less its output
    /// and room for its other fields, as raw bytes before base64.
    pub(super) fn max_collect_bytes(&self) -> u64 {
        let room = (wire::MAX_END_FRAME as u64)
            .saturating_sub(2 * self.output_bytes as u64)
            .saturating_sub(64 << 10);
        room / 4 * 3
    }
}

/// What a record's counters gained from `before` to `now`.
fn since(before: NetTotals, now: NetTotals) -> NetTotals {
    NetTotals {
        allowed: now.allowed.saturating_sub(before.allowed),
        refused: now.refused.saturating_sub(before.refused),
        bytes_out: now.bytes_out.saturating_sub(before.bytes_out),
        bytes_in: now.bytes_in.saturating_sub(before.bytes_in),
    }
}

/// What a request becomes for the run child.
/// `limits`: the largest file collected, and the most collected in all.
fn order_for(request: ExecRequest, limits: (u64, u64), keep: bool) -> wire::RunOrder {
    let (max_file_bytes, max_collect_bytes) = limits;
    let mut env = zygote::run_env();
    env.extend(request.env);
    wire::RunOrder {
        op: wire::OrderOp::Run,
        code: request.code,
        language: request.language,
        env,
        cwd: request.cwd,
        files: request.files,
        collect: request.collect,
        max_file_bytes,
        max_collect_bytes,
        keep,
        join: 0,
        trace: None,
    }
}
