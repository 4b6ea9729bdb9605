//! What runs and what waits to run: the queue, the work under way, the
//! loops of running prompt tasks, and when running tasks' output is next
//! looked at. The tasks themselves are the table's; each step here is
//! handed the table it changes.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use agentos_proto::payload::{TaskKind, TaskState};

use super::end::state_of;
use super::owner::OwnerKey;
#[cfg(test)]
use super::owner::PerOwner;
use super::prompt::Step;
use super::prompts::PromptLoops;
use super::queue::TaskQueue;
use super::store::seam::now_ms;
use super::table::{Task, TaskTable};
use super::tool_menu::ToolMenu;
use super::work::{Start, WorkRequest};
use crate::address::Answer;
use crate::identity::Principal;

/// How often running tasks' output is looked at and saved (so a task
/// interrupted by a crash keeps what it had printed).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// The queue and the work under way.
#[derive(Debug)]
pub struct Running {
    queue: TaskQueue,
    prompts: PromptLoops,
    /// The kernel is stopping: no task starts.
    stopping: bool,
    /// When running tasks' output is next looked at.
    next_progress: Instant,
}

/// A task that has just started.
#[derive(Debug)]
pub struct Started {
    /// The task.
    pub id: String,
    /// When it started, for the store.
    pub started_ms: i64,
    /// What the kernel starts for it (its trace not yet filled in).
    pub start: Start,
}

/// What a reply to a task's work comes to.
#[derive(Debug)]
pub enum Replied {
    /// A prompt loop's next step: work for the kernel to start (its trace
    /// not yet filled in).
    Next {
        /// The task.
        id: String,
        /// The step's work.
        start: Box<Start>,
    },
    /// The task has finished, in `state` with `result`.
    Finished {
        /// The task.
        id: String,
        /// Its final state.
        state: TaskState,
        /// Its result (JSON).
        result: Vec<u8>,
    },
}

impl Running {
    /// Nothing queued or running; output first looked at `now`.
    pub fn new(now: Instant) -> Self {
        Running {
            queue: TaskQueue::default(),
            prompts: PromptLoops::default(),
            stopping: false,
            next_progress: now,
        }
    }

    /// How many tasks `owner` has queued.
    pub fn queued(&self, owner: OwnerKey) -> usize {
        self.queue.queued(owner)
    }

    /// How many tasks wait in the queue.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// Queues `owner`'s task `id`, last.
    pub fn push(&mut self, id: String, owner: OwnerKey) {
        self.queue.push(id, owner);
    }

    /// Queued task `id` waits out of the queue until
    /// [`Running::put_back`].
    pub fn set_aside(&mut self, id: &str) {
        self.queue.set_aside(id);
    }

    /// A task set aside goes back in the queue, last.
    pub fn put_back(&mut self, id: String) {
        self.queue.put_back(id);
    }

    /// `owner`'s queued task `id` leaves the queue without starting.
    pub fn withdraw(&mut self, id: &str, owner: OwnerKey) {
        self.queue.withdraw(id, owner);
    }

    /// Whether a prompt task of `table` is waiting to start.
    pub fn prompt_queued(&self, table: &TaskTable) -> bool {
        self.queue
            .order()
            .any(|id| table.get(id).is_some_and(|t| t.kind == TaskKind::Prompt))
    }

