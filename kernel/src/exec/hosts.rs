//! Exec hosts: started through the sandbox runtime, each claimed with the
//! zygote as its workload and a channel to it, replaced when one fails or
//! ends; the run children a host hands over are taken from its channel
//! here, and so are the cgroups made for them, which go to the host a few
//! ahead of need. The ready children, oldest first, wait here for code,
//! some with a shell started while bash runs come.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mio::Interest;
use nix::sys::socket::{socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
use slab::Slab;

use super::cgroups::RunCgroups;
use super::children::Children;
use super::counts::ExecCounts;
use super::exec_host::{ExecHost, HostId};
use super::run_cgroup::RunCgroup;
use super::sources::{ExecSource, Sources};
use super::wire::{self, Ready};
use super::zygote::{self, ExecHostSetup};
use crate::cgroup::{CgroupError, CgroupLimits};
use crate::config::Config;
use crate::fd;
use crate::sandbox::plan::Shape;
use crate::sandbox::runtime::{ClaimOrder, SandboxEvent, SandboxKey, Sandboxes};

/// After a host fails or ends, wait this long before starting another.
pub const HOST_RETRY: Duration = Duration::from_secs(1);
/// Shells are kept started while bash runs have come this recently: a
/// shell a Python run gets is wasted.
const SHELLS_FOR: Duration = Duration::from_secs(60);

/// A run child a host has handed over, with the cgroup it moved itself
/// into, if the host gave it one.
#[derive(Debug)]
pub struct Handed {
    /// The child's descriptors, non-blocking.
    pub ready: Ready,
    /// Its cgroup.
    pub cgroup: Option<RunCgroup>,
}

/// The exec hosts and the children they have made ready.
#[derive(Debug)]
pub struct Hosts {
    hosts: Slab<ExecHost>,
    next_host: HostId,
    /// Hosts kept running.
    wanted: usize,
    setup: ExecHostSetup,
    /// Each host's cgroup: room for its zygote and every prepared run.
    limits: CgroupLimits,
    log: PathBuf,
    /// Ready children, oldest first.
    ready: VecDeque<usize>,
    /// Ready children to keep with a shell started, while bash runs come.
    ready_shells: usize,
    /// When the last bash run came, if one has.
    last_bash: Option<Instant>,
    /// The kernel is stopping: no host starts, and none is asked for more.
    stopping: bool,
}

impl Hosts {
    /// `exec.hosts` hosts as configured (none if `available` is false),
    /// whose runs see the `tools` package in `tools_dir`.
    pub fn new(config: &Config, tools_dir: Option<PathBuf>, available: bool) -> Hosts {
        let exec = &config.exec;
        let share = exec.ready_runs as u64 + 1;
        Hosts {
            hosts: Slab::new(),
            next_host: 1,
            wanted: if available { exec.hosts } else { 0 },
            setup: ExecHostSetup {
                python: exec.python.clone(),
                ready_runs: exec.ready_runs,
                tmp_bytes: config.agents.tmp_bytes,
                workspace_bytes: config.agents.workspace_bytes,
                tools_dir,
            },
            limits: CgroupLimits {
                memory: exec.default_memory.saturating_mul(share),
                cpu_quota: None,
                cpu_period: 100_000,
                max_pids: exec.default_max_pids.saturating_mul(share),
            },
            log: config.agents.log_dir().join("exec-host.log"),
            ready: VecDeque::new(),
            ready_shells: exec.ready_shells,
            last_bash: None,
            stopping: false,
        }
    }

    /// How every host is set up.
    pub fn setup(&self) -> &ExecHostSetup {
        &self.setup
    }

    /// Asks the runtime for the hosts that are missing.
    pub fn start_missing(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        now: Instant,
        sources: &mut Sources,
        cgroups: Option<&RunCgroups>,
    ) {
        if self.stopping {
            return;
        }
        while self.hosts.len() < self.wanted {
            let id = self.next_host;
            self.next_host += 1;
            let key = self.hosts.insert(ExecHost::new(id));
            if let Some(sandbox) = sandboxes.acquire(id, Shape::EXEC_HOST, now) {
                self.claim(sandboxes, key, sandbox, sources, cgroups);
            }
        }
    }

    /// Takes in what happened to a host's sandbox; the key of a host that
    /// failed or ended, and is gone (its children go with it, and another
    /// is to start after [`HOST_RETRY`]).
    pub fn on_sandbox(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        event: SandboxEvent<HostId>,
        sources: &mut Sources,
        cgroups: Option<&RunCgroups>,
    ) -> Option<usize> {
        let Some(key) = self.key_of(*event.owner()) else {
            if let SandboxEvent::Ready { sandbox, .. } = event {
                sandboxes.discard(sandbox);
            }
            return None;
        };
        let id = self.hosts[key].id;
        match event {
            SandboxEvent::Ready { sandbox, .. } if self.stopping => {
                // Prepared while the kernel began to stop: never started.
                sandboxes.discard(sandbox);
                self.hosts.remove(key);
                return None;
            }
            SandboxEvent::Ready { sandbox, .. } => {
                self.claim(sandboxes, key, sandbox, sources, cgroups);
                return None;
            }
            SandboxEvent::Failed { error, .. } => log::error!("exec host {id}: {error}"),
            SandboxEvent::Status { status, .. } => {
                if let crate::sandbox::Status::Error { message, .. } = status {
                    log::error!("exec host {id}: {message}");
                }
                return None;
            }
            SandboxEvent::OomKill { .. } => {
                log::warn!("exec host {id}: the memory limit killed a process");
                return None;
            }
            SandboxEvent::Ended { .. } if self.stopping => log::info!("exec host {id} stopped"),
            SandboxEvent::Ended { init, .. } => log::warn!("exec host {id} ended: {init:?}"),
        }
        let host = self.hosts.remove(key);
        if let Some((channel, token)) = host.channel {
            sources.forget(channel.as_raw_fd(), token);
        }
        if let Some(cgroups) = cgroups {
            host.cgroups.into_values().for_each(|c| cgroups.recycle(c));
        }
        Some(key)
    }

    fn key_of(&self, id: HostId) -> Option<usize> {
        self.hosts
            .iter()
            .find(|(_, host)| host.id == id)
            .map(|(key, _)| key)
    }

    /// Starts the zygote in a host's sandbox, with a channel to it.
    fn claim(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        key: usize,
        sandbox: SandboxKey,
        sources: &mut Sources,
        cgroups: Option<&RunCgroups>,
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
            limits: self.limits,
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
        let token = match sources.register(
            ours.as_raw_fd(),
            ExecSource::Channel(key),
            Interest::READABLE,
        ) {
            Ok(token) => token,
            Err(err) => {
                log::error!("exec host {id}: cannot watch its channel: {err}");
                return sandboxes.signal(sandbox, libc::SIGKILL);
            }
        };
        self.hosts[key].channel = Some((ours, token));
        self.ask_for_children(key, cgroups);
        log::info!("exec host {id} starting");
    }

    /// The next run child host `key` has handed over, if it has (how long
    /// it took to come is counted).
    pub fn receive(&mut self, key: usize, counts: &mut ExecCounts, now: Instant) -> Option<Handed> {
        loop {
            let host = self.hosts.get_mut(key)?;
            let (channel, _) = host.channel.as_ref()?;
            let ready = match wire::receive_ready(channel.as_fd()) {
                Ok(Some(ready)) => ready,
                Ok(None) => return None,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return None,
                Err(err) => {
                    log::warn!("exec host: {err}");
                    return None;
                }
            };
            if let Some(asked) = host.asked.pop_front() {
                counts.refilled(now.saturating_duration_since(asked));
            }
            let cgroup = host.cgroups.remove(&ready.cgroup);
            // The pipes are made non-blocking as they are watched.
            if let Err(err) = fd::set_nonblocking(&ready.socket) {
                log::warn!("exec host: cannot use a run child: {err}");
                continue;
            }
            return Some(Handed { ready, cgroup });
        }
    }

    /// Asks a host for run children until `exec.ready_runs` count: each
    /// comes with a cgroup of its own (made first, in the background) or
    /// none. Asking after a run has ended, not when it starts, keeps the
    /// preparing off the run's way.
    fn ask_for_children(&mut self, key: usize, cgroups: Option<&RunCgroups>) {
        if self.stopping {
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
            match cgroups {
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
    pub fn child_taken(&mut self, key: usize, cgroups: Option<&RunCgroups>) {
        if let Some(host) = self.hosts.get_mut(key) {
            host.requested = host.requested.saturating_sub(1);
        }
        self.ask_for_children(key, cgroups);
    }

    /// Sends a cgroup made for a host's next run child (or says there is
    /// none, so the child goes without).
    pub fn cgroup_made(
        &mut self,
        host: HostId,
        result: Result<RunCgroup, CgroupError>,
        cgroups: &RunCgroups,
    ) {
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

    /// A bash run came.
    pub fn bash_came(&mut self, now: Instant) {
        self.last_bash = Some(now);
    }

    /// Whether a child becoming ready should start a shell: bash runs have
    /// come lately, and too few ready children have one.
    pub fn wants_shell(&self, children: &Children, now: Instant) -> bool {
        let shells = self
            .ready
            .iter()
            .filter(|c| children.has_shell(**c))
            .count();
        let bash_lately = self
            .last_bash
            .is_some_and(|at| now.saturating_duration_since(at) < SHELLS_FOR);
        bash_lately && shells < self.ready_shells
    }

    /// A child is ready for code.
    pub fn push_ready(&mut self, child: usize) {
        self.ready.push_back(child);
    }

    /// Whether any child may be ready.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Children prepared and waiting for code.
    pub fn ready_count(&self) -> usize {
        self.ready.len()
    }

    /// The ready child for a request: the oldest of those with a shell
    /// started for a bash run, of those without for anything else — or
    /// the oldest of all.
    pub fn take_ready(&mut self, bash: bool, children: &Children) -> Option<usize> {
        self.ready.retain(|c| children.is_ready(*c));
        let index = self
            .ready
            .iter()
            .position(|c| children.has_shell(*c) == bash)
            .unwrap_or(0);
        self.ready.remove(index)
    }

    /// A child is no longer ready (it has gone).
    pub fn forget_ready(&mut self, child: usize) {
        self.ready.retain(|c| *c != child);
    }

    /// Every ready child, taken.
    pub fn take_all_ready(&mut self) -> Vec<usize> {
        self.ready.drain(..).collect()
    }

    /// Has each host's zygote import the `tools` package again.
    pub fn reload_tools(&self) {
        for (_, host) in &self.hosts {
            if let Some((channel, _)) = &host.channel {
                if let Err(err) = wire::send_reload_tools(channel.as_fd()) {
                    log::debug!("exec host {}: cannot tell it of new tools: {err}", host.id);
                }
            }
        }
    }

    /// Whether any host has its zygote started.
    pub fn any_up(&self) -> bool {
        self.hosts.iter().any(|(_, host)| host.channel.is_some())
    }

    /// Stops every host: none starts again, and those running are killed.
    pub fn stop(&mut self, sandboxes: &mut impl Sandboxes<HostId>) {
        self.stopping = true;
        for (_, host) in self.hosts.iter() {
            if let Some(sandbox) = host.sandbox {
                sandboxes.signal(sandbox, libc::SIGKILL);
            }
        }
    }

    /// The cgroups sent to hosts and not yet taken, taken (shutdown).
    pub fn take_cgroups(&mut self) -> Vec<RunCgroup> {
        self.hosts
            .iter_mut()
            .flat_map(|(_, host)| host.cgroups.drain().map(|(_, c)| c))
            .collect()
    }
}
