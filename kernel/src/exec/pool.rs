//! The pool of run children: the exec hosts that make them (`hosts`), the
//! children the kernel holds (`children`), their descriptors as EXEC's
//! tokens (`sources`), runs' own kernel connections (`connections`), and
//! what runs and children come to for the metrics (`counts`).
//! A child comes from its host, is prepared when it has sent its pidfd,
//! waits ready, is sent an order ([`Pool::launch`]), and goes when its run
//! is over (or is kept for a session). What waits for a child, and whose
//! turn it is, is not the pool's concern: the dispatcher asks it for a
//! ready child and tells it what to send.

use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agentos_proto::{ErrorCode, ErrorReply};
use mio::{Registry, Token};

use super::children::{Children, Done, Heard};
use super::connections::RunConnections;
use super::counts::ExecCounts;
use super::disks::TemplateUse;
use super::exec_cgroups::ExecCgroups;
use super::exec_host::HostId;
use super::hosts::Hosts;
use super::network::RunNetwork;
use super::order::{Kill, Order, OrderCaps, OrderOf, Running};
use super::queues::Share;
use super::run_cgroup::RunCgroup;
use super::sources::{ExecSource, Sources};
use super::spans::RunSpans;
use super::waiting::Waiting;
use super::zygote::ExecHostSetup;
use crate::address::Adopted;
use crate::cgroup::CgroupError;
use crate::config::Config;
use crate::sandbox::runtime::{SandboxEvent, Sandboxes};

/// What one of EXEC's tokens brought, for the dispatcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Nothing to act on.
    Nothing,
    /// A host has children to hand over ([`Pool::take_child`]).
    Host(usize),
    /// A child is ready for code.
    Ready,
    /// A child has gone; a session it held ends with it.
    Gone(usize),
    /// A child's order moved on: it may have finished.
    Progress(usize),
    /// A session's child is ready for the session's next order.
    Renewed(usize),
}

/// What goes out with an order besides the child's own: the proxy for its
/// endpoint, the cgroups inside agents' for an agent's first order, and
/// what every order is held to.
#[derive(Debug)]
pub struct Launch<'a> {
    /// Serves the run's network policy, if it has one.
    pub network: &'a RunNetwork,
    /// Has the cgroup an agent's run moves into.
    pub cgroups: &'a mut ExecCgroups,
    /// What every order is held to.
    pub caps: &'a OrderCaps,
}

/// An order sent (or on its way: the child's socket takes the rest).
#[derive(Clone, Copy, Debug)]
pub struct Launched {
    /// The share of EXEC it holds until it ends, if it holds one.
    pub holds: Option<Share>,
    /// Its wall-clock limit, from now.
    pub timeout: Duration,
}

/// The exec hosts and the run children they make.
#[derive(Debug)]
pub struct Pool {
    sources: Sources,
    hosts: Hosts,
    children: Children,
    connections: RunConnections,
    /// What the metrics say of EXEC's runs and children.
    counts: ExecCounts,
}

impl Pool {
    /// `exec.hosts` hosts as configured (none if EXEC is not `available`),
    /// not started yet; their descriptors are registered with `registry`
    /// from `token_base` on.
    pub fn new(
        config: &Config,
        registry: &Registry,
        token_base: usize,
        tools_dir: Option<PathBuf>,
        available: bool,
    ) -> io::Result<Pool> {
        Ok(Pool {
            sources: Sources::new(registry, token_base)?,
            hosts: Hosts::new(config, tools_dir, available),
            children: Children::default(),
            connections: RunConnections::default(),
            counts: ExecCounts::default(),
        })
    }

    /// How every host is set up.
    pub fn setup(&self) -> &ExecHostSetup {
        self.hosts.setup()
    }

    /// The children held.
    pub fn children(&self) -> &Children {
        &self.children
    }

    /// The children held, to kill or count what their runs do.
    pub fn children_mut(&mut self) -> &mut Children {
        &mut self.children
    }

    /// Adds what EXEC's runs and children came to to the kernel's metrics.
    pub fn add_metrics(&self, snapshot: &mut crate::telemetry::metrics::Snapshot) {
        self.counts.add_to(snapshot);
    }

