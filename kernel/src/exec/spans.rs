//! Runs' spans, with tracing on: one per run, opened when the run is
//! admitted (under the request's `trace`, if it names one), carried while
//! it waits, joined by the run's code and its tool calls once it starts,
//! and ended with how the run ended.

use std::sync::Arc;
use std::time::Duration;

use agentos_proto::payload::{ExecReply, ExecRequest, Language};

use crate::telemetry::otlp::SpanKind;
use crate::telemetry::tracer::{OpenSpan, SpanAgent, Tracer};
use crate::telemetry::TraceContext;

/// Where runs' spans go.
#[derive(Debug, Default)]
pub struct RunSpans {
    tracer: Arc<Tracer>,
}

impl RunSpans {
    /// Spans go to `tracer`.
    pub fn trace_with(&mut self, tracer: Arc<Tracer>) {
        self.tracer = tracer;
    }

    /// The span of run `run` for `request`, with tracing on: under the
    /// request's `trace`, if it names one.
    pub fn open(
        &self,
        request: &ExecRequest,
        run: u64,
        agent: Option<&SpanAgent>,
    ) -> Option<OpenSpan> {
        let parent = request.trace.as_deref().and_then(TraceContext::parse);
        let language = match request.language {
            Language::Python => "python",
            Language::Bash => "bash",
        };
        let mut span = self.tracer.open(
            format!("exec {language}"),
            SpanKind::Internal,
            parent.as_ref(),
        )?;
        span.agent(agent);
        span.text("agentos.exec.language", language);
        span.int("agentos.exec.run", run as i64);
        if let Some(session) = &request.session {
            span.text("agentos.exec.session", session.clone());
        }
        Some(span)
    }

    /// A run starts after `queued` in line: the trace context its code,
    /// and the tool calls it makes, join its span under.
    pub fn started(span: &mut OpenSpan, queued: Duration) -> String {
        span.int("agentos.exec.queue_ms", queued.as_millis() as i64);
        span.context.to_string()
    }

    /// A run has ended with `reply`.
    pub fn ended(&self, mut span: OpenSpan, reply: &ExecReply) {
        if let Some(code) = reply.exit_code {
            span.int("process.exit.code", i64::from(code));
        }
        let error = if reply.timed_out {
            Some("timeout")
        } else if reply.oom_killed {
            Some("oom")
        } else if reply.code.is_some() {
            Some("error")
        } else if !reply.success {
            Some("failed")
        } else {
            None
        };
        if let Some(kind) = error {
            span.text("error.type", kind);
        }
        self.tracer.end(
            span,
            error.map(|kind| reply.error.clone().unwrap_or_else(|| kind.to_owned())),
        );
    }

    /// A run was refused before it started, with `error`.
    pub fn refused(&self, span: OpenSpan, error: &str) {
        self.tracer.end(span, Some(error.to_owned()));
    }
}
