//! TASK: background work that belongs to its caller's principal (an agent,
//! an operator's uid, or an EXEC run), outlives the connection that
//! dispatched it, and — through the [`store`] — the kernel process that
//! ran it.
//!
//! This module decides; the kernel acts. Dispatched tasks queue per owner
//! and start while the owner has fewer than `tasks.max_running_per_owner`
//! running ([`Tasks::startable`] hands the kernel what to start, each with a
//! number its reply comes back under: `ReplyTo::Task(number)`). A reply
//! finishes the task and answers its waiters; a cancel ends it at once and
//! tells the kernel what to stop; a reply that comes after is ignored.
//!
//! Nothing here blocks: the store ([`SqliteStore`], behind the [`Store`]
//! seam) saves on a thread of its own, and a result no longer held in
//! memory is read back by a worker.

mod end;
mod lifecycle;
mod owner;
pub mod prompt;
mod prompts;
mod queue;
mod results;
mod saving;
pub mod store;
mod table;
#[cfg(test)]
mod tests;
pub mod tool_menu;
mod waiters;
mod work;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::payload::{
    to_json, PrincipalInfo, TaskDispatch, TaskInfo, TaskKind, TaskList, TaskListReply, TaskReply,
    TaskState,
};
use agentos_proto::{ErrorCode, ErrorReply};

use crate::telemetry::tracer::{OpenSpan, Tracer};

use crate::address::{Answer, Reply, ReplyTo};
use crate::config::tasks::TasksConfig;
use crate::identity::Principal;
use end::{interrupted, AGENT_ENDED_WITH_KERNEL};
#[cfg(test)]
use owner::PerOwner;
pub use owner::{OwnerKey, OwnerKeyError, Reach};
use prompts::PromptLoops;
use queue::TaskQueue;
use results::ResultCache;
use saving::HeldDispatches;
use store::{now_ms, Loaded, Record, SqliteStore, Store, StoreError, Write};
use table::{Task, TaskTable};
use waiters::Waiters;
pub use work::{CancelledWork, Start, Waited, WorkRequest};

/// How often expired tasks are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// A `wait` without a timeout waits this long.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// How often running tasks' output is looked at and saved (so a task
/// interrupted by a crash keeps what it had printed).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Bytes of a running task's output its progress shows.
pub const PROGRESS_BYTES: usize = 4096;

/// Every task, and the store behind them.
#[derive(Debug)]
pub struct Tasks<S = SqliteStore> {
    table: TaskTable,
    queue: TaskQueue,
    /// Dispatches answered once their tasks' records are saved.
    held: HeldDispatches,
    prompts: PromptLoops,
    waiters: Waiters,
    results: ResultCache,
    store: S,
    /// Writes handed to the store so far: a result leaves memory only
    /// once the store has applied the write that saves it.
    written: u64,
    next_seq: u64,
    /// This kernel's boot number: its agents' and runs' tasks are tied to
    /// it.
    boot: u64,
    config: TasksConfig,
    next_sweep: Instant,
    /// When running tasks' output is next looked at.
    next_progress: Instant,
    /// The kernel is stopping: no task starts.
    stopping: bool,
    /// Where tasks' spans go.
    tracer: Arc<Tracer>,
    /// The span of each task dispatched in this boot, until it finishes.
    spans: HashMap<String, OpenSpan>,
}

impl Tasks {
    /// The tasks of the store in the state directory of the kernel serving
    /// `socket` (see `TasksConfig::state_dir`): queued ones
    /// an operator dispatched run again; an agent's from an earlier kernel
    /// end `interrupted` (the agent is gone), as do those that were running.
    pub fn open(
        config: &TasksConfig,
        socket: &Path,
        waker: Arc<mio::Waker>,
        now: Instant,
    ) -> Result<Tasks, StoreError> {
        let dir = config.state_dir(socket);
        let (store, loaded) = SqliteStore::open(&dir, &config.private_from(socket), waker)?;
        let count = loaded.records.len() + loaded.unreadable.len();
        let tasks = Tasks::new(store, loaded, config, random_u64(), now);
        log::info!(
            "tasks: {count} in the store at {} ({} queued to run)",
            dir.display(),
            tasks.queue.len()
        );
        Ok(tasks)
    }
}

impl<S: Store> Tasks<S> {
    /// Spans of tasks go to `tracer`.
    pub fn trace_with(&mut self, tracer: Arc<Tracer>) {
        self.tracer = tracer;
    }