    /// Children prepared and waiting for code.
    pub fn ready_count(&self) -> usize {
        self.hosts.ready_count()
    }

    /// Whether any host has its zygote started.
    pub fn any_up(&self) -> bool {
        self.hosts.any_up()
    }

    /// A bash run came: ready children keep shells started for a while.
    pub fn bash_came(&mut self, now: Instant) {
        self.hosts.bash_came(now);
    }

    /// Runs' connections to the kernel made since the last call.
    pub fn take_adopted(&mut self) -> Vec<Adopted> {
        self.connections.take()
    }

    /// Whether runs' connections wait for the reactor.
    pub fn has_adopted(&self) -> bool {
        self.connections.waiting()
    }

    /// Asks the runtime for the hosts that are missing.
    pub fn start_hosts(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        now: Instant,
        cgroups: &ExecCgroups,
    ) {
        self.hosts
            .start_missing(sandboxes, now, &mut self.sources, cgroups.thread());
    }

    /// Takes in what happened to a host's sandbox; whether a host failed
    /// or ended (its children go with it, and another is to start).
    pub fn on_sandbox(
        &mut self,
        sandboxes: &mut impl Sandboxes<HostId>,
        event: SandboxEvent<HostId>,
        cgroups: &ExecCgroups,
    ) -> bool {
        let gone = self
            .hosts
            .on_sandbox(sandboxes, event, &mut self.sources, cgroups.thread());
        if let Some(host) = gone {
            self.children.uncount_host(host);
        }
        gone.is_some()
    }

    /// Takes in the readiness of one of EXEC's tokens.
    pub fn on_event(&mut self, token: Token, cgroups: &ExecCgroups, now: Instant) -> Event {
        let Some(source) = self.sources.get(token) else {
            return Event::Nothing;
        };
        match source {
            ExecSource::Channel(host) => Event::Host(host),
            ExecSource::Socket(child) => match self.children.on_socket(child, &self.sources) {
                Heard::Nothing => Event::Nothing,
                Heard::Pidfd if self.child_ready(child, cgroups, now) => Event::Ready,
                Heard::Pidfd => Event::Nothing,
                Heard::Unusable => {
                    self.drop_child(child, cgroups);
                    Event::Nothing
                }
                Heard::Gone => Event::Gone(child),
                Heard::Progress => Event::Progress(child),
                Heard::Renewed => Event::Renewed(child),
            },
            ExecSource::Output(child, stream) => {
                if self.children.read_output(child, stream, &mut self.sources) {
                    Event::Progress(child)
                } else {
                    Event::Nothing
                }
            }
        }
    }

    /// Takes in the next child `host` has handed over, if it has: whether
    /// it is ready for code already.
    pub fn take_child(&mut self, host: usize, cgroups: &ExecCgroups, now: Instant) -> Option<bool> {
        let handed = self.hosts.receive(host, &mut self.counts, now)?;
        let (child, watched) =
            self.children
                .take_in(host, handed.ready, handed.cgroup, &mut self.sources);
        Some(match watched {
            Ok(true) => self.child_ready(child, cgroups, now),
            Ok(false) => false,
            Err(err) => {
                log::warn!("exec host: cannot watch a run child: {err}");
                self.drop_child(child, cgroups);
                false
            }
        })
    }

    /// A child has sent its pidfd: it gets its first run's own kernel
    /// connection now — and a shell with it, if bash runs have come lately
    /// and too few ready children have one — then waits for an order.
    /// Whether it is ready.
    fn child_ready(&mut self, child: usize, cgroups: &ExecCgroups, now: Instant) -> bool {
        let shell = self.hosts.wants_shell(&self.children, now);
        if let Err(err) = self.children.prepare(child, shell) {
            log::warn!("exec host: cannot prepare a run child: {err}");
            self.children.kill_quietly(child);
            self.drop_child(child, cgroups);
            return false;
        }
        self.hosts.push_ready(child);
        true
    }

