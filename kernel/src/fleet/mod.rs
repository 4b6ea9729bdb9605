//! The fleet: nodes sharing one PostgreSQL database (docs/fleet.md).
//!
//! Without `[fleet] database` a node is alone and nothing here runs. With
//! it, a thread of the fleet's own ([`member`]) holds the node's lease and
//! does all of its talking to the database; the kernel gives it orders
//! through [`Fleet`] without waiting, and its answers come back as
//! events, with a wake.

mod allowances;
mod contents;
mod database;
pub mod error;
pub mod kept;
mod listener;
mod member;
pub mod nodes;
mod notes;
pub mod owners;
pub mod schema;
pub mod sessions;
pub mod tasks;
mod transfers;
mod waits;

use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentos_primitives::pool::Outbox;
use agentos_primitives::threads;
use mio::Waker;
use postgres::Client;

use crate::address::{Answer, ReplyTo};
use crate::config::fleet::FleetConfig;
use crate::permissions::allowance::LeaseAsk;
use crate::random;
use crate::telemetry::metrics::Snapshot;
pub use error::FleetError;
pub use member::FleetEvent;
use member::{End, Member, Order, Status};
use nodes::{Figures, Registration};
use notes::Notes;
pub use waits::Wait;

/// Jobs that may wait for the fleet thread; more are refused.
const MAX_QUEUED_JOBS: usize = 64;

/// This node's part in a fleet, if it has joined one.
#[derive(Debug, Default)]
pub struct Fleet {
    link: Option<FleetLink>,
    /// What the fleet thread has for the kernel.
    events: Option<Receiver<FleetEvent>>,
    /// Once the kernel is stopping: where the fleet thread says it has
    /// given the lease up.
    leaving: Option<Receiver<()>>,
    /// The fleet's hibernated sessions, and runs waiting for theirs.
    pub kept: kept::KeptSessions,
}

/// What reaches the fleet thread: cloned into workers.
#[derive(Clone)]
pub struct FleetLink {
    node: Arc<str>,
    lease: Duration,
    orders: SyncSender<Order>,
    /// The ends of tasks this node ran, for the fleet thread to record.
    ends: Sender<End>,
    notes: Arc<Notes>,
    status: Arc<Mutex<Status>>,
    /// Hibernated sessions' moves, for the transfers' thread.
    transfers: SyncSender<sessions::SessionJob>,
}

impl std::fmt::Debug for FleetLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetLink")
            .field("node", &self.node)
            .finish()
    }
}

impl Fleet {
    /// Joins the fleet `config` names, if any: connects, migrates the
    /// schema and takes this node's name. A refusal (a live node of the
    /// same name, a schema this node cannot read) stops the kernel; a
    /// database out of reach does not: the node serves alone and joins
    /// when it answers.
    pub fn join(config: &FleetConfig, waker: Arc<Waker>) -> Result<Fleet, FleetError> {
        let Some(url) = &config.database else {
            return Ok(Fleet::default());
        };
        let mut incarnation = [0u8; 8];
        random::fill(&mut incarnation)
            .map_err(|err| FleetError::Unavailable(format!("no random numbers: {err}")))?;
        let me = Registration {
            node: config.node_name(),
            incarnation: i64::from_ne_bytes(incarnation),
            advertise: config.advertise.clone(),
            advertise_mcp: config.advertise_mcp.clone(),
            lease: Duration::from_millis(config.lease_ms),
        };
        let status = Arc::new(Mutex::new(Status::default()));
        let (orders, queue) = mpsc::sync_channel(MAX_QUEUED_JOBS);
        let (ends, ended) = mpsc::channel();
        let (joined_tx, joined_rx) = mpsc::sync_channel(1);
        let (outbox, events) = Outbox::channel(waker);
        let transfers_outbox = outbox.clone();
        let notes = Arc::new(Notes::default());
        let mut member = Member::new(
            config.clone(),
            me.clone(),
            Arc::clone(&status),
            outbox,
            Arc::clone(&notes),
        );
        let cannot_start =
            |err: std::io::Error| FleetError::Unavailable(format!("cannot start a thread: {err}"));
        let listening = (
            config.clone(),
            me.node.clone(),
            orders.clone(),
            Arc::clone(&notes),
        );
        threads::spawn("fleet", move || {
            let joined = member.join();
            let refused = joined.as_ref().is_err_and(FleetError::is_refusal);
            let _ = joined_tx.send(joined);
            if !refused {
                member.run(queue, ended);
            }
        })
        .map_err(cannot_start)?;
        let joined = joined_rx
            .recv()
            .unwrap_or_else(|_| Err(FleetError::Unavailable("the fleet thread ended".into())));
        match joined {
            Ok(()) => log::info!("fleet: node {:?} joined the fleet at {url}", me.node),
            Err(err) if err.is_refusal() => return Err(err),
            Err(err) => {
                log::warn!(
                    "fleet: node {:?} starts alone and joins the fleet at {url} when it can: {err}",
                    me.node
                );
                status
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .trouble = Some(err.reason());
            }
        }
        threads::spawn("fleet-listen", move || {
            let (config, node, orders, notes) = listening;
            listener::listen(&config, &node, &notes, &orders);
        })
        .map_err(cannot_start)?;
        let (transfers, jobs) = mpsc::sync_channel(MAX_QUEUED_JOBS);
        let moving = (config.clone(), me.node.clone(), transfers_outbox);
        threads::spawn("fleet-transfers", move || {
            let (config, node, events) = moving;
            transfers::serve(&config, &node, jobs, events);
        })
        .map_err(cannot_start)?;
        Ok(Fleet {
            link: Some(FleetLink {
                node: me.node.into(),
                lease: me.lease,
                orders,
                ends,
                notes,
                status,
                transfers,
            }),
            events: Some(events),
            leaving: None,
            kept: kept::KeptSessions::default(),
        })
    }

