//! Saving tasks: every change goes to the store, and a dispatch is
//! answered only once its task is on disk, so an id a caller holds
//! survives a crash. Its task waits out of the queue meanwhile, so a task
//! whose record cannot be saved never runs.

use std::collections::VecDeque;
use std::sync::Arc;

use agentos_proto::payload::{to_json, TaskReply};

use super::results::ResultCache;
use super::store::seam::{ReadBack, Refused, Store, Write};
use super::table::Task;
use super::work::Waited;
use crate::address::{Answer, ReplyTo};

/// A dispatch's reply, held until the write that saves its task's record.
#[derive(Debug)]
pub struct Held {
    /// The write that saves the record.
    write: u64,
    /// The task, waiting out of the queue.
    pub task: Option<String>,
    /// Where the reply goes.
    pub reply_to: ReplyTo,
    /// The reply.
    pub reply: Answer,
}

/// The dispatches held, oldest first.
#[derive(Debug, Default)]
pub struct HeldDispatches {
    held: VecDeque<Held>,
    /// The last new task's record handed to the store: the write, the task.
    last_insert: Option<(u64, String)>,
}

impl HeldDispatches {
    /// Write `write` is task `id`'s new record.
    pub fn inserted(&mut self, write: u64, id: &str) {
        self.last_insert = Some((write, id.to_owned()));
    }

    /// Holds `reply` for `reply_to` until everything written so far
    /// (`written` writes) is saved. Returns the task whose record the last
    /// write is, if it is one: it waits out of the queue until then.
    pub fn hold(&mut self, written: u64, reply_to: ReplyTo, reply: Answer) -> Option<String> {
        let task = self
            .last_insert
            .take()
            .filter(|(write, _)| *write == written)
            .map(|(_, id)| id);
        self.held.push_back(Held {
            write: written,
            task: task.clone(),
            reply_to,
            reply,
        });
        task
    }

    /// Task `id`'s record could not be saved: where its dispatch's reply
    /// was to go, if it is still held.
    pub fn refuse(&mut self, id: &str) -> Option<ReplyTo> {
        let at = self
            .held
            .iter()
            .position(|held| held.task.as_deref() == Some(id))?;
        self.held.remove(at).map(|held| held.reply_to)
    }

    /// The dispatches whose writes are saved — every write up to
    /// `applied` — oldest first, no longer held.
    pub fn saved(&mut self, applied: u64) -> Vec<Held> {
        let count = self
            .held
            .iter()
            .take_while(|held| held.write <= applied)
            .count();
        self.held.drain(..count).collect()
    }
}

/// The store behind the tasks, and what waits on it: the writes handed to
/// it, the dispatches answered once their records are saved, and finished
/// results, held in memory until the store has them.
#[derive(Debug)]
pub struct Saving<S> {
    store: S,
    /// Writes handed to the store so far: a result leaves memory only
    /// once the store has applied the write that saves it.
    written: u64,
    held: HeldDispatches,
    results: ResultCache,
}

impl<S: Store> Saving<S> {
    /// Saving to `store`, holding up to `result_bytes` of results in
    /// memory.
    pub fn new(store: S, result_bytes: usize) -> Self {
        Saving {
            store,
            written: 0,
            held: HeldDispatches::default(),
            results: ResultCache::new(result_bytes),
        }
    }

    /// Hands a change to the store, counting it.
    pub fn write(&mut self, write: Write) {
        self.written += 1;
        if let Write::Insert(record) = &write {
            self.held.inserted(self.written, &record.id);
        }
        self.store.write(write);
    }

    /// Holds `reply` for `reply_to` until everything written so far is
    /// saved. Returns the task whose record the last write is, if it is
    /// one: it waits out of the queue until then.
    pub fn hold(&mut self, reply_to: ReplyTo, reply: Answer) -> Option<String> {
        self.held.hold(self.written, reply_to, reply)
    }

    /// How many writes the store has applied. Read it before
    /// [`Saving::take_refused`]: the store reports a refusal before it
    /// counts past it.
    pub fn applied(&self) -> u64 {
        self.store.applied()
    }

    /// The writes the store refused since last asked.
    pub fn take_refused(&mut self) -> Vec<Refused> {
        self.store.take_refused()
    }

    /// Task `id`'s record could not be saved: where its dispatch's reply
    /// was to go, if it is still held.
    pub fn refuse(&mut self, id: &str) -> Option<ReplyTo> {
        self.held.refuse(id)
    }

    /// The dispatches whose writes are saved — every write up to
    /// `applied` — no longer held; results saved meanwhile may leave
    /// memory.
    pub fn saved(&mut self, applied: u64) -> Vec<Held> {
        let saved = self.held.saved(applied);
        self.results.evict(self.store.applied());
        saved
    }

    /// Finished task `id`'s `result`, saved by the write just made.
    pub fn keep_result(&mut self, id: &str, result: Arc<Vec<u8>>) {
        self.results.keep(id, result, self.written);
        self.results.evict(self.store.applied());
    }

    /// Task `id`'s result, while in memory.
    /// `wait`'s answer for `task`, which has finished: with its result,
    /// or to be read back from the store.
    pub fn finished(&self, task: &Task) -> Waited {
        match self.result(&task.id) {
            Some(result) => Waited::Reply(to_json(&TaskReply {
                success: true,
                task: task.info(Some(result)),
            })),
            None => Waited::ReadResult {
                read: self.read_back(&task.id),
                task: Box::new(task.info(None)),
            },
        }
    }

    pub fn result(&self, id: &str) -> Option<&[u8]> {
        self.results.get(id)
    }

    /// A reading of task `id`'s result from the store, for a worker.
    pub fn read_back(&self, id: &str) -> ReadBack {
        self.store.read_back(id)
    }

    /// The results of tasks `ids`, which are gone.
    pub fn forget_results(&mut self, ids: &[String]) {
        self.results.forget(ids);
    }

    /// Every change saved, or the log names what could not be (blocks
    /// briefly).
    pub fn close(&mut self) {
        self.store.close();
    }

    /// The store.
    #[cfg(test)]
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store, to drive it.
    #[cfg(test)]
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }
}