    /// Whether any child may be ready.
    pub fn has_ready(&self) -> bool {
        self.hosts.has_ready()
    }

    /// The ready child for an order (one with a shell for a `bash` run).
    pub fn take_ready(&mut self, bash: bool) -> Option<usize> {
        self.hosts.take_ready(bash, &self.children)
    }

    /// Sends `waiting`'s order to `child`, if the child is still held.
    /// An agent's first order moves the child into a cgroup inside the
    /// agent's; a run gets its endpoint and its own kernel connection. If
    /// the order cannot be given, nothing of it has run, the child has
    /// ended unused, and the error is the reply.
    pub fn launch(
        &mut self,
        child: usize,
        mut waiting: Waiting,
        with: Launch<'_>,
        now: Instant,
    ) -> Option<Result<Launched, ErrorReply>> {
        let asked_limits = waiting.request.limits.is_some();
        let request = std::mem::take(&mut waiting.request);
        let keep = waiting.session.is_some();
        let template = matches!(waiting.template, Some(TemplateUse::Use(_)));
        let mut order =
            with.caps
                .wire_order(request, &waiting.order, keep, waiting.on_disk, template);
        let run = self.children.get_mut(child)?;
        let queued = now.saturating_duration_since(waiting.queued_at);
        self.counts.started(queued);
        // Any order uses up the child's shell, or has it stopped.
        run.shell = false;
        if let Some(mut span) = waiting.span.take() {
            // The run's code, and the tool calls it makes, join its span.
            order.trace = Some(RunSpans::started(&mut span, queued));
            run.span = Some(span);
        }
        if let Some(policy) = waiting.policy.clone() {
            let of = (waiting.owner, waiting.run, waiting.net_record.as_ref());
            match with.network.open_endpoint(run, of, policy) {
                Ok(env) => order.env.extend(env),
                Err(err) => {
                    // Without its endpoint the run would have no network at
                    // all: it is refused.
                    self.children.end_unused(child);
                    return Some(Err(ErrorReply::new(
                        ErrorCode::Unavailable,
                        format!(
                            "EXEC field `network`: the run's proxy endpoint cannot be made: {err}"
                        ),
                    )));
                }
            }
        }
        // The steward's processes reach the network as the session's runs
        // do, through its endpoint.
        if let (Order::Steward { .. }, Some(_)) = (&waiting.order, &run.endpoint) {
            order.env.extend(with.network.environment());
        }
        // The first order of an agent's work moves the child into a cgroup
        // inside the agent's, before anything else: from then on what it
        // uses counts against the agent's limits.
        let mut attached = Vec::new();
        if run.charged.is_none() {
            let to = waiting.charged_to.as_ref();
            if let Some(charged) = to.and_then(|to| with.cgroups.take_for(to)) {
                attached.extend(charged.join_files.iter().filter_map(|f| f.try_clone().ok()));
                order.join = attached.len();
                run.charge_to(charged);
            }
        }
        // A run gets its own kernel connection (the child may have it
        // already); a snapshot that saves globals, the memfd they go into.
        match (&mut waiting.order, waiting.run) {
            (Order::Run | Order::Open, Some(number)) => {
                let first = run.first_connection.take();
                attached.extend(self.connections.for_run(number, first));
            }
            (
                Order::Snapshot {
                    state: Some(state), ..
                },
                _,
            ) => match state.try_clone() {
                Ok(state) => attached.push(state),
                Err(err) => {
                    // Without it the globals would go unsaved, unsaid.
                    self.children.end_unused(child);
                    let why = format!("cannot hand the interpreter its globals' memfd: {err}");
                    return Some(Err(ErrorReply::new(ErrorCode::Internal, why)));
                }
            },
            (Order::Steward { socket }, _) => attached.extend(socket.take()),
            (
                Order::Run
                | Order::Open
                | Order::Snapshot { .. }
                | Order::Restore { .. }
                | Order::Wake,
                _,
            ) => {}
        }
        // A fresh interpreter's globals come last.
        if let Some(state) = waiting.load_state.take() {
            attached.push(state);
            order.load_state = true;
        }
        if let Err(err) = run.limit(&waiting.limits, asked_limits) {
            // Nothing of the run has started, but its limits are in doubt.
            self.children.end_unused(child);
            return Some(Err(ErrorReply::new(
                ErrorCode::BadRequest,
                format!(
                    "EXEC field `limits`: they cannot be given to the run: {err} (a memory \
                     limit must leave room for the interpreter)"
                ),
            )));
        }
        let holds = waiting.holds_share().then_some(waiting.share);
        let of = OrderOf {
            run: waiting.run,
            owner: waiting.owner,
            holds,
        };
        let session = waiting.session.map(|(_, name)| name);
        let (reply_to, timeout, output) =
            (waiting.reply_to, waiting.timeout, with.caps.output_bytes);
        let running = Running::new(of, reply_to, waiting.order, timeout, output, session, now);
        let unsent = run.start(&order, running, attached).unwrap_or_else(|err| {
            log::debug!("exec run: cannot send the order: {err}");
            run.kill(Kill::Unsent);
            false
        });
        self.children.watch_writable(child, unsent, &self.sources);
        Some(Ok(Launched { holds, timeout }))
    }