    /// The kernel is stopping: the node claims nothing more and gives its
    /// lease up, so the fleet takes its tasks back at once. Never blocks;
    /// dropping the fleet waits (a second at most) for the lease to go.
    pub fn leave(&mut self) {
        let Some(link) = &self.link else {
            return;
        };
        let (left, gone) = mpsc::sync_channel(1);
        if link.orders.try_send(Order::Leave(left)).is_ok() {
            self.leaving = Some(gone);
        }
    }

    /// What the fleet thread has for the kernel now.
    pub fn take_events(&self) -> Vec<FleetEvent> {
        self.events
            .as_ref()
            .map(|events| events.try_iter().collect())
            .unwrap_or_default()
    }

    /// The link to the fleet thread, or why there is none.
    pub fn link(&self) -> Result<&FleetLink, FleetError> {
        self.link.as_ref().ok_or(FleetError::NotConfigured)
    }

    /// Whether the node is in the fleet now: its lease is current.
    pub fn is_joined(&self) -> bool {
        self.link.as_ref().is_some_and(FleetLink::is_joined)
    }

    /// The fleet's gauges, and every series labelled with this node's name.
    pub fn add_metrics(&self, snapshot: &mut Snapshot) {
        let Some(link) = &self.link else {
            return;
        };
        snapshot.label_every_series("node", link.node());
        let node = link.node();
        let joined = i64::from(link.is_joined());
        let status = link.status();
        snapshot.gauge(
            "agentos_fleet_joined",
            "Whether this node is in its fleet now (1) or not (0).",
            &[("node", node)],
            joined,
        );
        let nodes = "The fleet's nodes at this node's last renewal, by state.";
        let (live, dead) = status.nodes;
        snapshot.gauge(
            "agentos_fleet_nodes",
            nodes,
            &[("state", "live"), ("node", node)],
            live,
        );
        snapshot.gauge(
            "agentos_fleet_nodes",
            nodes,
            &[("state", "dead"), ("node", node)],
            dead,
        );
        snapshot.gauge(
            "agentos_fleet_tasks_held",
            "The fleet's tasks this node runs, at its last renewal.",
            &[("node", node)],
            status.held as i64,
        );
    }

    /// Tells the fleet thread what the next renewal reports.
    pub fn set_figures(&self, agents: usize, runs: usize) {
        if let Some(link) = &self.link {
            let mut status = link.status();
            status.figures = Figures {
                agents: u32::try_from(agents).unwrap_or(u32::MAX),
                runs: u32::try_from(runs).unwrap_or(u32::MAX),
                load: status.figures.load,
            };
        }
    }
}

impl Drop for Fleet {
    /// The kernel is gone: its lease is given up before the process ends.
    fn drop(&mut self) {
        if let Some(gone) = self.leaving.take() {
            let _ = gone.recv_timeout(Duration::from_secs(1));
        }
    }
}

impl FleetLink {
    /// This node's name in the fleet.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Whether the lease is current by this node's clock.
    pub fn is_joined(&self) -> bool {
        self.status().in_fleet(self.lease)
    }

    /// Runs `work` on the fleet thread; its answer (or why there is none)
    /// goes to `reply_to` through the kernel. Never blocks.
    pub fn ask(
        &self,
        reply_to: ReplyTo,
        work: impl FnOnce(&mut Client) -> Result<Answer, FleetError> + Send + 'static,
    ) -> Result<(), FleetError> {
        member::send(&self.orders, Order::Ask(reply_to, Box::new(work)))
    }

    /// Asks the ledger for more of a principal's THINK quota; the grant
    /// comes back as [`FleetEvent::Leased`].
    pub fn lease(&self, ask: LeaseAsk) -> Result<(), FleetError> {
        member::send(&self.orders, Order::Lease(ask))
    }

    /// Sends `job` to the transfers' thread; its news comes back as
    /// [`FleetEvent::Session`]. Never blocks: a full queue refuses it.
    pub fn session(&self, job: sessions::SessionJob) -> Result<(), FleetError> {
        self.transfers.try_send(job).map_err(|_| {
            FleetError::Unavailable("the fleet's store of sessions is not keeping up".into())
        })
    }

    /// Holds `wait` until its task ends or its time is up.
    pub fn wait(&self, wait: Wait) -> Result<(), FleetError> {
        member::send(&self.orders, Order::Wait(wait))
    }

    /// A task this node ran has ended: its end is recorded, if it is
    /// still this node's to record.
    pub fn finished(
        &self,
        task_id: String,
        state: agentos_proto::payload::TaskState,
        result: Arc<Vec<u8>>,
    ) {
        // Never dropped: there are at most as many as the tasks this node
        // holds. The wake may be, when the queue is full: the fleet thread
        // is busy, and takes every end at its next turn.
        let _ = self.ends.send(End {
            task_id,
            state,
            result,
        });
        member::wake(&self.notes, &self.orders, "queued");
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
