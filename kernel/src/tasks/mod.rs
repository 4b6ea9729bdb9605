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
pub mod fleet;
pub mod ids;
mod owner;
pub mod prompt;
mod prompts;
mod queue;
mod results;
mod running;
mod saving;
mod spans;
pub mod store;
mod table;
#[cfg(test)]
mod tests;
pub mod tool_menu;
mod waiters;
mod work;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::payload::{
    to_json, PrincipalInfo, TaskDispatch, TaskInfo, TaskList, TaskListReply, TaskReply, TaskState,
};
use agentos_proto::{ErrorCode, ErrorReply};

use crate::address::{Answer, Reply, ReplyTo};
use crate::config::tasks::TasksConfig;
use crate::events::{Event, Journal};
use crate::identity::Principal;
use crate::telemetry::tracer::Tracer;
use end::{cancelled, interrupted, AGENT_ENDED_WITH_KERNEL, KERNEL_STOPPED};
use fleet::FleetTasks;
use ids::{new_id, random_u64};
#[cfg(test)]
use owner::PerOwner;
pub use owner::{OwnerKey, Reach};
use running::{Replied, Running, Started};
use saving::Saving;
use spans::TaskSpans;
use store::{now_ms, Database, Loaded, SqliteStore, Store, StoreError, StoredTask, Write};
use table::{new_record, stored_dispatch, Task, TaskTable};
use tool_menu::ToolMenu;
use waiters::Waiters;
pub use work::{CancelledWork, Start, Waited, WorkRequest};

/// How often expired tasks are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// A `wait` without a timeout waits this long.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// Bytes of a running task's output its progress shows.
pub const PROGRESS_BYTES: usize = 4096;

/// Every task, and the store behind them.
#[derive(Debug)]
pub struct Tasks<S = SqliteStore> {
    table: TaskTable,
    /// The queue, and the work under way.
    running: Running,
    waiters: Waiters,
    /// The store, and what waits on it.
    saving: Saving<S>,
    /// The span of each task dispatched in this boot, until it finishes.
    spans: TaskSpans,
    next_seq: u64,
    /// This kernel's boot number: its agents' and runs' tasks are tied to
    /// it.
    boot: u64,
    config: TasksConfig,
    next_sweep: Instant,
    /// Tasks that ended, for the events hub (`TASK_ENDED`).
    pub(crate) ended: Journal,
    /// The fleet's tasks that run here, and their ends to hand back.
    pub(crate) fleet: FleetTasks,
}

impl Tasks {
    /// The tasks of the store in the state directory of the kernel serving
    /// `socket` (see `TasksConfig::state_dir`): queued ones
    /// an operator dispatched run again; an agent's from an earlier kernel
    /// end `interrupted` (the agent is gone), as do those that were running.
    /// With them, a handle on their database for the state store.
    pub fn open(
        config: &TasksConfig,
        socket: &Path,
        waker: Arc<mio::Waker>,
        now: Instant,
    ) -> Result<(Tasks, Option<Database>), StoreError> {
        let dir = config.state_dir(socket);
        let (store, loaded) = SqliteStore::open(&dir, &config.private_from(socket), waker)?;
        let database = store.database();
        let count = loaded.records.len() + loaded.unreadable.len();
        let tasks = Tasks::new(store, loaded, config, random_u64(), now);
        log::info!(
            "tasks: {count} in the store at {} ({} queued to run)",
            dir.display(),
            tasks.running.waiting()
        );
        Ok((tasks, database))
    }
}

impl<S: Store> Tasks<S> {
    /// Spans of tasks go to `tracer`.
    pub fn trace_with(&mut self, tracer: Arc<Tracer>) {
        self.spans.trace_with(tracer);
    }

