//! The writer thread: applies the changes the kernel hands over in
//! batches, one transaction each. A batch that cannot be saved (a full
//! disk, an I/O error) is rolled back, so the connection goes on: its new
//! tasks are refused, with the cause, and its other changes are kept in
//! memory, at most one of each kind per task, and saved with the next
//! batch, or alone every second, until they are. What is still unsaved
//! when the kernel stops is named in the log.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use mio::Waker;
use rusqlite::Connection;

use super::database::{Message, Transaction};
use super::schema::apply;
use super::seam::{Refused, Write};

/// How often changes that could not be saved are tried again when no new
/// change comes to carry them.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// A task's changes that could not be saved yet, at most one of each kind:
/// a later one replaces an earlier, so what waits stays bounded by the
/// number of tasks.
#[derive(Debug, Default)]
struct Unsaved {
    started: Option<Write>,
    output: Option<Write>,
    finished: Option<Write>,
    /// Its removal (which replaced whatever else waited).
    deleted: Option<Write>,
}

impl Unsaved {
    /// Its changes in the order they apply: the start, the output (which
    /// an end without output leaves as is), the end.
    fn writes(&self) -> impl Iterator<Item = &Write> {
        [&self.started, &self.output, &self.finished, &self.deleted]
            .into_iter()
            .flatten()
    }

