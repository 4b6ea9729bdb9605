//! The fleet thread: the one place this node talks to the fleet's
//! database. It keeps the node's lease, reconnects when the database comes
//! back, and runs the jobs the rest of the kernel sends it, one at a time.
//! The reactor never waits on it; workers do, for a bounded time.

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use postgres::Client;

use super::database;
use super::error::FleetError;
use super::nodes::{self, Figures, Registration};
use super::schema;
use crate::config::fleet::FleetConfig;

/// A job for the fleet thread: given the database, or why there is none.
pub type Job = Box<dyn FnOnce(Result<&mut Client, FleetError>) + Send>;

/// What the fleet thread shares with the rest of the kernel.
#[derive(Debug, Default)]
pub struct Status {
    /// When the lease was last renewed (or taken): the node is in the
    /// fleet until a lease's length after it.
    pub renewed: Option<Instant>,
    /// Whether the fleet told this node to take no new work.
    pub draining: bool,
    /// The figures the next renewal reports.
    pub figures: Figures,
    /// Why the node is not in the fleet now, if it is not.
    pub trouble: Option<String>,
}

/// The fleet thread's own state.
pub struct Member {
    config: FleetConfig,
    me: Registration,
    client: Option<Client>,
    status: Arc<Mutex<Status>>,
    /// When connecting was last tried: at most once a second.
    last_attempt: Option<Instant>,
}

/// Reconnection is tried at most this often.
const RETRY: Duration = Duration::from_secs(1);

impl Member {
    /// A member for `config`, not yet connected.
    pub fn new(config: FleetConfig, me: Registration, status: Arc<Mutex<Status>>) -> Member {
        Member {
            config,
            me,
            client: None,
            status,
            last_attempt: None,
        }
    }

    /// Connects, migrates and registers: the node's first join, whose
    /// outcome decides whether the kernel starts.
    pub fn join(&mut self) -> Result<(), FleetError> {
        self.last_attempt = Some(Instant::now());
        let mut client = database::connect(&self.config, &self.me.node)?;
        schema::migrate(&mut client)?;
        nodes::register(&mut client, &self.me)?;
        self.client = Some(client);
        self.renewed(false);
        Ok(())
    }

    /// Serves jobs and renews the lease until the kernel drops its end of
    /// `jobs`; then gives the lease up.
    pub fn run(mut self, jobs: Receiver<Job>) {
        let mut next_renewal = Instant::now() + self.me.lease / 3;
        loop {
            let wait = next_renewal.saturating_duration_since(Instant::now());
            match jobs.recv_timeout(wait) {
                Ok(job) => job(self.client()),
                Err(RecvTimeoutError::Timeout) => {
                    let renewed = self.renew();
                    let every = if renewed { self.me.lease / 3 } else { RETRY };
                    next_renewal = Instant::now() + every;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if self.client.as_ref().is_some_and(Client::is_closed) {
                self.lost("the connection to the fleet's database closed".into());
            }
        }
        if let Some(client) = self.client.as_mut() {
            if let Err(err) = nodes::release(client, &self.me) {
                log::warn!(
                    "fleet: could not give up node {:?}'s lease: {err}",
                    self.me.node
                );
            }
        }
    }

    /// The database, connecting again if the last try was long enough ago.
    fn client(&mut self) -> Result<&mut Client, FleetError> {
        if self.client.is_none() {
            self.reconnect()?;
        }
        self.client
            .as_mut()
            .ok_or_else(|| FleetError::Unavailable("not connected".into()))
    }

    fn reconnect(&mut self) -> Result<(), FleetError> {
        if self.last_attempt.is_some_and(|at| at.elapsed() < RETRY) {
            return Err(self.trouble());
        }
        self.last_attempt = Some(Instant::now());
        let connected = database::connect(&self.config, &self.me.node).and_then(|mut client| {
            schema::migrate(&mut client)?;
            // Back after a cut: the lease is this incarnation's again if no
            // other node took the name meanwhile.
            nodes::register(&mut client, &self.me)?;
            Ok(client)
        });
        match connected {
            Ok(client) => {
                log::info!(
                    "fleet: node {:?} is in the fleet at {}",
                    self.me.node,
                    self.url()
                );
                self.client = Some(client);
                self.renewed(false);
                Ok(())
            }
            Err(err) => {
                self.lost(err.reason());
                Err(err)
            }
        }
    }

    /// Renews the lease; whether it was.
    fn renew(&mut self) -> bool {
        let figures = self.status().figures;
        let figures = Figures {
            load: host_load(),
            ..figures
        };
        let me = self.me.clone();
        let renewed = self
            .client()
            .and_then(|client| nodes::renew(client, &me, figures));
        match renewed {
            Ok(draining) => {
                self.renewed(draining);
                true
            }
            Err(err) => {
                log::warn!(
                    "fleet: node {:?} could not renew its lease: {err}",
                    self.me.node
                );
                self.lost(err.reason());
                false
            }
        }
    }

    fn renewed(&self, draining: bool) {
        let mut status = self.status();
        status.renewed = Some(Instant::now());
        status.draining = draining;
        status.trouble = None;
    }

    /// The connection is gone (or the name is): dropped, so the next use
    /// connects again.
    fn lost(&mut self, why: String) {
        if self.client.take().is_some() {
            log::warn!(
                "fleet: node {:?} lost the fleet's database at {}: {why}",
                self.me.node,
                self.url()
            );
        }
        self.status().trouble = Some(why);
    }

    /// The database's URL, its password hidden.
    fn url(&self) -> String {
        self.config
            .database
            .as_ref()
            .map_or_else(String::new, ToString::to_string)
    }

    fn trouble(&self) -> FleetError {
        let why = self.status().trouble.clone();
        FleetError::Unavailable(why.unwrap_or_else(|| "not connected".into()))
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sends `job` to the fleet thread without waiting: a full queue (a
/// database that answers slowly) refuses more.
pub fn send(jobs: &SyncSender<Job>, job: Job) -> Result<(), FleetError> {
    jobs.try_send(job).map_err(|_| {
        FleetError::Unavailable("the fleet's database is not keeping up (its queue is full)".into())
    })
}

/// The host's one-minute load average, 0 when it cannot be read.
fn host_load() -> f32 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}
