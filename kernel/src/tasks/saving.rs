//! Dispatches held until their tasks' records are saved: a dispatch is
//! answered only once its task is on disk, so an id a caller holds
//! survives a crash. Its task waits out of the queue meanwhile, so a task
//! whose record cannot be saved never runs.

use std::collections::VecDeque;

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
