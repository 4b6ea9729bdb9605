//! TASK: background work that belongs to its caller's principal (an agent,
//! or an operator's uid), outlives the connection that dispatched it, and —
//! through the [`store`] — the kernel process that ran it.
//!
//! This module decides; the kernel acts. Dispatched tasks queue per owner
//! and start while the owner has fewer than `tasks.max_running_per_owner`
//! running ([`Tasks::startable`] hands the kernel what to start, each with a
//! number its reply comes back under: `ReplyTo::Task(number)`). A reply
//! finishes the task and answers its waiters; a cancel ends it at once and
//! tells the kernel what to stop; a reply that comes after is ignored.
//!
//! Nothing here blocks: the store is written by its own thread, and a
//! result no longer held in memory is read back by a worker.

pub mod prompt;
pub mod store;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::payload::{
    to_json, ExecRequest, PrincipalInfo, StoppedResult, TaskDispatch, TaskInfo, TaskKind, TaskList,
    TaskListReply, TaskProgress, TaskReply, TaskState, ThinkRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};
use serde_json::Value;

use crate::address::{Answer, Reply, ReplyTo};
use crate::clock::rfc3339;
use crate::config::tasks::TasksConfig;
use crate::identity::Principal;
use crate::timers::Timers;
use prompt::{PromptLoop, Step};
use store::{now_ms, Record, Store, Write};

/// How often expired tasks are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// A `wait` without a timeout waits this long.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// How often running tasks' output is looked at and saved (so a task
/// interrupted by a crash keeps what it had printed).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Bytes of a running task's output its progress shows.
pub const PROGRESS_BYTES: usize = 4096;

/// Whose a task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// An agent of this kernel's life (`boot`): agents do not outlive the
    /// kernel, so neither does their claim on tasks.
    Agent {
        /// This kernel's boot number.
        boot: u64,
        /// The agent's id.
        id: u32,
    },
    /// An operator, by uid: their tasks are theirs across restarts.
    User(u32),
    /// An EXEC run of this kernel's life: its tasks end with it.
    Run {
        /// This kernel's boot number.
        boot: u64,
        /// The run's number.
        number: u64,
    },
}

impl Owner {
    /// How the store names it.
    pub fn key(self) -> String {
        match self {
            Owner::Agent { boot, id } => format!("agent:{boot:x}:{id}"),
            Owner::User(uid) => format!("user:{uid}"),
            Owner::Run { boot, number } => format!("run:{boot:x}:{number}"),
        }
    }
}

/// Which tasks a request reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// One owner's: everyone else's are `not_found`.
    Own(Owner),
    /// Every owner's (an operator's reach).
    Any,
}

/// What the kernel should start for a task, replying to
/// `ReplyTo::Task(number)`.
#[derive(Debug)]
pub struct Start {
    /// The number its reply comes back under.
    pub number: u64,
    /// Whose it is.
    pub owner: Principal,
    /// What to run (or why it cannot be run).
    pub work: Result<Work, ErrorReply>,
}

/// A piece of a task's work.
#[derive(Debug)]
pub enum Work {
    /// An EXEC run.
    Exec(ExecRequest),
    /// A THINK.
    Think(ThinkRequest),
}

/// What the kernel should stop after a cancel: the work replying under
/// this number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stop {
    /// The number the task's work replies under.
    pub number: u64,
}

/// What a `wait` came to.
#[derive(Debug)]
pub enum Waited {
    /// The reply, now.
    Reply(Vec<u8>),
    /// The task has finished but its result is only in the store: read it
    /// (on a worker) and answer with it.
    ReadResult {
        /// The database.
        path: PathBuf,
        /// The task as it is, without its result.
        task: Box<TaskInfo>,
    },
    /// The reply comes when the task ends or the wait times out.
    Later,
}

#[derive(Debug)]
struct Task {
    id: String,
    seq: u64,
    owner: String,
    kind: TaskKind,
    label: Option<String>,
    state: TaskState,
    created_ms: i64,
    started_ms: Option<i64>,
    finished_ms: Option<i64>,
    /// What to run, until it has started.
    dispatch: Option<TaskDispatch>,
    /// The finished result, while held in memory.
    result: Option<Arc<Vec<u8>>>,
    /// The number its running work replies under.
    number: Option<u64>,
    /// What it has printed, for `status` while it runs.
    output: String,
    /// For a prompt loop: the iteration under way.
    iteration: Option<u32>,
    /// Whether `output` has changed since it was saved.
    output_unsaved: bool,
}

impl Task {
    fn info(&self, result: Option<Value>) -> TaskInfo {
        TaskInfo {
            task_id: self.id.clone(),
            kind: self.kind,
            label: self.label.clone(),
            state: self.state,
            created_at: rfc3339_ms(self.created_ms),
            started_at: self.started_ms.map(rfc3339_ms),
            finished_at: self.finished_ms.map(rfc3339_ms),
            progress: (self.state == TaskState::Running).then(|| TaskProgress {
                output: self.output.clone(),
                iteration: self.iteration,
            }),
            result,
            owner: None,
        }
    }
}

/// A dispatch's reply, held until its task's record is saved.
#[derive(Debug)]
struct Held {
    /// The write that saves the record.
    write: u64,
    /// The task, waiting out of the queue.
    task: Option<String>,
    reply_to: ReplyTo,
    reply: Answer,
}

