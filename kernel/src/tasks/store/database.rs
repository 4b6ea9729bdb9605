//! The store's database as other subsystems reach it (the state store):
//! a transaction of theirs runs on the writer thread's connection, in the
//! order handed over, between the tasks' batches. One writer keeps every
//! write to the file in one order, so a subsystem's check and its write
//! (a quota, then the key) see no other write between them.

use std::fmt;
use std::sync::mpsc::Sender;

use rusqlite::Connection;

use super::seam::Write;

/// Work another subsystem does on the database, on the writer thread: it
/// opens and ends its own transaction, and answers whoever waits for it.
pub type Transaction = Box<dyn FnOnce(&Connection) + Send>;

/// What the writer thread is handed.
pub enum Message {
    /// A change to the tasks, saved in the next batch.
    Task(Write),
    /// Another subsystem's transaction.
    Run(Transaction),
    /// Save what waits and stop: the store is closing (handles may still
    /// be held, so the channel alone does not say so).
    Stop,
}

/// A handle on the store's database for another subsystem. Cheap to
/// clone; once the store has closed, nothing it is handed runs.
#[derive(Clone)]
pub struct Database {
    sender: Sender<Message>,
}

impl Database {
    pub(super) fn new(sender: Sender<Message>) -> Database {
        Database { sender }
    }

    /// Hands `transaction` to the writer thread (it never blocks); `false`
    /// if the store has closed, and `transaction` is dropped unrun.
    pub fn run(&self, transaction: Transaction) -> bool {
        self.sender.send(Message::Run(transaction)).is_ok()
    }
}

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Database")
    }
}
