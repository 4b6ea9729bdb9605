//! A task's life: dispatched, saved (its dispatch answered), queued,
//! started, answered by its work (a prompt loop's steps in turn), and
//! finished — or cancelled, refused by the store, or interrupted by the
//! kernel's stop on the way.

use super::tool_menu::ToolMenu;
use crate::telemetry::otlp::SpanKind;
use crate::telemetry::TraceContext;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use agentos_proto::payload::{TaskDispatch, TaskKind, TaskReply, TaskState};
use agentos_proto::{ErrorCode, ErrorReply};

use super::end::{cancelled, interrupted, state_of, KERNEL_STOPPED};
use super::prompt::Step;
use super::store::seam::{now_ms, Record, Store, Write};
use super::table::Task;
use super::work::{CancelledWork, Start, WorkRequest};
use super::{new_id, Reach, Tasks, PROGRESS_EVERY};
use crate::address::{Answer, Reply, ReplyTo};
use crate::identity::Principal;

impl<S: Store> Tasks<S> {
    /// Queues a task for `owner`; returns its id.
    pub fn dispatch(
        &mut self,
        owner: Principal,
        dispatch: TaskDispatch,
    ) -> Result<String, ErrorReply> {
        let owner = self.owner_key(owner);
        let queued = self.queue.queued(owner);
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
        let id = new_id();
        let seq = self.next_seq;
        self.next_seq += 1;
        let created_ms = now_ms();
        let record = Record {
            id: id.clone(),
            seq,
            owner,
            kind: dispatch.kind,
            label: dispatch.label.clone(),
            state: TaskState::Queued,
            request: dispatch.request.to_string(),
            created_ms,
            started_ms: None,
            finished_ms: None,
            output: None,
        };
        self.write(Write::Insert(record.clone()));
        let parent = dispatch.trace.as_deref().and_then(TraceContext::parse);
        let name = format!("task {}", dispatch.kind.as_str());
        if let Some(mut span) = self.tracer.open(name, SpanKind::Internal, parent.as_ref()) {
            span.text("agentos.task.id", id.clone());
            span.text("agentos.task.kind", dispatch.kind.as_str());
            self.spans.insert(id.clone(), span);
        }
        self.table.insert(Task::from_record(record, Some(dispatch)));
        self.queue.push(id.clone(), owner);
        Ok(id)
    }

    /// `reply` (a dispatch's) goes to `reply_to` once everything written
    /// so far — the task's record with it — is saved: an id a caller holds
    /// survives a crash. Until then the task waits out of the queue, so a
    /// task whose record cannot be saved never runs.
    pub fn reply_once_saved(&mut self, reply_to: ReplyTo, reply: Answer) {
        if let Some(id) = self.held.hold(self.written, reply_to, reply) {
            self.queue.set_aside(&id);
        }
    }