/// Every task, and the store behind them.
#[derive(Debug)]
pub struct Tasks {
    tasks: HashMap<String, Task>,
    /// Ids by creation order.
    by_seq: BTreeMap<u64, String>,
    /// Queued ids, oldest first.
    queue: VecDeque<String>,
    /// Running tasks by the number their work replies under.
    running: HashMap<u64, String>,
    running_per_owner: HashMap<String, usize>,
    /// Tasks kept, per owner.
    kept_per_owner: HashMap<String, usize>,
    /// Dispatches held until their task's record is saved; their tasks
    /// wait out of the queue meanwhile.
    unsaved: VecDeque<Held>,
    /// The last new task's record handed to the store: the write, the task.
    last_insert: Option<(u64, String)>,
    /// Prompt tasks' loops, by task id.
    prompts: HashMap<String, PromptLoop>,
    /// Sessions of prompt loops that have ended, for the kernel to close.
    ended_sessions: Vec<(Principal, String)>,
    queued_per_owner: HashMap<String, usize>,
    /// Waits under way, by task id: each waiter's number and address.
    waiters: HashMap<String, Vec<(u64, ReplyTo)>>,
    /// When each wait times out (a wait answered meanwhile is gone from
    /// `waiters` and its timer does nothing).
    wait_timers: Timers<(String, u64)>,
    next_waiter: u64,
    store: Store,
    /// Writes handed to the store so far, and how many it has applied:
    /// a result leaves memory only once it is on disk.
    written: u64,
    applied: Arc<AtomicU64>,
    /// Results in memory, oldest first, with the write that saved each.
    cached: VecDeque<(String, u64, usize)>,
    cached_bytes: usize,
    next_seq: u64,
    next_number: u64,
    boot: u64,
    config: TasksConfig,
    next_sweep: Instant,
    /// When running tasks' output is next looked at.
    next_progress: Instant,
    /// The kernel is stopping: no task starts.
    stopping: bool,
}

impl Tasks {
    /// The tasks of the store in the state directory of the kernel serving
    /// `socket` (see `TasksConfig::state_dir`): queued ones
    /// an operator dispatched run again; an agent's from an earlier kernel
    /// end `interrupted` (the agent is gone), as do those that were running.
    pub fn open(
        config: &TasksConfig,
        socket: &std::path::Path,
        waker: Arc<mio::Waker>,
        now: Instant,
    ) -> Result<Tasks, store::StoreError> {
        let dir = config.state_dir(socket);
        let (store, records) = Store::open(&dir, &config.private_from(socket), waker)?;
        let boot = random_u64();
        let mut tasks = Tasks {
            tasks: HashMap::new(),
            by_seq: BTreeMap::new(),
            queue: VecDeque::new(),
            running: HashMap::new(),
            running_per_owner: HashMap::new(),
            kept_per_owner: HashMap::new(),
            unsaved: VecDeque::new(),
            last_insert: None,
            prompts: HashMap::new(),
            ended_sessions: Vec::new(),
            queued_per_owner: HashMap::new(),
            waiters: HashMap::new(),
            wait_timers: Timers::default(),
            next_waiter: 1,
            written: 0,
            applied: store.applied(),
            store,
            cached: VecDeque::new(),
            cached_bytes: 0,
            next_seq: 1,
            next_number: 1,
            boot,
            config: config.clone(),
            next_sweep: now,
            next_progress: now,
            stopping: false,
        };
        let count = records.len();
        for record in records {
            tasks.restore(record);
        }
        log::info!(
            "tasks: {count} in the store at {} ({} queued to run)",
            dir.display(),
            tasks.queue.len()
        );
        Ok(tasks)
    }

    /// A task from the store.
    fn restore(&mut self, record: Record) {
        let Some(kind) = TaskKind::from_name(&record.kind) else {
            return;
        };
        let mut state = TaskState::from_name(&record.state).unwrap_or(TaskState::Interrupted);
        let dispatch = serde_json::from_str::<Value>(&record.request)
            .ok()
            .map(|request| TaskDispatch {
                kind,
                request,
                label: record.label.clone(),
            });
        let mut finished_ms = record.finished_ms;
        if state == TaskState::Queued && (dispatch.is_none() || !record.owner.starts_with("user:"))
        {
            // Its agent is gone with the kernel that ran it.
            state = TaskState::Interrupted;
            finished_ms = Some(now_ms());
            self.write(Write::Finished {
                id: record.id.clone(),
                state: state.as_str().into(),
                finished_ms: now_ms(),
                result: Arc::new(interrupted_result("its agent ended with the kernel", "")),
                output: None,
            });
        }
        self.next_seq = self.next_seq.max(record.seq + 1);
        let task = Task {
            id: record.id.clone(),
            seq: record.seq,
            owner: record.owner,
            kind,
            label: record.label,
            state,
            created_ms: record.created_ms,
            started_ms: record.started_ms,
            finished_ms,
            dispatch: (state == TaskState::Queued).then_some(dispatch).flatten(),
            result: None,
            number: None,
            output: record.output.unwrap_or_default(),
            iteration: None,
            output_unsaved: false,
        };
        if state == TaskState::Queued {
            self.queue.push_back(task.id.clone());
            *self.queued_per_owner.entry(task.owner.clone()).or_default() += 1;
        }
        self.by_seq.insert(task.seq, task.id.clone());
        *self.kept_per_owner.entry(task.owner.clone()).or_default() += 1;
        self.tasks.insert(task.id.clone(), task);
    }