    /// The reply of a child's order, if it has finished (counted, if it
    /// ran code), and whether the child lives on.
    pub fn finish(&mut self, child: usize, now: Instant) -> Option<Done> {
        let done = self.children.finish(child, now)?;
        if let Order::Run | Order::Open = done.finished.order {
            self.counts.ended(&done.finished.reply);
        }
        Some(done)
    }

    /// A session keeps `child` after its first order: it no longer counts
    /// among its host's prepared children (the host prepares another), and
    /// its next run's pipes are watched.
    pub fn keep(&mut self, child: usize, cgroups: &ExecCgroups) -> io::Result<()> {
        if let Some(host) = self.children.uncount(child) {
            self.hosts.child_taken(host, cgroups.thread());
        }
        self.children.watch_outputs(child, &mut self.sources)
    }

    /// A session's child has handed over its next run's pipes: they are
    /// watched.
    pub fn renew(&mut self, child: usize) -> io::Result<()> {
        self.children.watch_outputs(child, &mut self.sources)
    }

    /// Lets a child go: its host is asked for another if it counted, its
    /// cgroups are recycled. The share its run held, if it held one.
    pub fn drop_child(&mut self, child: usize, cgroups: &ExecCgroups) -> Option<Share> {
        let mut run = self.children.remove(child, &mut self.sources)?;
        if run.counted {
            self.hosts.child_taken(run.host, cgroups.thread());
        }
        cgroups.recycle(run.cgroups());
        self.hosts.forget_ready(child);
        run.holds()
    }

    /// The `tools` package has changed: each host's zygote imports it
    /// again, and the children it prepared with the old one are replaced
    /// (sessions keep theirs).
    pub fn tools_changed(&mut self, cgroups: &ExecCgroups) {
        self.hosts.reload_tools();
        for child in self.hosts.take_all_ready() {
            self.children.kill_quietly(child);
            self.drop_child(child, cgroups);
        }
    }

    /// Sends a cgroup made for a host's next run child (or says there is
    /// none).
    pub fn cgroup_made(
        &mut self,
        host: HostId,
        result: Result<RunCgroup, CgroupError>,
        cgroups: &ExecCgroups,
    ) {
        if let Some(thread) = cgroups.thread() {
            self.hosts.cgroup_made(host, result, thread);
        }
    }

    /// Stops every host: running orders are killed (their replies still
    /// go out), hosts too, and none starts again.
    pub fn stop(&mut self, sandboxes: &mut impl Sandboxes<HostId>) {
        self.children.kill_running(|_| true, Kill::Shutdown);
        self.hosts.stop(sandboxes);
    }

    /// Every cgroup the hosts and children hold, taken (shutdown).
    pub fn take_cgroups(&mut self) -> Vec<RunCgroup> {
        let mut taken = self.hosts.take_cgroups();
        taken.extend(self.children.take_cgroups());
        taken
    }
}
