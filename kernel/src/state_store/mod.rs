//! The state store (STORE, FETCH, DELETE, KEYS): JSON values by key, in
//! the task store's SQLite database, so they outlive the kernel.
//!
//! Nothing here blocks the reactor. A request becomes a transaction that
//! is handed, in request order, to the task store's writer thread (one
//! writer: an owner's quota check and its write see no write between
//! them, and a FETCH after a STORE on one connection reads what it
//! stored), and a job for a worker that waits for its answer.
//!
//! Keys live in spaces (`space`): an agent's own, which end with it; an
//! operator's own, by uid, which last; and an operator's tree's, shared
//! by the operator and every agent in its tree. Every key counts against
//! its tree's operator's quota. Expired keys are never read, and are
//! removed as their owner stores, and every minute on the next request.

mod space;
mod sql;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use agentos_proto::payload::{KeyRequest, KeysRequest, StoreRequest};

use rusqlite::Connection;
use serde::Serialize;

use crate::agents::Agents;
use crate::tasks::store::{answered, hand, now_ms, Database, Transaction};
use crate::workers::Job;
pub use space::{Holder, Space};
pub use sql::Quota;
use sql::{NewEntry, StateError};

/// How often expired keys are removed from every space.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The state store: the way to its database, and when it is next swept.
#[derive(Debug)]
pub struct StateStore {
    /// `None` if the task store had closed when the kernel started.
    database: Option<Database>,
    next_sweep: Instant,
}

impl StateStore {
    /// The state store in `database`: the own keys of every agent are
    /// removed (agents are of an earlier kernel when it starts, and their
    /// ids are given again), and expired keys.
    pub fn new(database: Option<Database>) -> StateStore {
        let mut store = StateStore {
            database,
            next_sweep: Instant::now() + SWEEP_EVERY,
        };
        store.run(Box::new(|connection: &Connection| {
            let now = now_ms();
            let removed = sql::forget_every_agent(connection)
                .and_then(|agents| Ok((agents, sql::purge_expired(connection, now)?)));
            match removed {
                Ok((0, 0)) => {}
                Ok((agents, expired)) => log::info!(
                    "state store: removed {agents} key(s) of agents of an earlier kernel and \
                     {expired} expired key(s)"
                ),
                Err(err) => log::error!("state store: cannot remove old keys: {err}"),
            }
        }));
        store
    }

    /// STORE `request` (whose value is `value` as JSON) for `holder`.
    pub fn store(
        &mut self,
        holder: Holder,
        request: StoreRequest,
        value: String,
        quota: Quota,
    ) -> Job {
        let now = now_ms();
        let entry = NewEntry {
            space: holder.space(request.scope),
            owner_uid: holder.owner_uid(),
            expires_ms: request.ttl_ms().map(|ttl| now.saturating_add(ttl)),
            key: request.key,
            value,
        };
        self.submit(move |connection| sql::store(connection, entry, quota, now_ms()))
    }

    /// FETCH for `holder`.
    pub fn fetch(&mut self, holder: Holder, request: KeyRequest) -> Job {
        let spaces = holder.spaces(request.scope);
        self.submit(move |connection| sql::fetch(connection, &spaces, &request.key, now_ms()))
    }

    /// DELETE for `holder`.
    pub fn delete(&mut self, holder: Holder, request: KeyRequest) -> Job {
        let spaces = holder.spaces(request.scope);
        self.submit(move |connection| sql::delete(connection, &spaces, &request.key, now_ms()))
    }

    /// KEYS for `holder`.
    pub fn keys(&mut self, holder: Holder, request: KeysRequest) -> Job {
        let spaces = holder.spaces(request.scope);
        self.submit(move |connection| sql::keys(connection, &spaces, &request.prefix, now_ms()))
    }

    /// Agent `id`'s incarnation has ended: if the agent has too (it is
    /// not between restarts), its own keys go.
    pub fn agent_ended(&mut self, id: u32, agents: &Agents) {
        if !agents.is_over(id) {
            return;
        }
        self.run(Box::new(move |connection: &Connection| {
            if let Err(err) = sql::forget(connection, Space::Agent(id)) {
                log::error!("state store: cannot remove agent {id}'s keys: {err}");
            }
        }));
    }

    /// Hands `work` to the writer thread (after a sweep, if one is due);
    /// the job a worker runs waits for its answer.
    fn submit<R, W>(&mut self, work: W) -> Job
    where
        R: Serialize + Send + 'static,
        W: FnOnce(&Connection) -> Result<R, StateError> + Send + 'static,
    {
        if Instant::now() >= self.next_sweep {
            self.next_sweep = Instant::now() + SWEEP_EVERY;
            self.run(Box::new(|connection: &Connection| {
                if let Err(err) = sql::purge_expired(connection, now_ms()) {
                    log::error!("state store: cannot remove expired keys: {err}");
                }
            }));
        }
        let (transaction, job) = answered("state store", work, |err| {
            matches!(err, StateError::Database(_) | StateError::Corrupt(_))
        });
        self.run(transaction);
        job
    }

    /// Hands `transaction` to the writer thread; dropped (and so answered
    /// `unavailable`) if the store has closed.
    fn run(&mut self, transaction: Transaction) {
        hand(self.database.as_ref(), "state store", transaction);
    }
}
