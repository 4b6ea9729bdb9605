//! Exec hosts: started through the sandbox runtime, each claimed with the
//! zygote as its workload and a channel to it, replaced when one fails or
//! ends; the run children a host hands over are taken in here, and so are
//! the cgroups made for them, which go to the host a few ahead of need.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use agentos_proto::payload::NetTotals;
use agentos_proto::{ErrorCode, ErrorReply};
use mio::{Interest, Token};
use nix::sys::socket::{socketpair, AddressFamily, MsgFlags, SockFlag, SockType};

use super::cgroups::{Made, MadeFor};
use super::child::{RunChild, Stage};
use super::exec_host::{ExecHost, HostId};
use super::run_cgroup::{AgentRunCgroups, ChargedTo, RunCgroup, AGENT_SPARES};
use super::{wire, zygote, Exec, Source, Wake};
use crate::address::Reply;
use crate::cgroup::CgroupError;
use crate::fd;
use crate::sandbox::plan::Shape;
use crate::sandbox::runtime::{ClaimOrder, SandboxEvent, SandboxKey, Sandboxes};

/// After a host fails or ends, wait this long before starting another.
const HOST_RETRY: Duration = Duration::from_secs(1);
/// Shells are kept started while bash runs have come this recently: a
/// shell a Python run gets is wasted.
const SHELLS_FOR: Duration = Duration::from_secs(60);

impl Exec {
    /// Asks the runtime for the hosts that are missing.
    pub fn start_hosts(&mut self, sandboxes: &mut impl Sandboxes<HostId>, now: Instant) {
        if self.shutting_down {
            return;
        }
        while self.hosts.len() < self.wanted_hosts {
            let id = self.next_host;
            self.next_host += 1;
            let key = self.hosts.insert(ExecHost::new(id));
            if let Some(sandbox) = sandboxes.acquire(id, Shape::EXEC_HOST, now) {
                self.claim_host(sandboxes, key, sandbox);
            }
        }
    }

    /// Takes in what happened to a host's sandbox.
    pub fn on_sandbox(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        event: SandboxEvent<HostId>,
        now: Instant,
    ) {
        let Some(key) = self.host_key(*event.owner()) else {
            if let SandboxEvent::Ready { sandbox, .. } = event {
                sandboxes.discard(sandbox);
            }
            return;
        };
        match event {
            SandboxEvent::Ready { sandbox, .. } if self.shutting_down => {
                // Prepared while the kernel began to stop: never started.
                sandboxes.discard(sandbox);
                self.hosts.remove(key);
            }
            SandboxEvent::Ready { sandbox, .. } => self.claim_host(sandboxes, key, sandbox),
            SandboxEvent::Failed { error, .. } => {
                log::error!("exec host {}: {error}", self.hosts[key].id);
                self.host_gone(key, now);
            }
            SandboxEvent::Status { status, .. } => {
                if let crate::sandbox::Status::Error { message, .. } = status {
                    log::error!("exec host {}: {message}", self.hosts[key].id);
                }
            }
            SandboxEvent::OomKill { .. } => {
                log::warn!(
                    "exec host {}: the memory limit killed a process",
                    self.hosts[key].id
                );
            }
            SandboxEvent::Ended { init, .. } => {
                if self.shutting_down {
                    log::info!("exec host {} stopped", self.hosts[key].id);
                } else {
                    log::warn!("exec host {} ended: {init:?}", self.hosts[key].id);
                }
                self.host_gone(key, now);
            }
        }
    }

    fn host_key(&self, id: HostId) -> Option<usize> {
        self.hosts
            .iter()
            .find(|(_, host)| host.id == id)
            .map(|(key, _)| key)
    }

