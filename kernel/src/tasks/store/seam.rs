//! What [`Tasks`](crate::tasks::Tasks) needs of its store, as a trait, and
//! the records and changes that cross it: the SQLite store implements it,
//! and the tasks' state machine is tested against a fake.

use std::fmt;
use std::sync::Arc;

use agentos_proto::payload::{TaskKind, TaskState};

use super::error::ReadError;
use crate::tasks::owner::OwnerKey;

/// The store's side effects. None blocks but [`Store::close`] (and what a
/// [`ReadBack`] does, on a worker).
pub trait Store {
    /// Hands a change over to be saved; the changes handed over are
    /// counted, in order, from 1.
    fn write(&mut self, write: Write);

    /// How many of the changes handed over so far are saved: every one up
    /// to this count is on disk, but for new tasks reported [`Refused`]
    /// (always reported before the count passes them, so read the count
    /// first, then [`Store::take_refused`]).
    fn applied(&self) -> u64;

    /// New tasks whose records could not be saved since last asked.
    fn take_refused(&mut self) -> Vec<Refused>;

    /// A reading of finished task `id`'s result, to be done on a worker.
    fn read_back(&self, id: &str) -> ReadBack;

    /// Saves what is still waiting and stops saving (blocks until it has).
    fn close(&mut self);
}

/// A task as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredTask {
    /// `t-...`.
    pub id: String,
    /// Creation order.
    pub seq: u64,
    /// Whose it is.
    pub owner: OwnerKey,
    /// What it runs.
    pub kind: TaskKind,
    /// The owner's name for it.
    pub label: Option<String>,
    /// Its state.
    pub state: TaskState,
    /// Its request, as dispatched (JSON).
    pub request: String,
    /// Unix times in milliseconds.
    pub created_ms: i64,
    /// When it started running.
    pub started_ms: Option<i64>,
    /// When it finished.
    pub finished_ms: Option<i64>,
    /// What it had printed when last saved (the tail).
    pub output: Option<String>,
}

#[cfg(test)]
impl StoredTask {
    /// An operator's EXEC task `id`, in state `state` (its wire name).
    pub fn for_tests(id: &str, seq: u64, state: &str) -> StoredTask {
        StoredTask {
            id: id.into(),
            seq,
            owner: OwnerKey::new(crate::identity::Principal::Operator { uid: 0 }, 0),
            kind: TaskKind::Exec,
            label: None,
            state: TaskState::from_name(state).expect("a task state"),
            request: "{}".into(),
            created_ms: 1,
            started_ms: None,
            finished_ms: None,
            output: None,
        }
    }
}

/// A change to the store.
#[derive(Debug)]
pub enum Write {
    /// A new task.
    Insert(StoredTask),
    /// A task started running.
    Started {
        /// Which.
        id: String,
        /// When.
        started_ms: i64,
    },
    /// A task finished: its state, end time, result and last output.
    Finished {
        /// Which.
        id: String,
        /// Its final state.
        state: TaskState,
        /// When.
        finished_ms: i64,
        /// Its result (JSON).
        result: Arc<Vec<u8>>,
        /// The tail of its output, if it printed any.
        output: Option<String>,
    },
    /// What a running task has printed so far (kept for `interrupted`).
    Output {
        /// Which.
        id: String,
        /// The tail.
        output: String,
    },
    /// Tasks that have expired.
    Delete(Vec<String>),
}

/// New tasks whose records could not be saved: they are not kept, and
/// their dispatches are answered with `cause`.
#[derive(Debug, PartialEq)]
pub struct Refused {
    /// Their ids.
    pub tasks: Vec<String>,
    /// Why, as the system said it (`No space left on device (os error 28)`).
    pub cause: String,
}

/// The result of a finished task: JSON bytes, or none if it has none.
pub type StoredResult = Option<Vec<u8>>;

/// Reading one finished task's result back from the store: done on a
/// worker, since it may wait for the disk.
pub struct ReadBack(Box<dyn FnOnce() -> Result<StoredResult, ReadError> + Send>);

impl ReadBack {
    /// A reading that `read` does.
    pub fn new(read: impl FnOnce() -> Result<StoredResult, ReadError> + Send + 'static) -> Self {
        ReadBack(Box::new(read))
    }

    /// Reads the result (blocks).
    pub fn read(self) -> Result<StoredResult, ReadError> {
        (self.0)()
    }
}

impl fmt::Debug for ReadBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReadBack")
    }
}

/// Milliseconds since the Unix epoch: how the store keeps times.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
