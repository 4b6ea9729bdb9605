//! Runs: waiting requests given to ready children, an order sent, the
//! reply built when the child has ended, and the child let go (or kept
//! for its session) — with the bookkeeping of the descriptors it holds.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Instant, SystemTime};

use agentos_proto::payload::{to_json, ExecRequest, Language};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::unix::SourceFd;
use mio::{Interest, Token};

use super::run::{self, Kill, Running, Stage, Stream, Work};
use super::sessions::Session;
use super::snapshots::Carried;
use super::{host, set_nonblocking, watch, wire, Exec, Source, Waiting, Wake};
use crate::address::{Adopted, Reply};
use crate::identity::Identity;

impl Exec {
    /// Gives waiting requests to ready children; a request for a session
    /// opened meanwhile joins that session's queue.
    pub(super) fn dispatch(&mut self, replies: &mut Vec<Reply>, now: Instant) {
        while let Some(waiting) = self.waiting.front() {
            if let Some(key) = waiting
                .session
                .clone()
                .filter(|k| self.sessions.contains_key(k))
            {
                if let (Some(waiting), Some(session)) =
                    (self.waiting.pop_front(), self.sessions.get_mut(&key))
                {
                    session.queue.push_back(waiting);
                }
                self.serve_session(&key, replies, now);
                continue;
            }
            let bash =
                matches!(waiting.work, Work::Run) && waiting.request.language == Language::Bash;
            let Some(child) = self.take_ready(bash) else {
                return;
            };
            if !matches!(
                self.children.get(child).map(|c| &c.stage),
                Some(Stage::Ready)
            ) {
                continue;
            }
            let Some(mut waiting) = self.waiting.pop_front() else {
                return;
            };
            if let Some(key) = waiting.session.clone() {
                // A new session, or one a restore carries over.
                let created = SystemTime::now();
                let carried = waiting.carried.take().unwrap_or(Carried {
                    created_at: created,
                    runs: 0,
                    queue: VecDeque::new(),
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
        let index = self
            .ready
            .iter()
            .position(|c| children.get(*c).is_some_and(|c| c.shell == bash))
            .unwrap_or(0);
        self.ready.remove(index)
    }

    /// Sends a request to a child (a session's keeps it for more).
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
        order.op = waiting.work.op();
        // A run gets its own kernel connection; a snapshot or restore, the
        // memfd that holds it.
        if let Some(run) = self.children.get_mut(child) {
            // Any order uses up the child's shell, or has it stopped.
            run.shell = false;
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        let attached = match &waiting.work {
            Work::Run => {
                let first = self
                    .children
                    .get_mut(child)
                    .and_then(|c| c.first_connection.take());
                match first {
                    // The child has it already (and a shell it started, too).
                    Some(stream) => {
                        self.adopted.push(Adopted {
                            stream,
                            identity: waiting.caller,
                            run: Some(tag),
                        });
                        None
                    }
                    None => self.run_connection(waiting.caller, tag),
                }
            }
            Work::Snapshot { data, .. } | Work::Restore { data } => data.try_clone().ok(),
        };
        let session = waiting.session.map(|(_, name)| name);
        let running = Running::new(
            tag,
            waiting.reply_to,
            waiting.work,
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
            let refusal = ErrorReply::new(
                ErrorCode::BadRequest,
                format!(
                    "EXEC field `limits`: they cannot be given to the run: {err} (a memory \
                     limit must leave room for the interpreter)"
                ),
            );
            replies.push((waiting.reply_to, refusal.to_json()));
            return self.child_gone(child, replies);
        }
        let unsent = run.start(&order, running, attached).unwrap_or_else(|err| {
            log::debug!("exec run: cannot send the order: {err}");
            run.kill(Kill::Shutdown);
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

    /// The run's own connection to the kernel, whose calls are `caller`'s
    /// and counted in the reply of the run tagged `tag`: the kernel adopts
    /// one end, the run gets the other.
    fn run_connection(&mut self, caller: Identity, tag: u64) -> Option<OwnedFd> {
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
            identity: caller,
            run: Some(tag),
        });
        Some(OwnedFd::from(theirs))
    }

    /// Answers a run that has ended, and lets its child go — unless a
    /// session keeps it.
    pub(super) fn finish_if_done(&mut self, child: usize, replies: &mut Vec<Reply>, now: Instant) {
        let Some(run) = self.children.get_mut(child).filter(|c| c.is_finished()) else {
            return;
        };
        let finished = run.finish(now);
        let ran_code = finished
            .as_ref()
            .is_some_and(|f| matches!(f.work, Work::Run));
        let alive = run.is_kept();
        let key = self
            .sessions
            .iter()
            .find(|(_, session)| session.child == child)
            .map(|(key, _)| key.clone());
        if let Some(finished) = finished {
            let reply_to = finished.reply_to;
            let reply = match &key {
                Some(key) => self.snapshot_reply(key, finished),
                None => to_json(&finished.reply),
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
                    replies.push((waiting.reply_to, ended.to_json()));
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
            set_nonblocking(pipe)?;
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

    /// A waiting child went away: a session it held ends with it.
    pub(super) fn child_gone(&mut self, child: usize, replies: &mut Vec<Reply>) {
        let key = self
            .sessions
            .iter()
            .find(|(_, session)| session.child == child)
            .map(|(key, _)| key.clone());
        if let Some((owner, name)) = key {
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
        let run = self.children.remove(child);
        if run.counted {
            self.child_taken(run.host);
        }
        if let Some(token) = run.socket_token {
            self.forget_source(run.socket.as_raw_fd(), token);
        }
        if let (Some(cgroup), Some(cgroups)) = (run.cgroup, &self.run_cgroups) {
            cgroups.recycle(cgroup);
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
        watch(&self.registry, fd, token, interest)?;
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
        let room = (run::MAX_END_FRAME as u64)
            .saturating_sub(2 * self.output_bytes as u64)
            .saturating_sub(64 << 10);
        room / 4 * 3
    }
}

/// What a request becomes for the run child.
/// `limits`: the largest file collected, and the most collected in all.
fn order_for(request: ExecRequest, limits: (u64, u64), keep: bool) -> wire::RunOrder {
    let (max_file_bytes, max_collect_bytes) = limits;
    let mut env = host::run_env();
    env.extend(request.env);
    wire::RunOrder {
        op: wire::OrderOp::Run,
        code: request.code,
        language: match request.language {
            Language::Python => "python",
            Language::Bash => "bash",
        }
        .to_owned(),
        env,
        cwd: request.cwd,
        files: request.files,
        collect: request.collect,
        max_file_bytes,
        max_collect_bytes,
        keep,
    }
}