    /// Starts the zygote in a host's sandbox, with a channel to it.
    fn claim_host(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        key: usize,
        sandbox: SandboxKey,
    ) {
        let Some(id) = self.hosts.get(key).map(|host| host.id) else {
            return sandboxes.discard(sandbox);
        };
        self.hosts[key].sandbox = Some(sandbox);
        let pair = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        );
        let (ours, theirs) = match pair {
            Ok(pair) => pair,
            Err(err) => {
                log::error!("exec host {id}: cannot make its channel: {err}");
                return sandboxes.signal(sandbox, libc::SIGKILL);
            }
        };
        let workload = zygote::workload(&self.setup);
        let order = ClaimOrder {
            workload: &workload,
            log: &self.log,
            cgroup_name: format!("exec-host-{id}"),
            limits: self.host_limits,
            door: None,
            channel: Some(theirs.as_fd()),
        };
        if let Err(error) = sandboxes.claim(sandbox, id, order) {
            // The sandbox is killed; its end comes as an event.
            log::error!("exec host {id}: {error}");
            return;
        }
        // The zygote holds its end now; ours must not keep a copy alive.
        drop(theirs);
        let settings = zygote::settings(&self.setup);
        if let Err(err) =
            nix::sys::socket::send(ours.as_raw_fd(), &settings, MsgFlags::MSG_NOSIGNAL)
        {
            log::error!("exec host {id}: cannot send its settings: {err}");
            return sandboxes.signal(sandbox, libc::SIGKILL);
        }
        let entry = self.sources.vacant_entry();
        let token = Token(self.token_base + entry.key());
        if let Err(err) = fd::watch(&self.registry, ours.as_raw_fd(), token, Interest::READABLE) {
            log::error!("exec host {id}: cannot watch its channel: {err}");
            return sandboxes.signal(sandbox, libc::SIGKILL);
        }
        entry.insert(Source::Channel(key));
        self.hosts[key].channel = Some((ours, token));
        self.ask_for_children(key);
        log::info!("exec host {id} starting");
    }

    /// A host failed or ended: its children go with it; another starts
    /// after a pause.
    fn host_gone(&mut self, key: usize, now: Instant) {
        let host = self.hosts.remove(key);
        // Its children go with it; they count for no host (the key may
        // name a new one).
        for (_, child) in self.children.iter_mut().filter(|(_, c)| c.host == key) {
            child.counted = false;
        }
        if let Some((channel, token)) = host.channel {
            self.forget_source(channel.as_raw_fd(), token);
        }
        if let Some(cgroups) = &self.run_cgroups {
            host.cgroups.into_values().for_each(|c| cgroups.recycle(c));
        }
        if !self.shutting_down {
            self.timers.schedule(now + HOST_RETRY, Wake::StartHosts);
        }
    }

    /// Run children a host has handed over.
    pub(super) fn take_children(&mut self, key: usize, replies: &mut Vec<Reply>, now: Instant) {
        loop {
            let Some((channel, _)) = self.hosts.get(key).and_then(|h| h.channel.as_ref()) else {
                return;
            };
            let ready = match wire::receive_ready(channel.as_fd()) {
                Ok(Some(ready)) => ready,
                Ok(None) => return,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err) => {
                    log::warn!("exec host: {err}");
                    return;
                }
            };
            if let Some(asked) = self.hosts[key].asked.pop_front() {
                self.counts.refilled(now.saturating_duration_since(asked));
            }
            let cgroup = self.hosts[key].cgroups.remove(&ready.cgroup);
            // The pipes are made non-blocking as they are watched.
            if let Err(err) = fd::set_nonblocking(&ready.socket) {
                log::warn!("exec host: cannot use a run child: {err}");
                continue;
            }
            let child = self.children.insert(RunChild {
                host: key,
                socket: ready.socket,
                stdout: Some(ready.stdout),
                stderr: Some(ready.stderr),
                pidfd: None,
                stage: Stage::Preparing,
                received: Vec::new(),
                workspace_bytes: None,
                socket_token: None,
                output_tokens: [None, None],
                writable: false,
                oom_kills_seen: cgroup.as_ref().map_or(0, |c| c.oom_kills),
                cgroup,
                charged: None,
                first_connection: None,
                shell: false,
                counted: true,
                endpoint: None,
                net_before: NetTotals::default(),
                span: None,
            });
            let socket = self.children[child].socket.as_raw_fd();
            let registered = self
                .register(socket, Source::Socket(child), Interest::READABLE)
                .and_then(|token| {
                    self.children[child].socket_token = Some(token);
                    self.watch_outputs(child)
                });
            if let Err(err) = registered {
                log::warn!("exec host: cannot watch a run child: {err}");
                self.drop_child(child);
                continue;
            }
            // Its pidfd may already be there.
            if let Ok(true) = self.children[child].receive_pidfd() {
                self.child_ready(child, replies, now);
            }
        }
    }
}

