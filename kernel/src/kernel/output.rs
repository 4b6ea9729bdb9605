//! Replies on their way out of the kernel, and what it keeps of them
//! meanwhile: replies addressed to TOOL calls go on to their callers as
//! TOOL replies, replies addressed to tasks are taken aside for the tasks
//! they finish, and a SPAWN's span ends when its reply goes out.

use std::collections::HashMap;
use std::sync::Arc;

use super::tool_calls::{ToolCaller, ToolCalls};
use crate::address::{Answer, Reply, ReplyTo};
use crate::telemetry::otlp::SpanKind;
use crate::telemetry::tracer::{OpenSpan, SpanAgent, Tracer};
use crate::tools::builtin;

/// What the router keeps between a request and its reply: the TOOL calls
/// waiting for their answers, and SPAWNs' spans.
#[derive(Debug)]
pub struct Router {
    /// TOOL calls waiting for their replies.
    tool_calls: ToolCalls,
    /// SPAWNs' spans, until their replies go out.
    spawn_spans: HashMap<ReplyTo, OpenSpan>,
    /// Where spans go, if `[tracing]` is on.
    tracer: Arc<Tracer>,
}

/// What routing took out of the replies for the kernel.
#[derive(Debug, Default, PartialEq)]
pub struct Routed {
    /// Replies addressed to tasks, in order: each finishes its work.
    pub tasks: Vec<(u64, Answer)>,
    /// For each TOOL reply that goes on to a call an EXEC run made: the
    /// run, and the reply's size.
    pub delivered_to_runs: Vec<(u64, usize)>,
}

impl Router {
    /// A router whose spans go to `tracer`.
    pub fn new(tracer: Arc<Tracer>) -> Router {
        Router {
            tool_calls: ToolCalls::default(),
            spawn_spans: HashMap::new(),
            tracer,
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

    /// Routes `replies` in place: replies to TOOL calls are readdressed to
    /// their callers as TOOL replies (THINK's answer to `llm.think` made
    /// one; one whose caller has gone is dropped), and replies to tasks
    /// are taken out. What is left goes to connections, in its order.
    pub fn route(&mut self, replies: &mut Vec<Reply>) -> Routed {
        let mut routed = Routed::default();
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
                routed.delivered_to_runs.push((run, answer.json_len()));
            }
            true
        });
        routed.tasks = take_task_replies(replies);
        routed
    }

    /// `replies` go out now: the spans of the SPAWNs they answer end.
    pub fn sent(&mut self, replies: &[Reply]) {
        if self.spawn_spans.is_empty() {
            return;
        }
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

    /// Forgets the TOOL calls of a connection that closed.
    pub fn connection_closed(&mut self, serial: u64) {
        self.tool_calls.connection_closed(serial);
    }
}

/// Whether any of `replies` is addressed to the kernel itself (a task or
/// a TOOL call) rather than to a connection's request.
pub fn any_for_the_kernel(replies: &[Reply]) -> bool {
    replies
        .iter()
        .any(|(to, _)| !matches!(to, ReplyTo::Request { .. }))
}

/// Takes the replies addressed to tasks out of `replies`, in order.
fn take_task_replies(replies: &mut Vec<Reply>) -> Vec<(u64, Answer)> {
    let mut tasks = Vec::new();
    let mut rest = Vec::with_capacity(replies.len());
    for (to, answer) in replies.drain(..) {
        match to {
            ReplyTo::Task(task) => tasks.push((task, answer)),
            ReplyTo::Request { .. } | ReplyTo::Tool { .. } => rest.push((to, answer)),
            ReplyTo::Nobody => {}
        }
    }
    *replies = rest;
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ConnKey;

    fn request(seq: u64) -> ReplyTo {
        ReplyTo::Request {
            conn: ConnKey {
                index: 0,
                serial: 7,
            },
            seq,
        }
    }

    fn json(text: &[u8]) -> Answer {
        Answer::Json(text.to_vec())
    }

    #[test]
    fn replies_to_tasks_stay_with_the_kernel_and_the_rest_keep_their_order() {
        let mut replies = vec![
            (request(1), json(b"a")),
            (ReplyTo::Task(3), json(b"b")),
            (request(2), json(b"c")),
            (ReplyTo::Task(3), json(b"d")),
        ];
        let tasks = take_task_replies(&mut replies);
        assert_eq!(
            replies,
            vec![(request(1), json(b"a")), (request(2), json(b"c"))]
        );
        assert_eq!(tasks, vec![(3, json(b"b")), (3, json(b"d"))]);
    }

    #[test]
    fn a_tool_reply_goes_on_to_its_caller_once_and_counts_against_its_run() {
        let mut router = Router::new(Arc::new(Tracer::default()));
        let via = router.tool_call(ToolCaller {
            reply_to: request(4),
            run: Some(9),
        });
        let gone = router.tool_call(ToolCaller {
            reply_to: request(5),
            run: None,
        });
        router.tool_call_refused(gone);
        let mut replies = vec![
            (via, json(b"{}")),
            (gone, json(b"{}")),
            (ReplyTo::Task(2), json(b"t")),
        ];
        assert!(any_for_the_kernel(&replies));
        let routed = router.route(&mut replies);
        assert_eq!(replies.len(), 1, "{replies:?}");
        assert_eq!(replies[0].0, request(4));
        assert_eq!(routed.tasks, vec![(2, json(b"t"))]);
        assert_eq!(routed.delivered_to_runs.len(), 1);
        assert_eq!(routed.delivered_to_runs[0].0, 9);
        assert!(!any_for_the_kernel(&replies));
    }
}
