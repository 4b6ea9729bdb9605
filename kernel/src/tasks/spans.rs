//! Tasks' spans: each task dispatched in this boot has one, from its
//! dispatch to its end, and its work joins it.

use std::collections::HashMap;
use std::sync::Arc;

use agentos_proto::payload::{TaskDispatch, TaskState};

use crate::telemetry::otlp::SpanKind;
use crate::telemetry::tracer::{OpenSpan, Tracer};
use crate::telemetry::TraceContext;

/// The open span of each task, by id, and where they go.
#[derive(Debug, Default)]
pub struct TaskSpans {
    tracer: Arc<Tracer>,
    open: HashMap<String, OpenSpan>,
}

impl TaskSpans {
    /// Spans go to `tracer` from now on.
    pub fn trace_with(&mut self, tracer: Arc<Tracer>) {
        self.tracer = tracer;
    }

    /// Opens task `id`'s span, under the caller's trace if `dispatch`
    /// carries one (with tracing on).
    pub fn open(&mut self, id: &str, dispatch: &TaskDispatch) {
        let parent = dispatch.trace.as_deref().and_then(TraceContext::parse);
        let name = format!("task {}", dispatch.kind.as_str());
        if let Some(mut span) = self.tracer.open(name, SpanKind::Internal, parent.as_ref()) {
            span.text("agentos.task.id", id.to_owned());
            span.text("agentos.task.kind", dispatch.kind.as_str());
            self.open.insert(id.to_owned(), span);
        }
    }

    /// Task `id`'s span as a `traceparent`, for its work to join.
    pub fn context(&self, id: &str) -> Option<String> {
        self.open.get(id).map(|span| span.context.to_string())
    }

    /// Task `id` has ended in `state`: its span ends, failed unless the
    /// task completed.
    pub fn end(&mut self, id: &str, state: TaskState) {
        let Some(mut span) = self.open.remove(id) else {
            return;
        };
        span.text("agentos.task.state", state.as_str());
        let error = (state != TaskState::Completed).then(|| state.as_str().to_owned());
        if let Some(kind) = &error {
            span.text("error.type", kind.clone());
        }
        self.tracer.end(span, error);
    }

    /// Task `id`'s span, if it has one, is dropped unended.
    pub fn drop_span(&mut self, id: &str) {
        self.open.remove(id);
    }
}
