//! The store's database as other subsystems reach it (the state store):
//! a transaction of theirs runs on the writer thread's connection, in the
//! order handed over, between the tasks' batches. One writer keeps every
//! write to the file in one order, so a subsystem's check and its write
//! (a quota, then the key) see no other write between them.

use std::fmt;
use std::sync::mpsc::{channel, Sender};

use agentos_proto::{ErrorCode, ErrorReply};
use rusqlite::Connection;
use serde::Serialize;

use super::seam::Write;
use crate::address::Answer;
use crate::workers::Job;

/// Work another subsystem does on the database, on the writer thread: it
/// opens and ends its own transaction, and answers whoever waits for it.
pub type Transaction = Box<dyn FnOnce(&Connection) + Send>;

/// What the writer thread is handed.
pub enum Message {
    /// A change to the tasks, saved in the next batch (boxed: a write is
    /// far larger than the other messages).
    Task(Box<Write>),
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

/// A transaction that answers, and the job a worker runs to reply with its
/// answer: the reply waits for the writer, never the reactor. `what`
/// names the subsystem in what it logs and replies; an error `logged`
/// says is the database's is logged too.
pub fn answered<R, E, W>(what: &'static str, work: W, logged: fn(&E) -> bool) -> (Transaction, Job)
where
    R: Serialize + Send + 'static,
    E: fmt::Display + Send + 'static,
    ErrorReply: From<E>,
    W: FnOnce(&Connection) -> Result<R, E> + Send + 'static,
{
    let (answer, answered) = channel::<Result<R, E>>();
    let transaction: Transaction = Box::new(move |connection: &Connection| {
        // A worker that stopped waiting no longer needs the answer.
        let _ = answer.send(work(connection));
    });
    let job: Job = Box::new(move || {
        let reply = match answered.recv() {
            Ok(Ok(reply)) => Answer::json(&reply),
            Ok(Err(err)) => {
                if logged(&err) {
                    log::error!("{what}: {err}");
                }
                ErrorReply::from(err).into()
            }
            Err(_) => ErrorReply::new(
                ErrorCode::Unavailable,
                format!("the {what} has closed: the kernel is stopping"),
            )
            .into(),
        };
        reply.into_json()
    });
    (transaction, job)
}

/// Hands `transaction` to `database`'s writer; when the store has closed
/// (or never opened) it is dropped, and `what` says so in the log.
pub fn hand(database: Option<&Database>, what: &str, transaction: Transaction) {
    if !database.is_some_and(|database| database.run(transaction)) {
        log::warn!("{what}: the task store's writer has stopped; a transaction is dropped");
    }
}