    /// The state of every task kept, in no order.
    pub fn states(&self) -> impl Iterator<Item = TaskState> + '_ {
        self.table.states()
    }

    /// The tasks `loaded` from `store`, in the kernel of boot `boot`.
    pub fn new(store: S, loaded: Loaded, config: &TasksConfig, boot: u64, now: Instant) -> Self {
        let mut tasks = Tasks {
            table: TaskTable::default(),
            queue: TaskQueue::default(),
            held: HeldDispatches::default(),
            prompts: PromptLoops::default(),
            waiters: Waiters::default(),
            results: ResultCache::new(config.result_cache_bytes),
            store,
            written: 0,
            next_seq: 1,
            boot,
            config: config.clone(),
            next_sweep: now,
            next_progress: now,
            stopping: false,
            tracer: Arc::new(Tracer::default()),
            spans: HashMap::new(),
        };
        for row in loaded.unreadable {
            log::error!(
                "tasks: {row}; it is left in the store untouched and not loaded, so no request \
                 reaches it"
            );
            // Its place in creation order stays its own.
            tasks.next_seq = tasks.next_seq.max(row.seq() + 1);
        }
        for record in loaded.records {
            tasks.restore(record);
        }
        tasks
    }

    /// A task from the store.
    fn restore(&mut self, mut record: Record) {
        let dispatch = serde_json::from_str(&record.request)
            .ok()
            .map(|request| TaskDispatch {
                kind: record.kind,
                request,
                label: record.label.clone(),
                trace: None,
            });
        if record.state == TaskState::Queued && (dispatch.is_none() || !record.owner.is_operator())
        {
            // Its agent is gone with the kernel that ran it.
            record.state = TaskState::Interrupted;
            record.finished_ms = Some(now_ms());
            self.write(Write::Finished {
                id: record.id.clone(),
                state: record.state,
                finished_ms: now_ms(),
                result: Arc::new(interrupted(AGENT_ENDED_WITH_KERNEL, "")),
                output: None,
            });
        }
        self.next_seq = self.next_seq.max(record.seq + 1);
        let task = Task::from_record(record, dispatch);
        if task.state == TaskState::Queued {
            self.queue.push(task.id.clone(), task.owner);
        }
        self.table.insert(task);
    }

    /// Whose `principal`'s tasks are in this kernel's life.
    fn owner_key(&self, principal: Principal) -> OwnerKey {
        OwnerKey::new(principal, self.boot)
    }

    /// Whether a prompt task is waiting to start (its first THINK needs the
    /// list of tools).
    pub fn prompt_queued(&self) -> bool {
        self.queue.order().any(|id| {
            self.table
                .get(id)
                .is_some_and(|t| t.kind == TaskKind::Prompt)
        })
    }

    /// The sessions of prompt loops that have ended (taken): the kernel
    /// closes them.
    pub fn take_ended_sessions(&mut self) -> Vec<(Principal, String)> {
        self.prompts.take_ended_sessions()
    }

    /// A task within `reach`, as `status` gives it.
    pub fn status(&self, reach: Reach, id: &str) -> Result<TaskInfo, ErrorReply> {
        Ok(self.owned(reach, id)?.info(None))
    }

    /// `wait`: the task with its result once it has finished; until then
    /// the reply waits, up to `timeout`.
    pub fn wait(
        &mut self,
        reach: Reach,
        id: &str,
        timeout: Option<Duration>,
        reply_to: ReplyTo,
        now: Instant,
    ) -> Result<Waited, ErrorReply> {
        let task = self.owned(reach, id)?;
        if task.state.is_finished() {
            return Ok(match self.results.get(id) {
                Some(result) => Waited::Reply(to_json(&TaskReply {
                    success: true,
                    task: task.info(Some(result)),
                })),
                None => Waited::ReadResult {
                    read: self.store.read_back(id),
                    task: Box::new(task.info(None)),
                },
            });
        }
        let timeout = timeout.unwrap_or(DEFAULT_WAIT);
        if timeout.is_zero() {
            return Ok(Waited::Reply(to_json(&TaskReply {
                success: true,
                task: task.info(None),
            })));
        }
        self.waiters.add(id, reply_to, now + timeout);
        Ok(Waited::Later)
    }

    /// `list`: the tasks within `reach`, newest first, filtered and paged;
    /// with `describe`, each says whose it is.
    pub fn list(
        &self,
        reach: Reach,
        filter: &TaskList,
        describe: Option<&dyn Fn(Principal) -> PrincipalInfo>,
    ) -> Result<TaskListReply, ErrorReply> {
        let owner = reach.owner(self.boot);
        let before = match &filter.before {
            Some(id) => self.owned(reach, id)?.seq,
            None => u64::MAX,
        };
        let limit = filter.limit.unwrap_or(50) as usize;
        let mut tasks = Vec::new();
        let mut next = None;
        for task in self.table.newest_first(before) {
            if owner.is_some_and(|owner| task.owner != owner)
                || filter.state.is_some_and(|s| s != task.state)
                || filter.kind.is_some_and(|k| k != task.kind)
            {
                continue;
            }
            if tasks.len() == limit {
                next = tasks.last().map(|t: &TaskInfo| t.task_id.clone());
                break;
            }
            let mut info = task.info(None);
            info.owner = describe.map(|describe| task.owner.describe(self.boot, describe));
            tasks.push(info);
        }
        Ok(TaskListReply {
            success: true,
            tasks,
            next,
        })
    }

    /// The numbers of the work of every running task.
    pub fn running(&self) -> Vec<u64> {
        self.queue.numbers()
    }

    /// The number of task `id`'s work, while it runs.
    pub fn number_of(&self, id: &str) -> Option<u64> {
        self.table.get(id)?.number
    }

    /// Last step of shutdown (blocks briefly): every change is saved, or
    /// the log names what could not be.
    pub fn finish_shutdown(&mut self) {
        self.store.close();
    }

    /// Waits for a connection that closed are dropped.
    pub fn connection_closed(&mut self, serial: u64) {
        self.waiters.connection_closed(serial);
    }

    /// When the next wait times out, the next sweep is due, or running
    /// tasks' output is next looked at.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        let progress = self.queue.is_running().then_some(self.next_progress);
        [self.next_sweep]
            .into_iter()
            .chain(progress)
            .map(|at| at.saturating_duration_since(now))
            .chain(self.waiters.time_to_next(now))
            .min()
    }

    /// Waits that timed out are answered with their task as it is;
    /// expired tasks are removed.
    pub fn on_deadlines(&mut self, now: Instant, replies: &mut Vec<Reply>) {
        for (id, reply_to) in self.waiters.timed_out(now) {
            if let Some(task) = self.table.get(&id) {
                let payload = Answer::json(&TaskReply {
                    success: true,
                    task: task.info(None),
                });
                replies.push((reply_to, payload));
            }
        }
        if now >= self.next_sweep {
            let retention = Duration::from_secs(self.config.retention_secs);
            self.next_sweep = now + SWEEP_EVERY.min(retention);
            self.expire(now_ms());
        }
    }

    /// Removes finished tasks older than the retention.
    fn expire(&mut self, now_ms: i64) {
        let horizon = now_ms - (self.config.retention_secs as i64) * 1000;
        let expired = self
            .table
            .ids(|t| t.state.is_finished() && t.finished_ms.is_some_and(|f| f < horizon));
        if !expired.is_empty() {
            log::debug!("tasks: {} expired", expired.len());
            self.remove(&expired);
        }
    }

    /// Makes room for one more task of `owner`: its oldest finished one
    /// goes.
    fn drop_oldest_finished(&mut self, owner: OwnerKey) -> bool {
        let oldest = self
            .table
            .oldest(|t| t.owner == owner && t.state.is_finished())
            .map(|t| t.id.clone());
        match oldest {
            Some(id) => {
                self.remove(&[id]);
                true
            }
            None => false,
        }
    }

    /// Removes tasks `ids`, from memory and from the store.
    fn remove(&mut self, ids: &[String]) {
        for id in ids {
            self.table.remove(id);
        }
        self.results.forget(ids);
        self.write(Write::Delete(ids.to_vec()));
    }

    /// The task `id` if it is within `reach`; anyone else's is
    /// `not_found`, so ids tell nothing about other owners' tasks.
    fn owned(&self, reach: Reach, id: &str) -> Result<&Task, ErrorReply> {
        let owner = reach.owner(self.boot);
        self.table
            .get(id)
            .filter(|task| owner.is_none_or(|owner| task.owner == owner))
            .ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::NotFound,
                    format!("you have no task {id:?} (TASK list names yours)"),
                )
            })
    }

    /// Hands a change to the store, counting it.
    fn write(&mut self, write: Write) {
        self.written += 1;
        if let Write::Insert(record) = &write {
            self.held.inserted(self.written, &record.id);
        }
        self.store.write(write);
    }

    /// Queued tasks per owner.
    #[cfg(test)]
    fn queued_per_owner(&self) -> &PerOwner {
        self.queue.queued_per_owner()
    }

    /// Tasks kept per owner.
    #[cfg(test)]
    fn kept_per_owner(&self) -> &PerOwner {
        self.table.kept_per_owner()
    }
}

/// `t-` and 64 random bits: ids say nothing about other tasks.
fn new_id() -> String {
    format!("t-{:016x}", random_u64())
}

/// 64 random bits. Should the pool fail, the clock and a counter keep ids
/// unique, if guessable, and the log says so.
fn random_u64() -> u64 {
    static FALLBACK: AtomicU64 = AtomicU64::new(0);
    let mut bytes = [0u8; 8];
    match crate::random::fill(&mut bytes) {
        Ok(()) => return u64::from_ne_bytes(bytes),
        Err(err) => log::error!("no random bytes ({err}): task ids fall back to the clock"),
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ FALLBACK.fetch_add(1, Ordering::Relaxed).rotate_left(32)
}