impl Exec {
    /// Sends the cgroups made since the last call to their hosts, and keeps
    /// those made inside agents' for their runs, which may start now.
    pub fn on_wake(&mut self, replies: &mut Vec<Reply>) {
        let Some(cgroups) = &self.run_cgroups else {
            return;
        };
        let made: Vec<Made> = cgroups.made().collect();
        let mut for_agents = false;
        for made in made {
            match made.made_for {
                MadeFor::Host(host) => self.cgroup_for_host(host, made.result),
                MadeFor::Agent(to) => {
                    self.cgroup_for_agent(to, made.result, replies);
                    for_agents = true;
                }
            }
        }
        if for_agents {
            self.dispatch(replies, Instant::now());
        }
    }

    /// A cgroup made inside an agent's (or returned after a run of its):
    /// kept for its next runs while the agent's cgroup is the same, else
    /// removed.
    fn cgroup_for_agent(
        &mut self,
        to: ChargedTo,
        result: Result<RunCgroup, CgroupError>,
        replies: &mut Vec<Reply>,
    ) {
        let Some(cgroups) = &self.run_cgroups else {
            return;
        };
        let agent = self
            .agent_cgroups
            .get_mut(&to.agent)
            .filter(|made| made.cgroup == to.cgroup);
        match (agent, result) {
            (Some(agent), Ok(run)) => {
                agent.asked = agent.asked.saturating_sub(1);
                if agent.spare.len() < AGENT_SPARES {
                    agent.spare.push(run);
                } else {
                    cgroups.remove(run);
                }
            }
            (None, Ok(run)) => cgroups.remove(run),
            (agent, Err(err)) => {
                log::error!(
                    "agent {}: no cgroup inside its own for a run: {err}",
                    to.agent
                );
                if let Some(agent) = agent {
                    agent.asked = agent.asked.saturating_sub(1);
                }
                // Its waiting runs are answered now, rather than asking
                // again and again until their deadlines.
                let failed = ErrorReply::new(
                    ErrorCode::Internal,
                    format!("no cgroup could be made for the run inside its agent's: {err}"),
                );
                for waiting in self
                    .queues
                    .take_where(|w| w.charged_to.as_ref().is_some_and(|c| c.agent == to.agent))
                {
                    self.answer_waiting(waiting, &failed, replies);
                }
            }
        }
    }

    /// Asks the cgroup thread for a cgroup inside each agent's whose next
    /// queued run needs one and has none spare (or coming).
    pub(super) fn ask_for_agent_cgroups(&mut self) {
        let Some(cgroups) = &self.run_cgroups else {
            return;
        };
        let wanted: Vec<ChargedTo> = self
            .queues
            .iter()
            .chain(self.sessions.values().flat_map(|s| s.queue.iter()))
            .filter_map(|w| w.charged_to.clone())
            .collect();
        for to in wanted {
            let agent = self
                .agent_cgroups
                .entry(to.agent)
                .or_insert_with(|| AgentRunCgroups {
                    cgroup: to.cgroup.clone(),
                    spare: Vec::new(),
                    asked: 0,
                });
            if agent.cgroup != to.cgroup {
                // The agent has restarted in a new cgroup: the old one's
                // spares go with it.
                for run in agent.spare.drain(..) {
                    cgroups.remove(run);
                }
                agent.cgroup = to.cgroup.clone();
                agent.asked = 0;
            }
            if agent.spare.is_empty() && agent.asked == 0 {
                agent.asked += 1;
                cgroups.make_inside(to);
            }
        }
    }

    /// An agent's cgroup is going: the cgroups made inside it for its runs
    /// go first.
    pub(super) fn forget_agent_cgroups(&mut self, agent: u32) {
        let Some(made) = self.agent_cgroups.remove(&agent) else {
            return;
        };
        if let Some(cgroups) = &self.run_cgroups {
            made.spare.into_iter().for_each(|run| cgroups.remove(run));
        }
    }