    /// What it is, for the log: "its start, its end (completed)".
    fn describe(&self) -> String {
        self.writes()
            .map(|write| match write {
                Write::Started { .. } => "its start".to_owned(),
                Write::Output { .. } => "its latest output".to_owned(),
                Write::Finished { state, .. } => format!("its end ({})", state.as_str()),
                Write::Delete(_) => "its removal".to_owned(),
                Write::Insert(_) => "its record".to_owned(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The writer thread: applies changes in batches until the kernel goes.
pub struct Writer {
    connection: Connection,
    path: PathBuf,
    /// Writes received so far (they are numbered in the order sent).
    received: u64,
    /// Every write up to this count is saved (or refused, if a new task's).
    applied: Arc<AtomicU64>,
    refusals: Sender<Refused>,
    waker: Arc<Waker>,
    /// Changes of batches that failed, by task: saved first in the next
    /// transaction, so a task's changes still apply in order.
    unsaved: BTreeMap<String, Unsaved>,
    /// Why saving fails, while it does.
    failing: Option<String>,
}

impl Writer {
    pub fn new(
        connection: Connection,
        path: PathBuf,
        applied: Arc<AtomicU64>,
        refusals: Sender<Refused>,
        waker: Arc<Waker>,
    ) -> Writer {
        Writer {
            connection,
            path,
            received: 0,
            applied,
            refusals,
            waker,
            unsaved: BTreeMap::new(),
            failing: None,
        }
    }

    /// Saves batches until the kernel closes the store; then tries once
    /// more what is still unsaved, and names in the log what is lost.
    /// Other subsystems' transactions run as they come, after the tasks'
    /// changes handed over before them.
    pub fn run(mut self, messages: Receiver<Message>) {
        let mut open = true;
        while open {
            let first = if self.unsaved.is_empty() {
                messages.recv().ok()
            } else {
                match messages.recv_timeout(RETRY_EVERY) {
                    Ok(message) => Some(message),
                    Err(RecvTimeoutError::Timeout) => {
                        self.save(Vec::new());
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => None,
                }
            };
            let Some(first) = first else {
                break;
            };
            let mut batch = Vec::new();
            for message in std::iter::once(first).chain(messages.try_iter()) {
                match message {
                    Message::Task(write) => batch.push(*write),
                    Message::Run(transaction) => {
                        if !batch.is_empty() {
                            self.save(std::mem::take(&mut batch));
                        }
                        self.run_other(transaction);
                    }
                    Message::Stop => {
                        open = false;
                        break;
                    }
                }
            }
            if !batch.is_empty() {
                self.save(batch);
            }
        }
        if !self.unsaved.is_empty() {
            self.save(Vec::new());
        }
        self.report_lost();
    }

    /// Runs another subsystem's transaction. Its fault (a panic, a
    /// transaction left open) must not stop the tasks being saved: a panic
    /// is caught (its transaction rolls back as it unwinds) and an open
    /// transaction rolled back.
    fn run_other(&mut self, transaction: Transaction) {
        let connection = &self.connection;
        if catch_unwind(AssertUnwindSafe(|| transaction(connection))).is_err() {
            log::error!("the task store's writer: another subsystem's transaction panicked");
        }
        if !connection.is_autocommit() {
            log::error!("the task store's writer: a transaction was left open; rolled back");
            if let Err(err) = connection.execute_batch("ROLLBACK") {
                log::error!("the task store cannot roll a transaction back: {err}");
            }
        }
    }

    /// Saves `batch` (after what earlier batches left unsaved) in one
    /// transaction. If it fails, it is rolled back: its new tasks are
    /// refused, its other changes wait for the next try.
    fn save(&mut self, batch: Vec<Write>) {
        let through = self.received + batch.len() as u64;
        self.received = through;
        let before = self.applied.load(Ordering::Relaxed);
        let waiting = self.unsaved.values().flat_map(Unsaved::writes);
        match apply(&self.connection, waiting.chain(&batch)) {
            Ok(()) => {
                if let Some(cause) = self.failing.take() {
                    log::info!(
                        "the task store {} saves again (it could not: {cause}); {} task(s)' \
                         waiting changes are saved",
                        self.path.display(),
                        self.unsaved.len()
                    );
                }
                self.unsaved.clear();
                self.applied.store(through, Ordering::Release);
                if through > before {
                    let _ = self.waker.wake();
                }
            }
            Err(cause) => {
                let cause = cause.to_string();
                let mut refused = Vec::new();
                for write in batch {
                    match write {
                        Write::Insert(record) => refused.push(record.id),
                        write => self.keep_unsaved(write),
                    }
                }
                if self.failing.as_ref() != Some(&cause) {
                    log::error!(
                        "the task store {} cannot save: {cause}; new tasks are refused, other \
                         changes are kept in memory and tried again every {}s",
                        self.path.display(),
                        RETRY_EVERY.as_secs()
                    );
                }
                if !refused.is_empty() {
                    log::warn!(
                        "tasks: not saved, so refused: {} ({cause})",
                        refused.join(", ")
                    );
                    // Sent before the count passes them (see Store::applied).
                    let _ = self.refusals.send(Refused {
                        tasks: refused,
                        cause: cause.clone(),
                    });
                    let _ = self.waker.wake();
                }
                self.failing = Some(cause);
            }
        }
    }

    /// Keeps a change of a failed batch, replacing an earlier one of its
    /// kind for its task.
    fn keep_unsaved(&mut self, write: Write) {
        match write {
            Write::Insert(_) => {}
            Write::Delete(ids) => {
                for id in ids {
                    let deleted = Some(Write::Delete(vec![id.clone()]));
                    self.unsaved.insert(
                        id,
                        Unsaved {
                            deleted,
                            ..Unsaved::default()
                        },
                    );
                }
            }
            Write::Started { ref id, .. } => {
                let id = id.clone();
                self.unsaved.entry(id).or_default().started = Some(write);
            }
            Write::Output { ref id, .. } => {
                let id = id.clone();
                self.unsaved.entry(id).or_default().output = Some(write);
            }
            Write::Finished { ref id, .. } => {
                let id = id.clone();
                self.unsaved.entry(id).or_default().finished = Some(write);
            }
        }
    }

    /// Says in the log which tasks' changes the kernel stops without.
    fn report_lost(&self) {
        let lost = self.lost();
        if lost.is_empty() {
            return;
        }
        log::error!(
            "the task store {} could not save the changes of {} task(s) before the kernel \
             stopped ({}); they are lost:",
            self.path.display(),
            lost.len(),
            self.failing.as_deref().unwrap_or("unknown cause")
        );
        for line in lost {
            log::error!("{line}");
        }
    }

    /// A line per task whose changes are still unsaved: "task t-…: not
    /// saved: its start, its end (completed)".
    fn lost(&self) -> Vec<String> {
        self.unsaved
            .iter()
            .map(|(id, unsaved)| format!("task {id}: not saved: {}", unsaved.describe()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::mpsc::channel;

    use agentos_proto::payload::TaskState;

    use super::*;
    use crate::tasks::store::private::FILE;
    use crate::tasks::store::schema::{migrate, open_connection};
    use crate::tasks::store::seam::StoredTask;

    fn waker() -> Arc<Waker> {
        let poll = mio::Poll::new().unwrap();
        Arc::new(Waker::new(poll.registry(), mio::Token(0)).unwrap())
    }

    fn record(id: &str, seq: u64, state: &str) -> StoredTask {
        StoredTask::for_tests(id, seq, state)
    }

    /// A writer on a database of its own that holds at most `pages` pages:
    /// past them SQLite fails as on a full disk.
    fn writer_with_room(
        dir: &Path,
        pages: u32,
    ) -> (Writer, Arc<AtomicU64>, Receiver<Refused>, Connection) {
        let path = dir.join(FILE);
        let connection = open_connection(&path).unwrap();
        migrate(&connection).unwrap();
        connection
            .pragma_update(None, "max_page_count", pages)
            .unwrap();
        let applied = Arc::new(AtomicU64::new(0));
        let (refusals, refused) = channel();
        let writer = Writer::new(connection, path.clone(), applied.clone(), refusals, waker());
        (writer, applied, refused, open_connection(&path).unwrap())
    }

    fn stored(reader: &Connection) -> Vec<(String, String, usize)> {
        reader
            .prepare("SELECT id, state, length(coalesce(output, '')) FROM tasks ORDER BY seq")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    #[test]
    fn a_batch_that_cannot_be_saved_refuses_its_new_tasks_and_its_other_changes_are_saved_later() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, applied, refused, reader) = writer_with_room(dir.path(), 4);
        writer.save(vec![Write::Insert(record("t-a", 1, "queued"))]);
        assert_eq!(applied.load(Ordering::Acquire), 1);
        // A large output does not fit: the batch is refused as a whole.
        let output = |n: usize| Write::Output {
            id: "t-a".into(),
            output: "o".repeat(n),
        };
        writer.save(vec![
            Write::Started {
                id: "t-a".into(),
                started_ms: 2,
            },
            output(10),
            output(100_000),
            Write::Insert(record("t-b", 2, "queued")),
        ]);
        assert_eq!(
            refused.try_recv().unwrap(),
            Refused {
                tasks: vec!["t-b".into()],
                cause: "No space left on device (os error 28)".into(),
            }
        );
        assert_eq!(applied.load(Ordering::Acquire), 1, "nothing more is saved");
        assert!(
            writer.connection.is_autocommit(),
            "no transaction is left open"
        );
        assert_eq!(stored(&reader), [("t-a".into(), "queued".into(), 0)]);
        // Tried again, alone or with the next batch, while there is no room:
        // still unsaved, kept once per kind per task, and refused again.
        writer.save(Vec::new());
        writer.save(vec![
            Write::Insert(record("t-c", 3, "queued")),
            output(100_001),
        ]);
        assert_eq!(refused.try_recv().unwrap().tasks, ["t-c"]);
        assert_eq!(writer.unsaved.len(), 1);
        assert_eq!(
            writer.lost(),
            ["task t-a: not saved: its start, its latest output"]
        );
        assert_eq!(applied.load(Ordering::Acquire), 1);
        // Room again: the next batch saves what waited first, then itself.
        writer
            .connection
            .pragma_update(None, "max_page_count", 1000)
            .unwrap();
        writer.save(vec![
            Write::Insert(record("t-d", 4, "queued")),
            Write::Finished {
                id: "t-a".into(),
                state: TaskState::Completed,
                finished_ms: 3,
                result: Arc::new(b"{}".to_vec()),
                output: None,
            },
        ]);
        assert!(refused.try_recv().is_err());
        assert_eq!(
            applied.load(Ordering::Acquire),
            9,
            "every write is accounted for"
        );
        assert!(writer.lost().is_empty());
        assert_eq!(
            stored(&reader),
            [
                ("t-a".into(), "completed".into(), 100_001),
                ("t-d".into(), "queued".into(), 0)
            ]
        );
    }

    #[test]
    fn changes_still_unsaved_are_saved_alone_once_there_is_room() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, applied, _refused, reader) = writer_with_room(dir.path(), 4);
        writer.save(vec![
            Write::Insert(record("t-a", 1, "queued")),
            Write::Insert(record("t-b", 2, "queued")),
        ]);
        writer.save(vec![
            Write::Delete(vec!["t-b".into()]),
            Write::Output {
                id: "t-a".into(),
                output: "o".repeat(100_000),
            },
        ]);
        assert_eq!(
            writer.lost(),
            [
                "task t-a: not saved: its latest output",
                "task t-b: not saved: its removal"
            ]
        );
        writer
            .connection
            .pragma_update(None, "max_page_count", 1000)
            .unwrap();
        writer.save(Vec::new());
        assert_eq!(applied.load(Ordering::Acquire), 4);
        assert_eq!(stored(&reader), [("t-a".into(), "queued".into(), 100_000)]);
    }
}