    /// This kernel's boot number (agents' tasks are tied to it).
    pub fn boot(&self) -> u64 {
        self.boot
    }

    /// `reply` (a dispatch's) goes to `reply_to` once everything written
    /// so far — the task's record with it — is saved: an id a caller holds
    /// survives a crash. Until then the task waits out of the queue, so a
    /// task whose record cannot be saved never runs.
    pub fn reply_once_saved(&mut self, reply_to: ReplyTo, reply: Answer) {
        let task = self
            .last_insert
            .take()
            .filter(|(write, _)| *write == self.written)
            .map(|(_, id)| id);
        if let Some(id) = &task {
            if self.queue.back() == Some(id) {
                self.queue.pop_back();
            } else {
                self.queue.retain(|queued| queued != id);
            }
        }
        self.unsaved.push_back(Held {
            write: self.written,
            task,
            reply_to,
            reply,
        });
    }

    /// After the writer's wake-up: dispatches whose records are saved are
    /// answered and their tasks queued; those the store could not save
    /// are answered with the cause (`unavailable`) and their tasks
    /// forgotten. True when tasks were queued: the kernel starts them.
    pub fn on_saved(&mut self, replies: &mut Vec<Reply>) -> bool {
        // The count first: the writer reports a refusal before it counts
        // past it, so every refusal the count covers is in hand.
        let applied = self.applied.load(Ordering::Acquire);
        for refused in self.store.take_refused() {
            let why = ErrorReply::new(
                ErrorCode::Unavailable,
                format!(
                    "the task store cannot save tasks: {}; the task was not queued",
                    refused.cause
                ),
            );
            for id in &refused.tasks {
                let held = self
                    .unsaved
                    .iter()
                    .position(|held| held.task.as_ref() == Some(id));
                if let Some(held) = held.and_then(|at| self.unsaved.remove(at)) {
                    replies.push((held.reply_to, why.clone().into()));
                }
                self.forget_unsaved(id, &why, replies);
            }
        }
        let mut queued = false;
        while self
            .unsaved
            .front()
            .is_some_and(|held| held.write <= applied)
        {
            let Some(held) = self.unsaved.pop_front() else {
                break;
            };
            // A task cancelled (or gone) meanwhile stays out of the queue.
            if let Some(id) = held.task.filter(|id| {
                self.tasks
                    .get(id)
                    .is_some_and(|task| task.state == TaskState::Queued)
            }) {
                self.queue.push_back(id);
                queued = true;
            }
            replies.push((held.reply_to, held.reply));
        }
        self.evict();
        queued
    }

    /// Removes a task whose record the store could not save: it never ran
    /// (it waited for the save), and no one is told of it again; whoever
    /// waits for it (having seen it listed) is answered with `why`.
    fn forget_unsaved(&mut self, id: &str, why: &ErrorReply, replies: &mut Vec<Reply>) {
        let Some(task) = self.tasks.remove(id) else {
            return;
        };
        self.by_seq.remove(&task.seq);
        if let Some(kept) = self.kept_per_owner.get_mut(&task.owner) {
            *kept = kept.saturating_sub(1);
            if *kept == 0 {
                self.kept_per_owner.remove(&task.owner);
            }
        }
        if task.state == TaskState::Queued {
            self.queue.retain(|queued| queued != id);
            count_down(&mut self.queued_per_owner, &task.owner);
        }
        if let Some(result) = task.result {
            self.cached_bytes = self.cached_bytes.saturating_sub(result.len());
            self.cached.retain(|(cached, _, _)| cached != id);
        }
        for (_, reply_to) in self.waiters.remove(id).unwrap_or_default() {
            replies.push((reply_to, why.clone().into()));
        }
    }