    /// Sends a cgroup made for a host's next run child (or says there is
    /// none, so the child goes without).
    fn cgroup_for_host(&mut self, host: HostId, result: Result<RunCgroup, CgroupError>) {
        let Some(cgroups) = &self.run_cgroups else {
            return;
        };
        let host = self
            .hosts
            .iter_mut()
            .find(|(_, h)| h.id == host && h.channel.is_some())
            .map(|(_, host)| host);
        let Some(host) = host else {
            // Its host is gone.
            if let Ok(run) = result {
                cgroups.recycle(run);
            }
            return;
        };
        let Some((channel, _)) = &host.channel else {
            return;
        };
        host.last_cgroup += 1;
        let number = host.last_cgroup;
        let sent = match result {
            Ok(run) => {
                let sent = wire::send_cgroup(channel.as_fd(), number, &run.join_files);
                match sent {
                    Ok(()) => {
                        host.cgroups.insert(number, run);
                    }
                    Err(_) => cgroups.recycle(run),
                }
                sent
            }
            Err(err) => {
                // The host must not stall for want of one: its next run
                // goes without (and refuses limits of its own).
                log::error!("exec host {}: no cgroup for a run: {err}", host.id);
                wire::send_cgroup(channel.as_fd(), 0, &[])
            }
        };
        match sent {
            Ok(()) => {}
            // It has ended; its end comes as an event.
            Err(err) if err.kind() == io::ErrorKind::BrokenPipe => {}
            Err(err) => log::warn!(
                "exec host {}: cannot send it a run's cgroup: {err}",
                host.id
            ),
        }
    }
}

impl Exec {
    /// A child has said it is ready: it gets its first run's own kernel
    /// connection now — and, if bash runs have come lately and too few
    /// ready children have one, starts a shell with it for the next — then
    /// waits for an order.
    pub(super) fn child_ready(&mut self, child: usize, replies: &mut Vec<Reply>, now: Instant) {
        let shells = self
            .ready
            .iter()
            .filter(|c| self.children.get(**c).is_some_and(|c| c.shell))
            .count();
        let bash_lately = self
            .last_bash
            .is_some_and(|at| now.saturating_duration_since(at) < SHELLS_FOR);
        let shell = bash_lately && shells < self.ready_shells;
        let prepared = match mio::net::UnixStream::pair() {
            Ok((ours, theirs)) => {
                let theirs = std::os::unix::net::UnixStream::from(theirs);
                theirs
                    .set_nonblocking(false)
                    .and_then(|()| self.children[child].prepare(ours, OwnedFd::from(theirs), shell))
            }
            Err(err) => Err(err),
        };
        if let Err(err) = prepared {
            log::warn!("exec host: cannot prepare a run child: {err}");
            self.children[child].kill_quietly();
            return self.drop_child(child);
        }
        self.ready.push_back(child);
        self.dispatch(replies, now);
    }
}

impl Exec {
    /// Asks a host for run children until `exec.ready_runs` count: each
    /// comes with a cgroup of its own (made first, in the background) or
    /// none. Asking after a run has ended, not when it starts, keeps the
    /// preparing off the run's way.
    pub(super) fn ask_for_children(&mut self, key: usize) {
        if self.shutting_down {
            return;
        }
        let Some(host) = self.hosts.get_mut(key) else {
            return;
        };
        let Some((channel, _)) = &host.channel else {
            return;
        };
        while host.requested < self.setup.ready_runs {
            host.requested += 1;
            host.asked.push_back(Instant::now());
            match &self.run_cgroups {
                Some(cgroups) => cgroups.make(host.id, 1),
                None => {
                    if let Err(err) = wire::send_cgroup(channel.as_fd(), 0, &[]) {
                        log::debug!("exec host {}: cannot ask it for a run: {err}", host.id);
                    }
                }
            }
        }
    }

    /// A child of `key` no longer counts (its first run has ended, or it is
    /// gone): the host is asked for another.
    pub(super) fn child_taken(&mut self, key: usize) {
        if let Some(host) = self.hosts.get_mut(key) {
            host.requested = host.requested.saturating_sub(1);
        }
        self.ask_for_children(key);
    }
}