    /// After the store's wake-up: dispatches whose records are saved are
    /// answered and their tasks queued; those the store could not save
    /// are answered with the cause (`unavailable`) and their tasks
    /// forgotten. True when tasks were queued: the kernel starts them.
    pub fn on_saved(&mut self, replies: &mut Vec<Reply>) -> bool {
        // The count first: the store reports a refusal before it counts
        // past it, so every refusal the count covers is in hand.
        let applied = self.store.applied();
        for refused in self.store.take_refused() {
            let why = ErrorReply::new(
                ErrorCode::Unavailable,
                format!(
                    "the task store cannot save tasks: {}; the task was not queued",
                    refused.cause
                ),
            );
            for id in &refused.tasks {
                if let Some(reply_to) = self.held.refuse(id) {
                    replies.push((reply_to, why.clone().into()));
                }
                self.forget_unsaved(id, &why, replies);
            }
        }
        let mut queued = false;
        for held in self.held.saved(applied) {
            // A task cancelled (or gone) meanwhile stays out of the queue.
            if let Some(id) = held.task.filter(|id| {
                self.table
                    .get(id)
                    .is_some_and(|task| task.state == TaskState::Queued)
            }) {
                self.queue.put_back(id);
                queued = true;
            }
            replies.push((held.reply_to, held.reply));
        }
        self.results.evict(self.store.applied());
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
            self.queue.withdraw(id, task.owner);
        }
        self.results.forget(&[task.id]);
        for reply_to in self.waiters.take(id) {
            replies.push((reply_to, why.clone().into()));
        }
    }

    /// Queued tasks whose owners have room to run one more, now running:
    /// the kernel starts each, replying to `ReplyTo::Task(number)`. A
    /// prompt loop's THINK is told of the tools on the menu that fit.
    pub fn startable(&mut self, tools: &ToolMenu<'_>) -> Vec<Start> {
        let mut starts = Vec::new();
        if self.stopping {
            return starts;
        }
        let mut skipped = VecDeque::new();
        let mut order = self.queue.take_order();
        while let Some(id) = order.pop_front() {
            let Some(task) = self.table.get_mut(&id) else {
                continue;
            };
            if !self
                .queue
                .has_room(task.owner, self.config.max_running_per_owner)
            {
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
                TaskKind::Exec => dispatch.exec().map(WorkRequest::Exec),
                TaskKind::Think => dispatch.think().map(WorkRequest::Think),
                TaskKind::Prompt => dispatch.prompt().map(|request| {
                    let listed = tools.for_prompt(&request.prompt, owner);
                    let (think, iteration) = self.prompts.start(&id, request, &listed);
                    task.iteration = Some(iteration);
                    WorkRequest::Think(think)
                }),
            };
            let trace = self.spans.get(&id).map(|span| span.context.to_string());
            self.write(Write::Started { id, started_ms });
            starts.push(Start {
                number,
                owner,
                work,
                trace,
            });
        }
        self.queue.give_back(skipped);
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
        let id = self.queue.task_of(number)?.clone();
        if self.prompts.runs(&id) {
            let (step, iteration) = self.prompts.on_answer(&id, answer)?;
            let task = self.table.get_mut(&id)?;
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
                    self.finish(&id, state, result, replies);
                    return None;
                }
            };
            return Some(Start {
                number,
                owner,
                work: Ok(work),
                trace: self.spans.get(&id).map(|span| span.context.to_string()),
            });
        }
        self.queue.end_work(number);
        let state = state_of(&answer);
        self.finish(&id, state, answer.into_json(), replies);
        None
    }

    /// Ends a task: its result kept, its waiters answered, its owner's
    /// place freed.
    fn finish(&mut self, id: &str, state: TaskState, result: Vec<u8>, replies: &mut Vec<Reply>) {
        let Some(task) = self.table.get_mut(id) else {
            return;
        };
        if let Some(mut span) = self.spans.remove(id).filter(|_| !task.state.is_finished()) {
            span.text("agentos.task.state", state.as_str());
            let error = (state != TaskState::Completed).then(|| state.as_str().to_owned());
            if let Some(kind) = &error {
                span.text("error.type", kind.clone());
            }
            self.tracer.end(span, error);
        }
        match task.state {
            was if was.is_finished() => return,
            TaskState::Running => self.queue.end_running(task.owner),
            _ => self.queue.withdraw(id, task.owner),
        }
        if let Some(number) = task.number.take() {
            self.queue.end_work(number);
        }
        self.prompts.end(id, task.owner.principal());
        let finished_ms = now_ms();
        task.state = state;
        task.finished_ms = Some(finished_ms);
        task.dispatch = None;
        let output = (!task.output.is_empty()).then(|| std::mem::take(&mut task.output));
        // Only a waiter needs the task as a reply.
        let reply = self.waiters.waits_for(id).then(|| {
            Answer::json(&TaskReply {
                success: true,
                task: task.info(Some(&result)),
            })
        });
        let result = Arc::new(result);
        self.write(Write::Finished {
            id: id.to_owned(),
            state,
            finished_ms,
            result: result.clone(),
            output,
        });
        self.results.keep(id, result, self.written);
        self.results.evict(self.store.applied());
        if let Some(reply) = reply {
            for reply_to in self.waiters.take(id) {
                replies.push((reply_to, reply.clone()));
            }
        }
    }

    /// The kernel could not start a task's work: it fails with `why`.
    pub fn failed_to_start(&mut self, number: u64, why: ErrorReply, replies: &mut Vec<Reply>) {
        if let Some(id) = self.queue.end_work(number) {
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
        if !self.queue.is_running() || now < self.next_progress {
            return false;
        }
        self.next_progress = now + PROGRESS_EVERY;
        true
    }

    /// A running task has printed `output` so far (its tail). With `save`,
    /// a change goes to the store too.
    pub fn progress(&mut self, number: u64, output: String, save: bool) {
        let Some(task) = self
            .queue
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
            self.write(write);
        }
    }

    /// The kernel is stopping: nothing more starts (queued tasks wait for
    /// the next kernel), and running tasks end `interrupted`, with what
    /// they had printed; their work's replies, when the kernel stops it,
    /// are for no one.
    pub fn stop(&mut self, replies: &mut Vec<Reply>) {
        self.stopping = true;
        for id in self.queue.running_tasks() {
            let output = self.table.get(&id).map_or("", |t| t.output.as_str());
            let result = interrupted(KERNEL_STOPPED, output);
            self.finish(&id, TaskState::Interrupted, result, replies);
        }
    }
}
