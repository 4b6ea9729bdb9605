//! What the kernel hands the reactor after an event, and the routing on
//! the way: replies addressed to tasks finish them (which may start the
//! next), replies to TOOL calls go on to their callers as TOOL replies,
//! counted against the EXEC run that made them, and the end of a run or an
//! agent ends what it started.

use super::tool_calls::ToolCaller;
use super::Kernel;
use crate::address::{Answer, Outbox, Reply, ReplyTo};
use crate::telemetry::otlp::SpanKind;
use crate::telemetry::tracer::SpanAgent;
use crate::tools::builtin;

impl Kernel {
    /// What is ready for the reactor, if anything: replies to connections'
    /// requests, connections to adopt, and runs whose connections close.
    /// Replies addressed to tasks and TOOL calls stay with the kernel.
    /// (Called after every event: the common answer, nothing, costs a few
    /// length checks.)
    pub fn take_output(&mut self) -> Option<Outbox> {
        if self.outbox.is_empty() && !self.exec.has_adopted() && !self.agents.has_ended() {
            return None;
        }
        loop {
            // The work of agents that have ended or are stopping ends too.
            for id in self.agents.take_ended() {
                self.end_agent_work(id);
            }
            // A run whose reply is here is over, and so is what it started
            // (which may add replies of its own).
            let ended = self.runs_answered();
            for number in &ended {
                self.end_run(*number);
            }
            self.outbox.runs_over.extend(&ended);
            let for_kernel = self
                .outbox
                .replies
                .iter()
                .any(|(to, _)| !matches!(to, ReplyTo::Request { .. }));
            if !for_kernel {
                if ended.is_empty() && !self.agents.has_ended() {
                    break;
                }
                continue;
            }
            // Replies to tasks finish them, which answers their waiters and
            // starts the next ones, which may be answered at once.
            let mut replies = std::mem::take(&mut self.outbox.replies);
            self.answer_tool_calls(&mut replies);
            let finished = keep_task_replies(&mut replies);
            self.outbox.replies.extend(replies);
            // Only a task that finished makes room for a queued one.
            let made_room = !finished.is_empty();
            for (number, answer) in finished {
                let next = self
                    .tasks
                    .on_reply(number, answer, &mut self.outbox.replies);
                if let Some(next) = next {
                    self.start_task_work(next);
                }
            }
            self.close_ended_task_sessions();
            if made_room {
                self.start_tasks();
            }
        }
        let mut outbox = std::mem::take(&mut self.outbox);
        outbox.adopted.extend(self.exec.take_adopted());
        if !self.spawn_spans.is_empty() {
            self.end_spawn_spans(&outbox.replies);
        }
        Some(outbox)
    }

    /// Opens SPAWN's `create_agent {name}` span, ended when its reply
    /// goes out (the agent started, or failed to).
    pub fn open_spawn_span(&mut self, reply_to: ReplyTo, agent: SpanAgent) {
        let name = format!("create_agent {}", agent.name);
        if let Some(mut span) = self.tracer.open(name, SpanKind::Internal, None) {
            span.text("gen_ai.operation.name", "create_agent");
            span.agent(Some(&agent));
            self.spawn_spans.insert(reply_to, span);
        }
    }

    fn end_spawn_spans(&mut self, replies: &[Reply]) {
        for (to, answer) in replies {
            let Some(mut span) = self.spawn_spans.remove(to) else {
                continue;
            };
            let error = match answer {
                Answer::Error(refusal) => {
                    span.text("error.type", refusal.code.as_str());
                    Some(refusal.error.clone())
                }
                _ => None,
            };
            self.tracer.end(span, error);
        }
    }

    /// The address a TOOL call answered later gives its server (or the
    /// subsystem that answers it): the reply comes back here to go on to
    /// `caller`.
    pub fn tool_call(&mut self, caller: ToolCaller) -> ReplyTo {
        self.tool_calls.open(caller)
    }

    /// A TOOL call that was refused before it went anywhere.
    pub fn tool_call_refused(&mut self, via: ReplyTo) {
        self.tool_calls.refused(via);
    }

    /// The runs whose replies are in the outbox: each is over.
    fn runs_answered(&mut self) -> Vec<u64> {
        if self.runs.is_empty() {
            return Vec::new();
        }
        let runs = &mut self.runs;
        self.outbox
            .replies
            .iter()
            .filter_map(|(to, _)| runs.answered(to).map(|(number, _)| number))
            .collect()
    }

    /// Replies to TOOL calls, readdressed to their callers as TOOL replies
    /// (THINK's answer to `llm.think` made one) and counted against the
    /// EXEC run that made the call. One whose caller has gone is dropped.
    fn answer_tool_calls(&mut self, replies: &mut Vec<Reply>) {
        replies.retain_mut(|(to, answer)| {
            if !matches!(to, ReplyTo::Tool { .. }) {
                return true;
            }
            let Some(caller) = self.tool_calls.answer(*to) else {
                return false;
            };
            let reply = std::mem::replace(answer, Answer::Json(Vec::new()));
            *answer = builtin::as_tool_reply(reply);
            *to = caller.reply_to;
            if let Some(run) = caller.run {
                self.exec.tool_delivered(run, answer.json_len());
            }
            true
        });
    }
}

/// Takes the replies addressed to tasks out of `replies`, in order.
fn keep_task_replies(replies: &mut Vec<Reply>) -> Vec<(u64, Answer)> {
    let mut tasks = Vec::new();
    let mut rest = Vec::with_capacity(replies.len());
    for (to, answer) in replies.drain(..) {
        match to {
            ReplyTo::Task(task) => tasks.push((task, answer)),
            ReplyTo::Request { .. } | ReplyTo::Tool { .. } => rest.push((to, answer)),
        }
    }
    *replies = rest;
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ConnKey;

    #[test]
    fn replies_to_tasks_stay_with_the_kernel_and_the_rest_keep_their_order() {
        let request = |seq| ReplyTo::Request {
            conn: ConnKey {
                index: 0,
                serial: 7,
            },
            seq,
        };
        let json = |text: &[u8]| Answer::Json(text.to_vec());
        let mut replies = vec![
            (request(1), json(b"a")),
            (ReplyTo::Task(3), json(b"b")),
            (request(2), json(b"c")),
            (ReplyTo::Task(3), json(b"d")),
        ];
        let tasks = keep_task_replies(&mut replies);
        assert_eq!(
            replies,
            vec![(request(1), json(b"a")), (request(2), json(b"c"))]
        );
        assert_eq!(tasks, vec![(3, json(b"b")), (3, json(b"d"))]);
    }
}
