//! The task table: every task the kernel keeps, by id and in creation
//! order, and how many each owner keeps.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use agentos_proto::payload::{
    PrincipalInfo, TaskDispatch, TaskInfo, TaskKind, TaskList, TaskProgress, TaskState,
};

use super::owner::{OwnerKey, PerOwner};
use super::store::{now_ms, StoredTask};
use crate::clock::rfc3339;

/// A task as the kernel keeps it.
#[derive(Debug)]
pub struct Task {
    /// `t-` and 64 random bits.
    pub id: String,
    /// Creation order.
    pub seq: u64,
    /// Whose it is.
    pub owner: OwnerKey,
    /// What it runs.
    pub kind: TaskKind,
    /// The owner's name for it.
    pub label: Option<String>,
    /// Where it is in its life.
    pub state: TaskState,
    /// Unix times in milliseconds.
    pub created_ms: i64,
    /// When it started running.
    pub started_ms: Option<i64>,
    /// When it finished.
    pub finished_ms: Option<i64>,
    /// What to run, until it has started.
    pub dispatch: Option<TaskDispatch>,
    /// The number its running work replies under.
    pub number: Option<u64>,
    /// What it has printed, for `status` while it runs.
    pub output: String,
    /// For a prompt loop: the iteration under way.
    pub iteration: Option<u32>,
    /// Whether `output` has changed since it was saved.
    pub output_unsaved: bool,
}

impl Task {
    /// The task a stored record describes; `dispatch` is what it runs, kept
    /// only while it is queued.
    pub fn from_record(record: StoredTask, dispatch: Option<TaskDispatch>) -> Task {
        let queued = record.state == TaskState::Queued;
        Task {
            id: record.id,
            seq: record.seq,
            owner: record.owner,
            kind: record.kind,
            label: record.label,
            state: record.state,
            created_ms: record.created_ms,
            started_ms: record.started_ms,
            finished_ms: record.finished_ms,
            dispatch: dispatch.filter(|_| queued),
            number: None,
            output: record.output.unwrap_or_default(),
            iteration: None,
            output_unsaved: false,
        }
    }

    /// The task ends in `state` now: returns when, and what it had
    /// printed, if anything (for the store; no longer kept here).
    pub fn end(&mut self, state: TaskState) -> (i64, Option<String>) {
        let finished_ms = now_ms();
        self.state = state;
        self.finished_ms = Some(finished_ms);
        self.dispatch = None;
        let output = (!self.output.is_empty()).then(|| std::mem::take(&mut self.output));
        (finished_ms, output)
    }

    /// The task as `status`, `wait` and `list` report it; with its
    /// `result` (JSON), once it has finished and a `wait` asks for it.
    pub fn info(&self, result: Option<&[u8]>) -> TaskInfo {
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
            // Embedded as a JSON value, whose keys the reply writes in
            // order, as it always has; nothing here reads it.
            result: result.and_then(|json| serde_json::from_slice(json).ok()),
            owner: None,
            node: None,
            attempts: None,
            waiting_for: None,
        }
    }
}

/// The record of `owner`'s new task `id`, `seq`th in creation order,
/// queued to run `dispatch`.
pub fn new_record(id: &str, seq: u64, owner: OwnerKey, dispatch: &TaskDispatch) -> StoredTask {
    StoredTask {
        id: id.to_owned(),
        seq,
        owner,
        kind: dispatch.kind,
        label: dispatch.label.clone(),
        state: TaskState::Queued,
        request: dispatch.request.to_string(),
        created_ms: now_ms(),
        started_ms: None,
        finished_ms: None,
        output: None,
    }
}

/// What a stored task runs, if its request can still be read.
pub fn stored_dispatch(record: &StoredTask) -> Option<TaskDispatch> {
    let request = serde_json::from_str(&record.request).ok()?;
    Some(TaskDispatch {
        label: record.label.clone(),
        ..TaskDispatch::new(record.kind, request)
    })
}

/// Every task kept.
#[derive(Debug, Default)]
pub struct TaskTable {
    tasks: HashMap<String, Task>,
    /// Ids by creation order.
    by_seq: BTreeMap<u64, String>,
    /// Tasks kept, per owner.
    kept: PerOwner,
}

impl TaskTable {
    /// Keeps `task`.
    pub fn insert(&mut self, task: Task) {
        self.by_seq.insert(task.seq, task.id.clone());
        self.kept.add(task.owner);
        self.tasks.insert(task.id.clone(), task);
    }

    /// Forgets task `id`; returns it.
    pub fn remove(&mut self, id: &str) -> Option<Task> {
        let task = self.tasks.remove(id)?;
        self.by_seq.remove(&task.seq);
        self.kept.remove(task.owner);
        Some(task)
    }

    /// Task `id`.
    pub fn get(&self, id: &str) -> Option<&Task> {
        self.tasks.get(id)
    }

    /// Task `id`, to change.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut Task> {
        self.tasks.get_mut(id)
    }

    /// How many tasks are kept.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// The state of every task kept, in no order.
    pub fn states(&self) -> impl Iterator<Item = TaskState> + '_ {
        self.tasks.values().map(|task| task.state)
    }

    /// How many of `owner`'s tasks are kept.
    pub fn kept(&self, owner: OwnerKey) -> usize {
        self.kept.of(owner)
    }

    /// The ids of the tasks `which` picks, in no order.
    pub fn ids(&self, which: impl Fn(&Task) -> bool) -> Vec<String> {
        self.tasks
            .values()
            .filter(|task| which(task))
            .map(|task| task.id.clone())
            .collect()
    }

    /// The oldest of `owner`'s finished tasks.
    pub fn oldest_finished(&self, owner: OwnerKey) -> Option<String> {
        self.by_seq
            .values()
            .filter_map(|id| self.tasks.get(id))
            .find(|task| task.owner == owner && task.state.is_finished())
            .map(|task| task.id.clone())
    }

    /// The tasks that finished before `horizon_ms`.
    pub fn finished_before(&self, horizon_ms: i64) -> Vec<String> {
        self.ids(|t| t.state.is_finished() && t.finished_ms.is_some_and(|f| f < horizon_ms))
    }

    /// The tasks created before the one of creation order `before`,
    /// newest first.
    pub fn newest_first(&self, before: u64) -> impl Iterator<Item = &Task> {
        self.by_seq
            .range(..before)
            .rev()
            .filter_map(|(_, id)| self.tasks.get(id))
    }

    /// A page of `list`: `owner`'s tasks (anyone's, for `None`) created
    /// before the one of creation order `before` that `filter` picks,
    /// newest first, each said whose it is by `whose`; and the id to go on
    /// from, if there are more.
    pub fn page(
        &self,
        owner: Option<OwnerKey>,
        before: u64,
        filter: &TaskList,
        whose: impl Fn(&Task) -> Option<PrincipalInfo>,
    ) -> (Vec<TaskInfo>, Option<String>) {
        let limit = filter.limit.unwrap_or(50) as usize;
        let mut tasks = Vec::new();
        let mut next = None;
        for task in self.newest_first(before) {
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
            info.owner = whose(task);
            tasks.push(info);
        }
        (tasks, next)
    }

    /// How many tasks each owner keeps.
    #[cfg(test)]
    pub fn kept_per_owner(&self) -> &PerOwner {
        &self.kept
    }
}

/// Unix milliseconds as RFC 3339 UTC.
fn rfc3339_ms(ms: i64) -> String {
    rfc3339(std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}
