//! An endpoint as the proxy serves it: the listener inside the sandbox's
//! network namespace, the policy in force, the record its connections go
//! to, how many of them are open, and its log lines' budget. Everything
//! the proxy writes about an endpoint's connections, to its record and to
//! the log, is written here.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use mio::net::TcpListener;
use mio::Registry;

use super::connection::{Conn, End};
use super::log_budget::LogBudget;
use crate::policy::Policy;
use crate::record::{lock, Attempt, Record};

/// One endpoint, served.
#[derive(Debug)]
pub struct Served {
    /// Names it in the log (`agent worker1`, `run 17 of operator`).
    label: String,
    /// `None` once it is being forgotten: closed first, so that nothing
    /// connects while its connections close.
    listener: Option<TcpListener>,
    /// The listener's slot in the loop's listeners, which its token
    /// carries.
    listener_key: usize,
    policy: Policy,
    record: Arc<Mutex<Record>>,
    /// Its connections open or opening.
    open: usize,
    log: LogBudget,
}

impl Served {
    /// `listener`, registered in slot `listener_key`, served under
    /// `policy`, its connections written to `record`.
    pub fn new(
        label: String,
        listener: TcpListener,
        listener_key: usize,
        policy: Policy,
        record: Arc<Mutex<Record>>,
    ) -> Served {
        Served {
            label,
            listener: Some(listener),
            listener_key,
            policy,
            record,
            open: 0,
            log: LogBudget::default(),
        }
    }

    /// Its name in the log.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Puts `policy` in force (for connections decided from now on; the
    /// loop closes the open ones it refuses).
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    /// Where its connections come from, until it stops listening.
    pub fn listener(&self) -> Option<&TcpListener> {
        self.listener.as_ref()
    }

    /// Closes its listener: no connection comes in any more. Gives back the
    /// listener's slot.
    pub fn stop_listening(&mut self, registry: &Registry) -> usize {
        if let Some(mut listener) = self.listener.take() {
            let _ = registry.deregister(&mut listener);
        }
        self.listener_key
    }

    /// Its connections open or opening.
    pub fn open(&self) -> usize {
        self.open
    }

    /// One more connection of its is open.
    pub fn opened(&mut self) {
        self.open += 1;
    }

    /// A connection that was never let in after all (its socket could not
    /// be watched).
    pub fn not_opened(&mut self) {
        self.open = self.open.saturating_sub(1);
    }

    /// Records a refused attempt and logs it (within the budget).
    pub fn refused(&mut self, attempt: Attempt, reason: &str) {
        if self.log.allow(&self.label, Instant::now()) {
            let what = match (&attempt.host, &attempt.address) {
                // Refused before its head named anything.
                (host, _) if host.is_empty() => "a connection".to_owned(),
                (host, Some(address)) => format!("{host}:{} ({address})", attempt.port),
                (host, None) => format!("{host}:{}", attempt.port),
            };
            log::warn!("network: {} refused {what}: {reason}", self.label);
        }
        lock(&self.record).attempted(attempt);
    }

    /// Records an allowed attempt; its bytes and its end come later.
    pub fn allowed(&mut self, attempt: Attempt) {
        lock(&self.record).attempted(attempt);
    }

    /// A request inside connection `conn`'s intercepted tunnel was refused:
    /// the connection counts as refused, and the log says why.
    pub fn refused_in_tunnel(&mut self, conn: &Conn, reason: &str) {
        lock(&self.record).refused_after(conn.id, reason.to_owned());
        if self.log.allow(&self.label, Instant::now()) {
            let (host, port) = conn.target();
            log::warn!(
                "network: {} refused a request to {host}:{port}: {reason}",
                self.label
            );
        }
    }

    /// Connection `conn` has gone, as `end` says: it no longer counts as
    /// open and, if it was allowed, its bytes and end go to the record and
    /// the log.
    pub fn closed(&mut self, conn: &Conn, end: &End) {
        self.open = self.open.saturating_sub(1);
        if !conn.recorded {
            return;
        }
        let (out, inn) = conn.bytes();
        let duration_ms = conn.asked.elapsed().as_millis() as u64;
        {
            let mut record = lock(&self.record);
            record.finished(
                conn.id,
                out - conn.reported.0,
                inn - conn.reported.1,
                duration_ms,
            );
            match end {
                End::Closed => {}
                End::Failed(why) => record.ended(conn.id, why.clone()),
                End::Refused(why) => record.refused_after(conn.id, why.clone()),
            }
        }
        let (host, port) = conn.target();
        let address = conn.address.map_or_else(String::new, |a| a.to_string());
        match end {
            End::Refused(why) => {
                if self.log.allow(&self.label, Instant::now()) {
                    log::warn!(
                        "network: {} refused {host}:{port} ({address}): {why}",
                        self.label
                    );
                }
            }
            End::Closed | End::Failed(_) => {
                // Only lines that would be written count against the budget.
                if log::log_enabled!(log::Level::Info)
                    && self.log.allow(&self.label, Instant::now())
                {
                    let why = match end {
                        End::Failed(why) => format!(", {why}"),
                        _ => String::new(),
                    };
                    log::info!(
                        "network: {} {host}:{port} ({address}) {out} bytes out, {inn} in, {duration_ms} ms{why}",
                        self.label
                    );
                }
            }
        }
    }

    /// The bytes open connection `conn` has moved since they were last
    /// added go to the record now, so that it reads live counts.
    pub fn progress(&mut self, conn: &mut Conn) {
        let (out, inn) = conn.bytes();
        if (out, inn) == conn.reported {
            return;
        }
        let duration_ms = conn.asked.elapsed().as_millis() as u64;
        lock(&self.record).finished(
            conn.id,
            out - conn.reported.0,
            inn - conn.reported.1,
            duration_ms,
        );
        conn.reported = (out, inn);
    }

    /// Sums up in the log what its budget left out in a second now over.
    pub fn tick(&mut self, now: Instant) {
        self.log.tick(&self.label, now);
    }
}