    /// The state of every task kept, in no order.
    pub fn states(&self) -> impl Iterator<Item = TaskState> + '_ {
        self.table.states()
    }

    /// The tasks `loaded` from `store`, in the kernel of boot `boot`.
    pub fn new(store: S, loaded: Loaded, config: &TasksConfig, boot: u64, now: Instant) -> Self {
        let mut tasks = Tasks {
            table: TaskTable::default(),
            running: Running::new(now),
            waiters: Waiters::default(),
            saving: Saving::new(store, config.result_cache_bytes),
            spans: TaskSpans::default(),
            next_seq: 1,
            boot,
            config: config.clone(),
            next_sweep: now,
            ended: Journal::default(),
            fleet: FleetTasks::default(),
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
    fn restore(&mut self, mut record: StoredTask) {
        let dispatch = stored_dispatch(&record);
        if record.state == TaskState::Queued
            && (dispatch.is_none()
                || !record.owner.outlives_kernels()
                || record.id.starts_with(ids::FLEET_ID_PREFIX))
        {
            // Its agent is gone with the kernel that ran it; a fleet's
            // task is the fleet's to run again, by its lease.
            record.state = TaskState::Interrupted;
            record.finished_ms = Some(now_ms());
            self.saving.write(Write::Finished {
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
            self.running.push(task.id.clone(), task.owner);
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
        self.running.prompt_queued(&self.table)
    }

    /// The sessions of prompt loops that have ended (taken): the kernel
    /// closes them.
    pub fn take_ended_sessions(&mut self) -> Vec<(Principal, String)> {
        self.running.take_ended_sessions()
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
            return Ok(self.saving.finished(task));
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
        let (tasks, next) = self.table.page(owner, before, filter, |task| {
            describe.map(|describe| task.owner.describe(self.boot, describe))
        });
        Ok(TaskListReply {
            success: true,
            tasks,
            next,
        })
    }

    /// The numbers of the work of every running task.
    pub fn running(&self) -> Vec<u64> {
        self.running.numbers()
    }

    /// The number of task `id`'s work, while it runs.
    pub fn number_of(&self, id: &str) -> Option<u64> {
        self.table.get(id)?.number
    }

    /// Last step of shutdown (blocks briefly): every change is saved, or
    /// the log names what could not be.
    pub fn finish_shutdown(&mut self) {
        self.saving.close();
    }

    /// Waits for a connection that closed are dropped.
    pub fn connection_closed(&mut self, serial: u64) {
        self.waiters.connection_closed(serial);
    }

    /// When the next wait times out, the next sweep is due, or running
    /// tasks' output is next looked at.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        let progress = self.running.next_progress();
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

    /// Queues a task for `owner`; returns its id.
    pub fn dispatch(
        &mut self,
        owner: Principal,
        dispatch: TaskDispatch,
    ) -> Result<String, ErrorReply> {
        self.queue(new_id(), owner, dispatch)
    }

    /// Queues a fleet's task this node claimed, under the fleet's id; its
    /// end is handed back through [`FleetTasks::take_ended`].
    pub fn adopt(
        &mut self,
        id: String,
        owner: Principal,
        dispatch: TaskDispatch,
    ) -> Result<(), ErrorReply> {
        let id = self.queue(id, owner, dispatch)?;
        self.fleet.adopt(id);
        Ok(())
    }

    fn queue(
        &mut self,
        id: String,
        owner: Principal,
        dispatch: TaskDispatch,
    ) -> Result<String, ErrorReply> {
        let owner = self.owner_key(owner);
        let queued = self.running.queued(owner);
        if queued >= self.config.max_queued_per_owner {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "you have {queued} tasks queued, the most tasks.max_queued_per_owner allows; \
                     wait for some to start"
                ),
            ));
        }
        // Room is made from the owner's own finished tasks, never from
        // anyone else's.
        let kept = self.table.kept(owner);
        let full = kept >= self.config.max_retained_per_owner
            || self.table.len() >= self.config.max_retained;
        if full && !self.drop_oldest_finished(owner) {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "the kernel keeps {} tasks, {kept} of them yours (at most {} each), and \
                     none of yours has finished; wait for some to end",
                    self.table.len(),
                    self.config.max_retained_per_owner
                ),
            ));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let record = new_record(&id, seq, owner, &dispatch);
        self.saving.write(Write::Insert(record.clone()));
        self.spans.open(&id, &dispatch);
        self.table.insert(Task::from_record(record, Some(dispatch)));
        self.running.push(id.clone(), owner);
        Ok(id)
    }

    /// `reply` (a dispatch's) goes to `reply_to` once everything written
    /// so far — the task's record with it — is saved: an id a caller holds
    /// survives a crash. Until then the task waits out of the queue, so a
    /// task whose record cannot be saved never runs.
    pub fn reply_once_saved(&mut self, reply_to: ReplyTo, reply: Answer) {
        if let Some(id) = self.saving.hold(reply_to, reply) {
            self.running.set_aside(&id);
        }
    }

    /// After the store's wake-up: dispatches whose records are saved are
    /// answered and their tasks queued; those the store could not save
    /// are answered with the cause (`unavailable`) and their tasks
    /// forgotten. True when tasks were queued: the kernel starts them.
    pub fn on_saved(&mut self, replies: &mut Vec<Reply>) -> bool {
        // The count first: the store reports a refusal before it counts
        // past it, so every refusal the count covers is in hand.
        let applied = self.saving.applied();
        for refused in self.saving.take_refused() {
            let why = ErrorReply::new(
                ErrorCode::Unavailable,
                format!(
                    "the task store cannot save tasks: {}; the task was not queued",
                    refused.cause
                ),
            );
            for id in &refused.tasks {
                if let Some(reply_to) = self.saving.refuse(id) {
                    replies.push((reply_to, why.clone().into()));
                }
                self.forget_unsaved(id, &why, replies);
            }
        }
        let mut queued = false;
        for held in self.saving.saved(applied) {
            // A task cancelled (or gone) meanwhile stays out of the queue.
            if let Some(id) = held.task.filter(|id| {
                self.table
                    .get(id)
                    .is_some_and(|task| task.state == TaskState::Queued)
            }) {
                self.running.put_back(id);
                queued = true;
            }
            replies.push((held.reply_to, held.reply));
        }
        queued
    }

    /// Removes a task whose record the store could not save: it never ran
    /// (it waited for the save), and no one is told of it again; whoever
    /// waits for it (having seen it listed) is answered with `why`.
    fn forget_unsaved(&mut self, id: &str, why: &ErrorReply, replies: &mut Vec<Reply>) {
        let Some(task) = self.table.remove(id) else {
            return;
        };
        if task.state == TaskState::Queued {
            self.running.withdraw(id, task.owner);
        }
        self.saving.forget_results(&[task.id]);
        for reply_to in self.waiters.take(id) {
            replies.push((reply_to, why.clone().into()));
        }
    }

    /// Queued tasks whose owners have room to run one more, now running:
    /// the kernel starts each, replying to `ReplyTo::Task(number)`. A
    /// prompt loop's THINK is told of the tools on the menu that fit.
    pub fn startable(&mut self, tools: &ToolMenu<'_>) -> Vec<Start> {
        let max_running = self.config.max_running_per_owner;
        let started = self.running.startable(&mut self.table, tools, max_running);
        let mut starts = Vec::with_capacity(started.len());
        for Started {
            id,
            started_ms,
            mut start,
        } in started
        {
            start.trace = self.spans.context(&id);
            self.saving.write(Write::Started { id, started_ms });
            starts.push(start);
        }
        starts
    }

    /// The reply of the work numbered `number`: its task has finished
    /// (a reply for a task cancelled meanwhile is ignored), and its waiters
    /// are answered. A prompt loop's step is answered instead: what it
    /// does next comes back as work for the kernel to start.
    pub fn on_reply(
        &mut self,
        number: u64,
        answer: Answer,
        replies: &mut Vec<Reply>,
    ) -> Option<Start> {
        match self.running.on_reply(&mut self.table, number, answer)? {
            Replied::Next { id, mut start } => {
                start.trace = self.spans.context(&id);
                Some(*start)
            }
            Replied::Finished { id, state, result } => {
                self.finish(&id, state, result, replies);
                None
            }
        }
    }

    /// Ends a task: its result kept, its waiters answered, its owner's
    /// place freed.
    fn finish(&mut self, id: &str, state: TaskState, result: Vec<u8>, replies: &mut Vec<Reply>) {
        let Some(task) = self.table.get_mut(id) else {
            return;
        };
        if task.state.is_finished() {
            self.spans.drop_span(id);
            return;
        }
        self.spans.end(id, state);
        self.running.end(task);
        let (finished_ms, output) = task.end(state);
        let label = task.label.clone();
        let owner = task.owner.principal();
        (self.ended).push(Event::task_ended(owner, id, task.kind, label, state));
        // Only a waiter needs the task as a reply.
        let reply = self.waiters.waits_for(id).then(|| {
            Answer::json(&TaskReply {
                success: true,
                task: task.info(Some(&result)),
            })
        });
        let result = Arc::new(result);
        self.saving.write(Write::Finished {
            id: id.to_owned(),
            state,
            finished_ms,
            result: result.clone(),
            output,
        });
        self.fleet.ended(id, state, &result);
        self.saving.keep_result(id, result);
        if let Some(reply) = reply {
            for reply_to in self.waiters.take(id) {
                replies.push((reply_to, reply.clone()));
            }
        }
    }

    /// The kernel could not start a task's work: it fails with `why`.
    pub fn failed_to_start(&mut self, number: u64, why: ErrorReply, replies: &mut Vec<Reply>) {
        if let Some(id) = self.running.end_work(number) {
            self.finish(&id, TaskState::Failed, why.to_json(), replies);
        }
    }

    /// `cancel`: a queued task is cancelled at once; a running one too,
    /// and the kernel stops its work. Returns whether it was still going,
    /// and what to stop.
    pub fn cancel(
        &mut self,
        reach: Reach,
        id: &str,
        replies: &mut Vec<Reply>,
    ) -> Result<(bool, Option<CancelledWork>), ErrorReply> {
        let task = self.owned(reach, id)?;
        if task.state.is_finished() {
            return Ok((false, None));
        }
        let why = match reach {
            Reach::Own(_) => "the task was cancelled by its owner",
            Reach::Any => "the task was cancelled by an operator",
        };
        let id = id.to_owned();
        Ok((true, self.cancel_with(&id, why, replies)))
    }

    /// Ends `owner`'s queued and running tasks, cancelled because `why`
    /// (an agent or a run has ended, and its work with it). Returns what
    /// the kernel must stop.
    pub fn end_owner(
        &mut self,
        owner: Principal,
        why: &str,
        replies: &mut Vec<Reply>,
    ) -> Vec<CancelledWork> {
        let owner = self.owner_key(owner);
        let going = self
            .table
            .ids(|task| task.owner == owner && !task.state.is_finished());
        going
            .iter()
            .filter_map(|id| self.cancel_with(id, why, replies))
            .collect()
    }

    /// Removes every task of `owner`: a run's, once the run is over and
    /// its tasks have ended — no one but an operator could ask for them
    /// again, and they would hold their room for a day.
    pub fn forget_owner(&mut self, owner: Principal) {
        let owner = self.owner_key(owner);
        let ids = self.table.ids(|task| task.owner == owner);
        if !ids.is_empty() {
            self.remove(&ids);
        }
    }

    /// Ends a task that is still going as `cancelled`, with `why`; returns
    /// what to stop of its work.
    fn cancel_with(
        &mut self,
        id: &str,
        why: &str,
        replies: &mut Vec<Reply>,
    ) -> Option<CancelledWork> {
        let work = self
            .table
            .get(id)
            .and_then(|task| task.number)
            .map(|number| CancelledWork { number });
        self.finish(id, TaskState::Cancelled, cancelled(why), replies);
        work
    }

    /// Whether running tasks' output is due to be looked at (and saved).
    pub fn progress_due(&mut self, now: Instant) -> bool {
        self.running.progress_due(now)
    }

    /// A running task has printed `output` so far (its tail). With `save`,
    /// a change goes to the store too.
    pub fn progress(&mut self, number: u64, output: String, save: bool) {
        let Some(task) = self
            .running
            .task_of(number)
            .and_then(|id| self.table.get_mut(id))
        else {
            return;
        };
        if task.output != output {
            task.output = output;
            task.output_unsaved = true;
        }
        if save && task.output_unsaved {
            task.output_unsaved = false;
            let write = Write::Output {
                id: task.id.clone(),
                output: task.output.clone(),
            };
            self.saving.write(write);
        }
    }

    /// The kernel is stopping: nothing more starts (queued tasks wait for
    /// the next kernel), and running tasks end `interrupted`, with what
    /// they had printed; their work's replies, when the kernel stops it,
    /// are for no one.
    pub fn stop(&mut self, replies: &mut Vec<Reply>) {
        for id in self.running.stop() {
            let output = self.table.get(&id).map_or("", |t| t.output.as_str());
            let result = interrupted(KERNEL_STOPPED, output);
            self.finish(&id, TaskState::Interrupted, result, replies);
        }
    }

    /// Removes finished tasks older than the retention.
    fn expire(&mut self, now_ms: i64) {
        let expired = self
            .table
            .finished_before(now_ms - (self.config.retention_secs as i64) * 1000);
        if !expired.is_empty() {
            log::debug!("tasks: {} expired", expired.len());
            self.remove(&expired);
        }
    }

    /// Makes room for one more task of `owner`: its oldest finished one
    /// goes.
    fn drop_oldest_finished(&mut self, owner: OwnerKey) -> bool {
        let oldest = self.table.oldest_finished(owner);
        oldest.map(|id| self.remove(&[id])).is_some()
    }

    /// Removes tasks `ids`, from memory and from the store.
    fn remove(&mut self, ids: &[String]) {
        for id in ids {
            self.table.remove(id);
        }
        self.saving.forget_results(ids);
        self.saving.write(Write::Delete(ids.to_vec()));
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

    /// Queued tasks per owner.
    #[cfg(test)]
    fn queued_per_owner(&self) -> &PerOwner {
        self.running.queued_per_owner()
    }

    /// The store.
    #[cfg(test)]
    fn store(&self) -> &S {
        self.saving.store()
    }

    /// The store, to drive it.
    #[cfg(test)]
    fn store_mut(&mut self) -> &mut S {
        self.saving.store_mut()
    }

    /// Tasks kept per owner.
    #[cfg(test)]
    fn kept_per_owner(&self) -> &PerOwner {
        self.table.kept_per_owner()
    }
}
