//! Spans as the kernel opens and ends them: an [`OpenSpan`] is plain data
//! its subsystem keeps beside the work it times (a THINK's queue entry, a
//! run, a task), and ending it hands it to the exporter. With tracing off
//! nothing is opened, so the cost is one branch.

use std::cell::Cell;
use std::time::SystemTime;

use super::exporter::{Exporter, FinishedSpan};
use super::otlp::{KeyValue, SpanKind, Value};
use super::TraceContext;

/// The kernel's tracer: the exporter, if `[tracing]` is on.
#[derive(Debug, Default)]
pub struct Tracer {
    exporter: Option<Exporter>,
    /// Prompts and outputs may be recorded (`tracing.record_content`).
    pub record_content: bool,
}

/// A span under way.
#[derive(Clone, Debug)]
pub struct OpenSpan {
    pub context: TraceContext,
    parent: Option<[u8; 8]>,
    name: String,
    kind: SpanKind,
    start: SystemTime,
    attributes: Vec<KeyValue>,
}

impl Tracer {
    /// A tracer sending to `exporter`.
    pub fn new(exporter: Exporter, record_content: bool) -> Tracer {
        Tracer {
            exporter: Some(exporter),
            record_content,
        }
    }

    /// Whether spans are recorded at all.
    pub fn is_on(&self) -> bool {
        self.exporter.is_some()
    }

    /// The exporter's counts, when tracing is on.
    pub fn exporter(&self) -> Option<&Exporter> {
        self.exporter.as_ref()
    }

    /// Opens a span named `name` under `parent` (a new trace without one);
    /// `None` when tracing is off.
    pub fn open(
        &self,
        name: String,
        kind: SpanKind,
        parent: Option<&TraceContext>,
    ) -> Option<OpenSpan> {
        self.exporter.as_ref()?;
        let span_id = random_id();
        let context = match parent {
            Some(parent) => parent.child(span_id),
            None => TraceContext {
                trace_id: random_trace_id(),
                span_id,
                sampled: true,
            },
        };
        Some(OpenSpan {
            context,
            parent: parent.map(|p| p.span_id),
            name,
            kind,
            start: SystemTime::now(),
            attributes: Vec::new(),
        })
    }

    /// Ends `span` now; `error` says why it failed, if it did.
    pub fn end(&self, span: OpenSpan, error: Option<String>) {
        if let Some(exporter) = &self.exporter {
            exporter.export(FinishedSpan {
                context: span.context,
                parent: span.parent,
                name: span.name,
                kind: span.kind,
                start: span.start,
                end: SystemTime::now(),
                attributes: span.attributes,
                error,
            });
        }
    }
}

/// The agent whose work a span times, as the GenAI conventions name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanAgent {
    pub id: u32,
    pub name: String,
}

impl OpenSpan {
    /// Names the agent whose work this is (`gen_ai.agent.id`, `.name`).
    pub fn agent(&mut self, agent: Option<&SpanAgent>) {
        if let Some(agent) = agent {
            self.text("gen_ai.agent.id", agent.id.to_string());
            self.text("gen_ai.agent.name", agent.name.clone());
        }
    }

    /// Sets a string attribute.
    pub fn text(&mut self, key: &str, value: impl Into<String>) {
        self.attributes
            .push(KeyValue::new(key, Value::String(value.into())));
    }

    /// Sets an integer attribute.
    pub fn int(&mut self, key: &str, value: i64) {
        self.attributes.push(KeyValue::new(key, Value::Int(value)));
    }

    /// Sets a floating-point attribute.
    pub fn float(&mut self, key: &str, value: f64) {
        self.attributes
            .push(KeyValue::new(key, Value::Double(value)));
    }

    /// Sets a string-array attribute.
    pub fn texts(&mut self, key: &str, values: &[&str]) {
        let values = values
            .iter()
            .map(|v| super::otlp::AnyValue {
                value: Some(Value::String((*v).to_owned())),
            })
            .collect();
        self.attributes.push(KeyValue::new(
            key,
            Value::Array(super::otlp::ArrayValue { values }),
        ));
    }
}

thread_local! {
    /// xorshift64* state, seeded from the kernel's random pool once per
    /// thread: span ids must differ, not be secret, and the reactor opens
    /// many.
    static STATE: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = crate::random::fill(&mut bytes);
    u64::from_le_bytes(bytes) | 1
}

fn next() -> u64 {
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

fn random_id() -> [u8; 8] {
    loop {
        let id = next().to_le_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

fn random_trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&random_id());
    id[8..].copy_from_slice(&random_id());
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_off_opens_nothing() {
        assert!(Tracer::default()
            .open("chat m".into(), SpanKind::Client, None)
            .is_none());
    }

    #[test]
    fn ids_are_never_zero_and_differ() {
        let ids: std::collections::HashSet<[u8; 8]> = (0..1000).map(|_| random_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(!ids.contains(&[0; 8]));
    }
}
