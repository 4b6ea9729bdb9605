//! The OTLP/HTTP span exporter: finished spans go into a bounded queue
//! (never blocking the reactor: when it is full the span is dropped and
//! counted), and a thread of its own sends them in batches to
//! `{endpoint}/v1/traces` as `application/x-protobuf`. A collector that is
//! slow or down costs the kernel dropped spans, never time.
//!
//! The thread is woken when a batch is full, or wakes itself each
//! [`FLUSH_EVERY`]: never once a span, which would cost the reactor a
//! wake-up and, on a small machine, its core for a moment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentos_primitives::http_agent::{HttpAgent, Timeouts};
use prost::Message;

use super::otlp::{
    ExportTraceServiceRequest, InstrumentationScope, KeyValue, Resource, ResourceSpans, ScopeSpans,
    Span, SpanKind, Status, Value,
};
use super::TraceContext;

/// Spans sent in one request at most.
const BATCH: usize = 512;
/// A batch leaves at least this often, full or not.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// One export must be done within this.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// A span that has ended.
#[derive(Clone, Debug)]
pub struct FinishedSpan {
    /// Its trace and its own id.
    pub context: TraceContext,
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// What the exporter did, for the metrics.
#[derive(Debug, Default)]
pub struct ExportCounts {
    pub exported: AtomicU64,
    /// Dropped because the queue was full (the collector too slow).
    pub dropped: AtomicU64,
    /// Lost in exports that failed (the collector down or refusing).
    pub failed: AtomicU64,
}

/// The exporter's queue; dropping it ends the thread after a last batch.
#[derive(Debug)]
pub struct Exporter {
    queue: Arc<Queue>,
    pub counts: Arc<ExportCounts>,
}

/// Spans waiting for the thread, at most `capacity`.
#[derive(Debug)]
struct Queue {
    waiting: Mutex<Waiting>,
    batch_full: Condvar,
    capacity: usize,
}

#[derive(Debug, Default)]
struct Waiting {
    spans: Vec<FinishedSpan>,
    closed: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Exporter {
    /// Starts the thread sending to `endpoint` (e.g. `http://127.0.0.1:4318`)
    /// with room for `capacity` spans waiting.
    pub fn start(endpoint: &str, service: &str, capacity: usize) -> std::io::Result<Exporter> {
        let queue = Arc::new(Queue {
            waiting: Mutex::new(Waiting::default()),
            batch_full: Condvar::new(),
            capacity,
        });
        let counts = Arc::new(ExportCounts::default());
        let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        let sender = Sender {
            url,
            service: service.to_owned(),
            counts: Arc::clone(&counts),
            agent: HttpAgent::new(Timeouts {
                connect: None,
                call: Some(EXPORT_TIMEOUT),
            })
            .build(),
        };
        let spans = Arc::clone(&queue);
        agentos_primitives::threads::spawn("otlp-export", move || sender.run(&spans))?;
        Ok(Exporter { queue, counts })
    }

    /// Queues a finished span; drops (and counts) it when the queue is full.
    pub fn export(&self, span: FinishedSpan) {
        let mut waiting = self.queue.lock();
        if waiting.closed || waiting.spans.len() >= self.queue.capacity {
            drop(waiting);
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        waiting.spans.push(span);
        if waiting.spans.len() == BATCH {
            self.queue.batch_full.notify_one();
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.batch_full.notify_one();
    }
}

struct Sender {
    url: String,
    service: String,
    counts: Arc<ExportCounts>,
    agent: ureq::Agent,
}

impl Sender {
    /// Sends what has waited, a batch at a time, when a batch is full or
    /// each [`FLUSH_EVERY`]; after a last send once the queue is closed.
    fn run(&self, queue: &Queue) {
        loop {
            let (batch, closed) = {
                let waiting = queue.lock();
                let (mut waiting, _) = queue
                    .batch_full
                    .wait_timeout_while(waiting, FLUSH_EVERY, |w| {
                        w.spans.len() < BATCH && !w.closed
                    })
                    .unwrap_or_else(|e| e.into_inner());
                let take = waiting.spans.len().min(BATCH);
                let batch: Vec<FinishedSpan> = waiting.spans.drain(..take).collect();
                (batch, waiting.closed)
            };
            self.send(batch);
            if closed {
                let rest = std::mem::take(&mut queue.lock().spans);
                for batch in rest.chunks(BATCH) {
                    self.send(batch.to_vec());
                }
                return;
            }
        }
    }

    fn send(&self, batch: Vec<FinishedSpan>) {
        if batch.is_empty() {
            return;
        }
        let count = batch.len() as u64;
        let body = request(&self.service, batch).encode_to_vec();
        let sent = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/x-protobuf")
            .send(&body[..]);
        match sent {
            Ok(_) => self.counts.exported.fetch_add(count, Ordering::Relaxed),
            Err(err) => {
                log::debug!("OTLP export to {} failed: {err}", self.url);
                self.counts.failed.fetch_add(count, Ordering::Relaxed)
            }
        };
    }
}

/// The export request for `spans` of `service`.
pub fn request(service: &str, spans: Vec<FinishedSpan>) -> ExportTraceServiceRequest {
    let nanos = |at: SystemTime| {
        at.duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64)
    };
    let spans = spans
        .into_iter()
        .map(|span| Span {
            trace_id: span.context.trace_id.to_vec(),
            span_id: span.context.span_id.to_vec(),
            parent_span_id: span.parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: span.name,
            kind: span.kind as i32,
            start_time_unix_nano: nanos(span.start),
            end_time_unix_nano: nanos(span.end),
            attributes: span.attributes,
            status: Some(match span.error {
                Some(message) => Status { message, code: 2 },
                None => Status::default(),
            }),
            // Bit 8: whether the parent is remote is known (bit 9 unset: it is not).
            flags: u32::from(span.context.sampled) | 0x100,
            ..Span::default()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue::new(
                    "service.name",
                    Value::String(service.to_owned()),
                )],
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "agentosd".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans,
            }],
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Instant;

    fn span(name: &str) -> FinishedSpan {
        FinishedSpan {
            context: TraceContext {
                trace_id: [7; 16],
                span_id: [9; 8],
                sampled: true,
            },
            parent: None,
            name: name.into(),
            kind: SpanKind::Internal,
            start: SystemTime::now(),
            end: SystemTime::now(),
            attributes: vec![KeyValue::new(
                "gen_ai.operation.name",
                Value::String("chat".into()),
            )],
            error: None,
        }
    }

    /// Reads one HTTP request from `listener` and answers 200; its body.
    fn receive(listener: &TcpListener) -> Vec<u8> {
        let (mut stream, _) = listener.accept().unwrap();
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        let body_start = loop {
            let n = stream.read(&mut chunk).unwrap();
            bytes.extend_from_slice(&chunk[..n]);
            if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let head = String::from_utf8_lossy(&bytes[..body_start]).to_lowercase();
        assert!(head.starts_with("post /v1/traces "), "{head}");
        assert!(
            head.contains("content-type: application/x-protobuf"),
            "{head}"
        );
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        while bytes.len() < body_start + length {
            let n = stream.read(&mut chunk).unwrap();
            bytes.extend_from_slice(&chunk[..n]);
        }
        stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
        bytes[body_start..body_start + length].to_vec()
    }

    #[test]
    fn spans_reach_the_collector_in_a_batch() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let exporter = Exporter::start(&endpoint, "agentosd-test", 16).unwrap();
        exporter.export(span("chat model-a"));
        exporter.export(span("execute_tool echo"));
        let body = receive(&listener);
        let request = ExportTraceServiceRequest::decode(&body[..]).unwrap();
        let spans = &request.resource_spans[0].scope_spans[0].spans;
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["chat model-a", "execute_tool echo"]);
        assert_eq!(spans[0].trace_id, vec![7; 16]);
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        // A collector that never answers: the thread waits on its first
        // export while the queue fills.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let exporter = Exporter::start(&endpoint, "agentosd-test", 4).unwrap();
        let started = Instant::now();
        for _ in 0..1000 {
            exporter.export(span("s"));
        }
        assert!(started.elapsed() < Duration::from_secs(1), "export waited");
        // What is held is bounded: the queue's 4 and one batch in the
        // thread's hands; the rest is dropped.
        let dropped = exporter.counts.dropped.load(Ordering::Relaxed);
        assert!(dropped >= (1000 - 4 - BATCH) as u64, "{dropped} dropped");
        drop(listener);
    }
}