    /// Queues a task for `owner`; returns its id.
    pub fn dispatch(&mut self, owner: Owner, dispatch: TaskDispatch) -> Result<String, ErrorReply> {
        let key = owner.key();
        let queued = self.queued_per_owner.get(&key).copied().unwrap_or(0);
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
        let kept = self.kept_per_owner.get(&key).copied().unwrap_or(0);
        let full = kept >= self.config.max_retained_per_owner
            || self.tasks.len() >= self.config.max_retained;
        if full && !self.drop_oldest_finished(&key) {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "the kernel keeps {} tasks, {kept} of them yours (at most {} each), and \
                     none of yours has finished; wait for some to end",
                    self.tasks.len(),
                    self.config.max_retained_per_owner
                ),
            ));
        }
        let id = new_id();
        let seq = self.next_seq;
        self.next_seq += 1;
        let created_ms = now_ms();
        self.write(Write::Insert(Record {
            id: id.clone(),
            seq,
            owner: key.clone(),
            kind: dispatch.kind.as_str().into(),
            label: dispatch.label.clone(),
            state: TaskState::Queued.as_str().into(),
            request: dispatch.request.to_string(),
            created_ms,
            started_ms: None,
            finished_ms: None,
            output: None,
        }));
        let task = Task {
            id: id.clone(),
            seq,
            owner: key.clone(),
            kind: dispatch.kind,
            label: dispatch.label.clone(),
            state: TaskState::Queued,
            created_ms,
            started_ms: None,
            finished_ms: None,
            dispatch: Some(dispatch),
            result: None,
            number: None,
            output: String::new(),
            iteration: None,
            output_unsaved: false,
        };
        self.by_seq.insert(seq, id.clone());
        *self.kept_per_owner.entry(key.clone()).or_default() += 1;
        self.tasks.insert(id.clone(), task);
        self.queue.push_back(id.clone());
        *self.queued_per_owner.entry(key).or_default() += 1;
        Ok(id)
    }

    /// Queued tasks whose owners have room to run one more, now running:
    /// the kernel starts each, replying to `ReplyTo::Task(number)`.
    /// Whether a prompt task is waiting to start (its first THINK needs the
    /// list of tools).
    pub fn prompt_queued(&self) -> bool {
        self.queue.iter().any(|id| {
            self.tasks
                .get(id)
                .is_some_and(|t| t.kind == TaskKind::Prompt)
        })
    }

    /// The sessions of prompt loops that have ended (taken): the kernel
    /// closes them.
    pub fn take_ended_sessions(&mut self) -> Vec<(Principal, String)> {
        std::mem::take(&mut self.ended_sessions)
    }

    /// Queued tasks whose owners have room to run one more, now running:
    /// the kernel starts each, replying to `ReplyTo::Task(number)`. A
    /// prompt loop's THINK is told of `tools` (a line each).
    pub fn startable(&mut self, tools: &str) -> Vec<Start> {
        let mut starts = Vec::new();
        if self.stopping {
            return starts;
        }
        let mut skipped = VecDeque::new();
        while let Some(id) = self.queue.pop_front() {
            let Some(task) = self.tasks.get_mut(&id) else {
                continue;
            };
            let running = self.running_per_owner.get(&task.owner).copied();
            if running.unwrap_or(0) >= self.config.max_running_per_owner {
                skipped.push_back(id);
                continue;
            }
            let Some(dispatch) = task.dispatch.take() else {
                continue;
            };
            *self
                .running_per_owner
                .entry(task.owner.clone())
                .or_default() += 1;
            count_down(&mut self.queued_per_owner, &task.owner);
            let number = self.next_number;
            self.next_number += 1;
            task.state = TaskState::Running;
            task.number = Some(number);
            let started_ms = now_ms();
            task.started_ms = Some(started_ms);
            let owner = owner_ref(&task.owner);
            let id = task.id.clone();
            let work = match dispatch.kind {
                TaskKind::Exec => dispatch.exec().map(Work::Exec),
                TaskKind::Think => dispatch.think().map(Work::Think),
                TaskKind::Prompt => dispatch.prompt().map(|request| {
                    let session = request
                        .session
                        .clone()
                        .unwrap_or_else(|| format!("task-{id}"));
                    let (prompt, think) = PromptLoop::start(request, session, tools);
                    task.iteration = Some(prompt.iteration());
                    self.prompts.insert(id.clone(), prompt);
                    Work::Think(think)
                }),
            };
            self.running.insert(number, id.clone());
            self.write(Write::Started { id, started_ms });
            starts.push(Start {
                number,
                owner,
                work,
            });
        }
        self.queue = skipped;
        starts
    }

    /// The reply of the work numbered `number`: its task has finished
    /// (a reply for a task cancelled meanwhile is ignored). Its waiters
    /// are answered.
    /// A prompt loop's step is answered instead: what it does next comes
    /// back as work for the kernel to start.
    pub fn on_reply(
        &mut self,
        number: u64,
        answer: Answer,
        replies: &mut Vec<Reply>,
    ) -> Option<Start> {
        let id = self.running.get(&number)?.clone();
        if let Some(prompt) = self.prompts.get_mut(&id) {
            let step = prompt.on_answer(answer);
            let iteration = prompt.iteration();
            let owner = self.tasks.get_mut(&id).map(|task| {
                task.iteration = Some(iteration);
                owner_ref(&task.owner)
            })?;
            let work = match step {
                Step::Think(think) => Work::Think(think),
                Step::Exec(run) => Work::Exec(run),
                Step::Done { answered, result } => {
                    let state = if answered {
                        TaskState::Completed
                    } else {
                        TaskState::Failed
                    };
                    self.finish(&id, state, result, replies);
                    return None;
                }
            };
            return Some(Start {
                number,
                owner,
                work: Ok(work),
            });
        }
        self.running.remove(&number);
        let state = state_of(&answer);
        self.finish(&id, state, answer.into_json(), replies);
        None
    }

    /// Ends a task: its result kept, its waiters answered, its owner's
    /// place freed.
    fn finish(&mut self, id: &str, state: TaskState, result: Vec<u8>, replies: &mut Vec<Reply>) {
        let Some(task) = self.tasks.get_mut(id) else {
            return;
        };
        let was = task.state;
        if was.is_finished() {
            return;
        }
        let counts = if was == TaskState::Running {
            &mut self.running_per_owner
        } else {
            &mut self.queued_per_owner
        };
        count_down(counts, &task.owner);
        if was == TaskState::Queued {
            self.queue.retain(|queued| queued != id);
        }
        if let Some(number) = task.number.take() {
            self.running.remove(&number);
        }
        if let Some(prompt) = self.prompts.remove(id) {
            // A session the loop made for itself goes with it; one its
            // owner named stays the owner's.
            if prompt.owns_session() {
                self.ended_sessions
                    .push((owner_ref(&task.owner), prompt.session().to_owned()));
            }
        }
        let finished_ms = now_ms();
        task.state = state;
        task.finished_ms = Some(finished_ms);
        task.dispatch = None;
        let result = Arc::new(result);
        task.result = Some(result.clone());
        let output = (!task.output.is_empty()).then(|| std::mem::take(&mut task.output));
        // Only a waiter needs the task as a reply.
        let info = self
            .waiters
            .contains_key(id)
            .then(|| task.info(serde_json::from_slice(&result).ok()));
        self.write(Write::Finished {
            id: id.to_owned(),
            state: state.as_str().into(),
            finished_ms,
            result: result.clone(),
            output,
        });
        self.cached
            .push_back((id.to_owned(), self.written, result.len()));
        self.cached_bytes += result.len();
        self.evict();
        if let (Some(info), Some(waiters)) = (info, self.waiters.remove(id)) {
            let payload = Answer::json(&TaskReply {
                success: true,
                task: info,
            });
            for (_, reply_to) in waiters {
                replies.push((reply_to, payload.clone()));
            }
        }
    }

    /// The kernel could not start a task's work: it fails with `why`.
    pub fn failed_to_start(&mut self, number: u64, why: ErrorReply, replies: &mut Vec<Reply>) {
        if let Some(id) = self.running.remove(&number) {
            self.finish(&id, TaskState::Failed, why.to_json(), replies);
        }
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
            return Ok(match &task.result {
                Some(result) => Waited::Reply(to_json(&TaskReply {
                    success: true,
                    task: task.info(serde_json::from_slice(result).ok()),
                })),
                None => Waited::ReadResult {
                    path: self.store.path().to_path_buf(),
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
        let number = self.next_waiter;
        self.next_waiter += 1;
        self.waiters
            .entry(id.to_owned())
            .or_default()
            .push((number, reply_to));
        self.wait_timers
            .schedule(now + timeout, (id.to_owned(), number));
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
        let key = match reach {
            Reach::Own(owner) => Some(owner.key()),
            Reach::Any => None,
        };
        let before = match &filter.before {
            Some(id) => self.owned(reach, id)?.seq,
            None => u64::MAX,
        };
        let limit = filter.limit.unwrap_or(50) as usize;
        let mut tasks = Vec::new();
        let mut next = None;
        for (_, id) in self.by_seq.range(..before).rev() {
            let Some(task) = self.tasks.get(id) else {
                continue;
            };
            if key.as_ref().is_some_and(|key| task.owner != *key)
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
            info.owner = describe.map(|describe| self.describe_owner(&task.owner, describe));
            tasks.push(info);
        }
        Ok(TaskListReply {
            success: true,
            tasks,
            next,
        })
    }

    /// Whose a task of owner `key` is, as a list says it: this kernel's
    /// agents and runs by what `describe` knows of them, an earlier
    /// kernel's by their number alone (this kernel's may have the same).
    fn describe_owner(
        &self,
        key: &str,
        describe: &dyn Fn(Principal) -> PrincipalInfo,
    ) -> PrincipalInfo {
        let owner = owner_ref(key);
        let this_boot = key.starts_with("user:")
            || key.split(':').nth(1) == Some(format!("{:x}", self.boot).as_str());
        match owner {
            _ if this_boot => describe(owner),
            Principal::Agent { id } => PrincipalInfo::Agent { id, name: None },
            Principal::Run { .. } => PrincipalInfo::Run { of: None },
            Principal::Operator { uid } => PrincipalInfo::Operator { uid },
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
    ) -> Result<(bool, Option<Stop>), ErrorReply> {
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
    pub fn end_owner(&mut self, owner: Owner, why: &str, replies: &mut Vec<Reply>) -> Vec<Stop> {
        let key = owner.key();
        let going: Vec<String> = self
            .tasks
            .values()
            .filter(|task| task.owner == key && !task.state.is_finished())
            .map(|task| task.id.clone())
            .collect();
        going
            .iter()
            .filter_map(|id| self.cancel_with(id, why, replies))
            .collect()
    }

    /// Removes every task of `owner`: a run's, once the run is over and
    /// its tasks have ended — no one but an operator could ask for them
    /// again, and they would hold their room for a day.
    pub fn forget_owner(&mut self, owner: Owner) {
        let key = owner.key();
        let ids: Vec<String> = self
            .tasks
            .values()
            .filter(|task| task.owner == key)
            .map(|task| task.id.clone())
            .collect();
        if !ids.is_empty() {
            self.remove(&ids);
        }
    }

    /// Ends a task that is still going as `cancelled`, with `why`; returns
    /// what to stop of its work.
    fn cancel_with(&mut self, id: &str, why: &str, replies: &mut Vec<Reply>) -> Option<Stop> {
        let stop = self
            .tasks
            .get(id)
            .and_then(|task| task.number)
            .map(|number| Stop { number });
        let result = to_json(&StoppedResult::cancelled(why));
        self.finish(id, TaskState::Cancelled, result, replies);
        stop
    }

    /// The numbers of the work of every running task.
    pub fn running(&self) -> Vec<u64> {
        self.running.keys().copied().collect()
    }

    /// The number of task `id`'s work, while it runs.
    pub fn number_of(&self, id: &str) -> Option<u64> {
        self.tasks.get(id)?.number
    }

    /// Whether running tasks' output is due to be looked at (and saved).
    pub fn progress_due(&mut self, now: Instant) -> bool {
        if self.running.is_empty() || now < self.next_progress {
            return false;
        }
        self.next_progress = now + PROGRESS_EVERY;
        true
    }

    /// A running task has printed `output` so far (its tail). With `save`,
    /// a change goes to the store too.
    pub fn progress(&mut self, number: u64, output: String, save: bool) {
        let Some(task) = self
            .running
            .get(&number)
            .and_then(|id| self.tasks.get_mut(id))
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
            self.write(write);
        }
    }

    /// The kernel is stopping: nothing more starts (queued tasks wait for
    /// the next kernel), and running tasks end `interrupted`, with what
    /// they had printed; their work's replies, when the kernel stops it,
    /// are for no one.
    pub fn stop(&mut self, replies: &mut Vec<Reply>) {
        self.stopping = true;
        let running: Vec<String> = self.running.values().cloned().collect();
        for id in running {
            let output = self.tasks.get(&id).map_or("", |t| t.output.as_str());
            let result = interrupted_result("the kernel stopped while the task ran", output);
            self.finish(&id, TaskState::Interrupted, result, replies);
        }
    }

    /// Last step of shutdown (blocks briefly): every change is saved, or
    /// the log names what could not be.
    pub fn finish_shutdown(&mut self) {
        self.store.close();
    }

    /// Waits for a connection that closed are dropped.
    pub fn connection_closed(&mut self, serial: u64) {
        self.waiters.retain(|_, waiting| {
            waiting.retain(|(_, reply_to)| reply_to.connection() != Some(serial));
            !waiting.is_empty()
        });
    }

    /// When the next wait times out, or the next sweep is due.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        let progress = (!self.running.is_empty()).then_some(self.next_progress);
        [self.next_sweep]
            .into_iter()
            .chain(progress)
            .map(|at| at.saturating_duration_since(now))
            .chain(self.wait_timers.time_to_next(now))
            .min()
    }

    /// Waits that timed out are answered with their task as it is;
    /// expired tasks are removed.
    pub fn on_deadlines(&mut self, now: Instant, replies: &mut Vec<Reply>) {
        while let Some((id, number)) = self.wait_timers.pop_due(now) {
            let Some(waiting) = self.waiters.get_mut(&id) else {
                continue;
            };
            let Some(at) = waiting.iter().position(|(n, _)| *n == number) else {
                continue;
            };
            let (_, reply_to) = waiting.swap_remove(at);
            if waiting.is_empty() {
                self.waiters.remove(&id);
            }
            if let Some(task) = self.tasks.get(&id) {
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
        let expired: Vec<String> = self
            .tasks
            .values()
            .filter(|t| t.state.is_finished() && t.finished_ms.is_some_and(|f| f < horizon))
            .map(|t| t.id.clone())
            .collect();
        if !expired.is_empty() {
            log::debug!("tasks: {} expired", expired.len());
            self.remove(&expired);
        }
    }

    /// Makes room for one more task of `owner`: its oldest finished one
    /// goes.
    fn drop_oldest_finished(&mut self, owner: &str) -> bool {
        let oldest = self
            .by_seq
            .values()
            .find(|id| {
                self.tasks
                    .get(*id)
                    .is_some_and(|t| t.owner == owner && t.state.is_finished())
            })
            .cloned();
        match oldest {
            Some(id) => {
                self.remove(&[id]);
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, ids: &[String]) {
        let gone: HashSet<&String> = ids.iter().collect();
        for id in ids {
            if let Some(task) = self.tasks.remove(id) {
                self.by_seq.remove(&task.seq);
                if let Some(kept) = self.kept_per_owner.get_mut(&task.owner) {
                    *kept = kept.saturating_sub(1);
                    if *kept == 0 {
                        self.kept_per_owner.remove(&task.owner);
                    }
                }
                if let Some(result) = task.result {
                    self.cached_bytes = self.cached_bytes.saturating_sub(result.len());
                }
            }
        }
        self.cached.retain(|(id, _, _)| !gone.contains(id));
        self.write(Write::Delete(ids.to_vec()));
    }

    /// Results beyond the memory budget leave memory, oldest first, once
    /// the store has them.
    fn evict(&mut self) {
        let applied = self.applied.load(Ordering::Acquire);
        while self.cached_bytes > self.config.result_cache_bytes {
            let Some((_, saved_by, _)) = self.cached.front() else {
                break;
            };
            if *saved_by > applied {
                break;
            }
            let Some((id, _, bytes)) = self.cached.pop_front() else {
                break;
            };
            self.cached_bytes = self.cached_bytes.saturating_sub(bytes);
            if let Some(task) = self.tasks.get_mut(&id) {
                task.result = None;
            }
        }
    }

    /// The task `id` if it is within `reach`; anyone else's is
    /// `not_found`, so ids tell nothing about other owners' tasks.
    fn owned(&self, reach: Reach, id: &str) -> Result<&Task, ErrorReply> {
        let key = match reach {
            Reach::Own(owner) => Some(owner.key()),
            Reach::Any => None,
        };
        self.tasks
            .get(id)
            .filter(|task| key.as_ref().is_none_or(|key| task.owner == *key))
            .ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::NotFound,
                    format!("you have no task {id:?} (TASK list names yours)"),
                )
            })
    }

    fn write(&mut self, write: Write) {
        self.written += 1;
        if let Write::Insert(record) = &write {
            self.last_insert = Some((self.written, record.id.clone()));
        }
        self.store.write(write);
    }
}

/// One fewer of `owner`'s; an owner with none left is forgotten, so owners
/// that come and go (runs) leave nothing behind.
fn count_down(counts: &mut HashMap<String, usize>, owner: &str) {
    if let Some(count) = counts.get_mut(owner) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            counts.remove(owner);
        }
    }
}

/// Unix milliseconds as RFC 3339 UTC.
fn rfc3339_ms(ms: i64) -> String {
    rfc3339(std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

/// A task's final state from its work's reply: an EXEC run that timed out
/// is `timed_out`; one that did not succeed is `failed`.
fn state_of(answer: &Answer) -> TaskState {
    match answer {
        Answer::Exec(run) if run.timed_out => TaskState::TimedOut,
        answer if answer.is_success() => TaskState::Completed,
        _ => TaskState::Failed,
    }
}

/// The result of a task that could not go on, with what it had printed.
fn interrupted_result(why: &str, output: &str) -> Vec<u8> {
    to_json(&StoppedResult::interrupted(why, output))
}

/// Whom a task of the store's `key` is for.
fn owner_ref(key: &str) -> Principal {
    if let Some(uid) = key.strip_prefix("user:") {
        return Principal::Operator {
            uid: uid.parse().unwrap_or(u32::MAX),
        };
    }
    let last = key.rsplit(':').next().and_then(|n| n.parse::<u64>().ok());
    match key.split(':').next() {
        Some("run") => Principal::Run {
            number: last.unwrap_or(0),
        },
        _ => Principal::Agent {
            id: last.map_or(0, |id| id as u32),
        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const OPERATOR: Owner = Owner::User(0);

    /// Tasks on a store whose disk fails while the test says so: every new
    /// record and every change to one fails, as on a full disk, with
    /// `CAUSE` (a trigger in the database raises it).
    struct Faulty {
        tasks: Tasks,
        disk: rusqlite::Connection,
        _dir: tempfile::TempDir,
    }

    const CAUSE: &str = "the disk is full (simulated)";

    impl Faulty {
        fn open(config: TasksConfig) -> Faulty {
            let dir = tempfile::tempdir().unwrap();
            let config = TasksConfig {
                state_dir: Some(dir.path().to_path_buf()),
                ..config
            };
            let open = || {
                let poll = mio::Poll::new().unwrap();
                let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
                let socket = std::path::Path::new("/unused.sock");
                Tasks::open(&config, socket, waker, Instant::now()).unwrap()
            };
            open().finish_shutdown();
            let disk = rusqlite::Connection::open(dir.path().join("tasks.db")).unwrap();
            disk.busy_timeout(Duration::from_secs(5)).unwrap();
            disk.execute_batch(&format!(
                "CREATE TABLE fault (failing INTEGER);
                 CREATE TRIGGER insert_fails BEFORE INSERT ON tasks
                 WHEN EXISTS (SELECT 1 FROM fault) BEGIN SELECT RAISE(ABORT, '{CAUSE}'); END;
                 CREATE TRIGGER update_fails BEFORE UPDATE ON tasks
                 WHEN EXISTS (SELECT 1 FROM fault) BEGIN SELECT RAISE(ABORT, '{CAUSE}'); END;"
            ))
            .unwrap();
            Faulty {
                tasks: open(),
                disk,
                _dir: dir,
            }
        }

        fn fail(&self, failing: bool) {
            let change = if failing {
                "INSERT INTO fault VALUES (1)"
            } else {
                "DELETE FROM fault"
            };
            self.disk.execute(change, []).unwrap();
        }

        /// Dispatches an EXEC task; its reply is held until it is saved.
        fn dispatch(&mut self, code: &str) -> String {
            let id = self
                .tasks
                .dispatch(
                    OPERATOR,
                    TaskDispatch {
                        kind: TaskKind::Exec,
                        request: json!({ "code": code }),
                        label: None,
                    },
                )
                .unwrap();
            self.tasks.reply_once_saved(
                ReplyTo::Task(u64::MAX),
                Answer::Json(id.clone().into_bytes()),
            );
            id
        }

        /// What the writer's wake-ups bring, once they bring a reply.
        fn answered(&mut self) -> (bool, Vec<Reply>) {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                let mut replies = Vec::new();
                let queued = self.tasks.on_saved(&mut replies);
                if !replies.is_empty() {
                    return (queued, replies);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            panic!("no dispatch was answered");
        }
    }

    #[test]
    fn stopped_results_are_the_bytes_they_have_always_been() {
        // How a cancelled and an interrupted task's results were written
        // before they were typed: an error reply, its code replaced.
        let why = "the task was cancelled by its owner";
        let mut cancelled = serde_json::to_value(ErrorReply::new(ErrorCode::Other, why)).unwrap();
        cancelled["code"] = Value::String("cancelled".into());
        assert_eq!(
            to_json(&StoppedResult::cancelled(why)),
            serde_json::to_vec(&cancelled).unwrap()
        );
        for output in ["", "1\n2\n\"quoted\" \u{e9}"] {
            let why = "the kernel stopped while the task ran";
            let mut interrupted =
                serde_json::to_value(ErrorReply::new(ErrorCode::Unavailable, why)).unwrap();
            interrupted["code"] = Value::String("interrupted".into());
            interrupted["output"] = Value::String(output.to_owned());
            assert_eq!(
                interrupted_result(why, output),
                serde_json::to_vec(&interrupted).unwrap()
            );
        }
    }

    #[test]
    fn a_dispatch_whose_record_cannot_be_saved_is_refused_with_the_cause_and_its_task_never_runs() {
        let mut faulty = Faulty::open(TasksConfig::default());
        faulty.fail(true);
        let id = faulty.dispatch("print('never')");
        // Until its record is saved, a task does not start.
        assert!(faulty.tasks.startable("").is_empty());
        let (queued, replies) = faulty.answered();
        assert!(!queued);
        let reply: Value = serde_json::from_slice(&replies[0].1.clone().into_json()).unwrap();
        assert_eq!(reply["success"], false, "{reply}");
        assert_eq!(reply["code"], "unavailable", "{reply}");
        assert_eq!(
            reply["error"],
            format!("the task store cannot save tasks: {CAUSE}; the task was not queued")
        );
        // It is gone: never listed, never started, its place in the queue
        // free.
        let status = faulty.tasks.status(Reach::Own(OPERATOR), &id).unwrap_err();
        assert_eq!(status.code, ErrorCode::NotFound);
        let list = faulty
            .tasks
            .list(Reach::Own(OPERATOR), &TaskList::default(), None)
            .unwrap();
        assert!(list.tasks.is_empty(), "{list:?}");
        assert!(faulty.tasks.startable("").is_empty());
        assert!(faulty.tasks.queued_per_owner.is_empty());
        assert!(faulty.tasks.kept_per_owner.is_empty());

        // The store recovers by itself: the next dispatch is saved,
        // answered, and its task starts.
        faulty.fail(false);
        let id = faulty.dispatch("print('saved')");
        let (queued, replies) = faulty.answered();
        assert!(queued);
        assert_eq!(replies[0].1, Answer::Json(id.clone().into_bytes()));
        let starts = faulty.tasks.startable("");
        assert_eq!(starts.len(), 1);
        assert_eq!(
            faulty
                .tasks
                .status(Reach::Own(OPERATOR), &id)
                .unwrap()
                .state,
            TaskState::Running
        );
    }

    #[test]
    fn an_end_that_cannot_be_saved_keeps_its_result_in_memory_and_is_saved_once_the_disk_recovers()
    {
        // Every result leaves memory once it is saved, and not before.
        let mut faulty = Faulty::open(TasksConfig {
            result_cache_bytes: 1,
            ..TasksConfig::default()
        });
        let id = faulty.dispatch("print(1)");
        faulty.answered();
        let start = faulty.tasks.startable("").pop().unwrap();
        let state = |disk: &rusqlite::Connection| -> String {
            disk.query_row("SELECT state FROM tasks WHERE id = ?1", [&id], |row| {
                row.get(0)
            })
            .unwrap()
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while state(&faulty.disk) != "running" {
            assert!(Instant::now() < deadline, "the start was never saved");
            std::thread::sleep(Duration::from_millis(5));
        }
        faulty.fail(true);
        let mut replies = Vec::new();
        let result = agentos_proto::payload::ExecReply {
            success: true,
            stdout: "1\n".into(),
            ..Default::default()
        };
        faulty
            .tasks
            .on_reply(start.number, result.into(), &mut replies);
        std::thread::sleep(Duration::from_millis(300));
        faulty.tasks.on_saved(&mut replies);
        let waited = faulty
            .tasks
            .wait(
                Reach::Own(OPERATOR),
                &id,
                None,
                ReplyTo::Task(1),
                Instant::now(),
            )
            .unwrap();
        assert!(matches!(waited, Waited::Reply(_)), "{waited:?}");
        assert_eq!(state(&faulty.disk), "running");
        // Tried again every second, it is saved once it can be.
        faulty.fail(false);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            faulty.tasks.on_saved(&mut replies);
            let waited = faulty
                .tasks
                .wait(
                    Reach::Own(OPERATOR),
                    &id,
                    None,
                    ReplyTo::Task(1),
                    Instant::now(),
                )
                .unwrap();
            if matches!(waited, Waited::ReadResult { .. }) {
                break;
            }
            assert!(Instant::now() < deadline, "the end was never saved");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(state(&faulty.disk), "completed");
    }
}