    /// Queued tasks whose owners have fewer than `max_running` running,
    /// now running. A prompt loop's THINK is told of the tools on the
    /// menu that fit.
    pub fn startable(
        &mut self,
        table: &mut TaskTable,
        tools: &ToolMenu<'_>,
        max_running: usize,
    ) -> Vec<Started> {
        let mut started = Vec::new();
        if self.stopping {
            return started;
        }
        let mut skipped = VecDeque::new();
        let mut order = self.queue.take_order();
        while let Some(id) = order.pop_front() {
            let Some(task) = table.get_mut(&id) else {
                continue;
            };
            if !self.queue.has_room(task.owner, max_running) {
                skipped.push_back(id);
                continue;
            }
            let Some(dispatch) = task.dispatch.take() else {
                continue;
            };
            let number = self.queue.start(&id, task.owner);
            task.state = TaskState::Running;
            task.number = Some(number);
            let started_ms = now_ms();
            task.started_ms = Some(started_ms);
            let owner = task.owner.principal();
            let work = match dispatch.kind {
                TaskKind::Exec => dispatch.exec().map(|run| WorkRequest::Exec(Box::new(run))),
                TaskKind::Think => dispatch.think().map(WorkRequest::Think),
                TaskKind::Prompt => dispatch.prompt().map(|request| {
                    let listed = tools.for_prompt(&request.prompt, owner);
                    let (think, iteration) = self.prompts.start(&id, request, &listed);
                    task.iteration = Some(iteration);
                    WorkRequest::Think(think)
                }),
            };
            started.push(Started {
                id,
                started_ms,
                start: Start {
                    number,
                    owner,
                    work,
                    trace: None,
                },
            });
        }
        self.queue.give_back(skipped);
        started
    }

    /// The reply of the work numbered `number`: its task has finished, or
    /// — for a prompt loop — takes its next step. `None`: the work is no
    /// task's (any more).
    pub fn on_reply(
        &mut self,
        table: &mut TaskTable,
        number: u64,
        answer: Answer,
    ) -> Option<Replied> {
        let id = self.queue.task_of(number)?.clone();
        if self.prompts.runs(&id) {
            let (step, iteration) = self.prompts.on_answer(&id, answer)?;
            let task = table.get_mut(&id)?;
            task.iteration = Some(iteration);
            let owner = task.owner.principal();
            let work = match step {
                Step::Think(think) => WorkRequest::Think(think),
                Step::Exec(run) => WorkRequest::Exec(run),
                Step::Done { answered, result } => {
                    let state = if answered {
                        TaskState::Completed
                    } else {
                        TaskState::Failed
                    };
                    return Some(Replied::Finished { id, state, result });
                }
            };
            let start = Box::new(Start {
                number,
                owner,
                work: Ok(work),
                trace: None,
            });
            return Some(Replied::Next { id, start });
        }
        self.queue.end_work(number);
        let state = state_of(&answer);
        Some(Replied::Finished {
            id,
            state,
            result: answer.into_json(),
        })
    }

    /// `task`, not yet finished, ends: it leaves the queue, or its owner's
    /// place and its work are freed, and its prompt loop ends.
    pub fn end(&mut self, task: &mut Task) {
        match task.state {
            TaskState::Running => self.queue.end_running(task.owner),
            _ => self.queue.withdraw(&task.id, task.owner),
        }
        if let Some(number) = task.number.take() {
            self.queue.end_work(number);
        }
        self.prompts.end(&task.id, task.owner.principal());
    }

    /// The work numbered `number` is over; returns its task.
    pub fn end_work(&mut self, number: u64) -> Option<String> {
        self.queue.end_work(number)
    }

    /// The task whose work replies under `number`.
    pub fn task_of(&self, number: u64) -> Option<&String> {
        self.queue.task_of(number)
    }

    /// The numbers of the work under way.
    pub fn numbers(&self) -> Vec<u64> {
        self.queue.numbers()
    }

    /// The kernel is stopping: nothing more starts. Returns the running
    /// tasks.
    pub fn stop(&mut self) -> Vec<String> {
        self.stopping = true;
        self.queue.running_tasks()
    }

    /// Whether running tasks' output is due to be looked at.
    pub fn progress_due(&mut self, now: Instant) -> bool {
        if !self.queue.is_running() || now < self.next_progress {
            return false;
        }
        self.next_progress = now + PROGRESS_EVERY;
        true
    }

    /// When running tasks' output is next looked at, while any runs.
    pub fn next_progress(&self) -> Option<Instant> {
        self.queue.is_running().then_some(self.next_progress)
    }

    /// The sessions of prompt loops that have ended (taken).
    pub fn take_ended_sessions(&mut self) -> Vec<(Principal, String)> {
        self.prompts.take_ended_sessions()
    }

    /// Queued tasks per owner.
    #[cfg(test)]
    pub fn queued_per_owner(&self) -> &PerOwner {
        self.queue.queued_per_owner()
    }
}
