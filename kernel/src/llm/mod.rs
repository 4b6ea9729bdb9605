//! THINK: one shared LLM connection for every agent.
//!
//! Requests are queued fairly per caller ([`scheduler`]), admitted by the
//! provider's rate limits ([`admission`]), charged against agents' token
//! budgets (one budget shared by a tree of agents), and sent by a fixed set of call threads ([`call`]) over one
//! keep-alive pool — never by the reactor. Results come back through the
//! reactor's waker and are answered from [`Llm::poll`]. The provider's wire
//! format is in [`provider`]; the default provider is the local model
//! ([`local`]), so THINK works with no key and no network.
//!
//! All of this state lives on the reactor thread.

pub mod admission;
pub mod call;
mod connection;
mod counts;

pub mod local;
pub mod provider;
mod reload;
mod reply;
pub mod retry;
pub mod scheduler;
mod status;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentos_proto::payload::{ChatMessage, LlmStats, ThinkRequest};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::Waker;

use self::admission::Admission;
use self::call::{CallDone, CallJob, Callers};
use self::connection::Connection;
use self::local::LocalServer;
use self::provider::{Chat, Completion, Failure};
use self::reply::{answered, failed};
use self::scheduler::{FlowId, Full, Scheduler, Waiting};
use crate::address::{Reply, ReplyTo};
use crate::config::llm::{LlmConfig, ProviderKind};
use crate::identity::FIRST_OPERATOR_ID;
use crate::permissions::Budget;
use crate::sandbox::confine::Confinement;
use crate::telemetry::otlp::SpanKind;
use crate::telemetry::tracer::{OpenSpan, SpanAgent, Tracer};
use crate::telemetry::TraceContext;
use crate::timers::Timers;

/// Who is asking, as the kernel knows them.
#[derive(Clone, Debug)]
pub struct Asker {
    /// The caller's identity id: its flow in the fair queue.
    pub id: u32,
    /// Its fair-queueing weight.
    pub weight: u32,
    /// The budgets it draws on: its own, if it has one, then its
    /// ancestors'. Every token it uses is charged to each.
    pub budgets: Vec<Budget>,
    /// The agent whose work it is, for the span.
    pub agent: Option<SpanAgent>,
}

/// A THINK waiting in the queue.
#[derive(Debug)]
struct Pending {
    /// The owners of the budgets it is charged to.
    budgets: Vec<u32>,
    /// Where the answer goes; its connection's closing drops the request.
    reply_to: ReplyTo,
    chat: Chat,
    /// The request named no model: the one configured when it is sent
    /// goes (a reload may change it while the request waits).
    default_model: bool,
    enqueued: Instant,
    deadline: Instant,
    /// Its `chat {model}` span, with tracing on.
    span: Option<OpenSpan>,
}

/// A THINK at the provider.
#[derive(Debug)]
struct InFlight {
    flow: FlowId,
    budgets: Vec<u32>,
    reply_to: ReplyTo,
    estimate: u64,
    prompt_estimate: u64,
    queue_ms: u64,
    model: String,
    /// The provider it went to (see `provider_generation`).
    generation: u64,
    /// Its `chat {model}` span, with tracing on.
    span: Option<OpenSpan>,
}

/// Deadlines the subsystem keeps.
#[derive(Debug)]
enum Wake {
    /// A queued request's deadline.
    Expire,
    /// The rate limits will admit the next request.
    Admit,
}

/// Per-caller use of THINK.
#[derive(Clone, Copy, Debug, Default)]
struct Use {
    calls: u64,
    tokens: u64,
    queue_ms: u64,
}

/// What a budget has paid for and set aside.
#[derive(Clone, Copy, Debug, Default)]
struct Spent {
    /// Tokens charged to it.
    used: u64,
    /// Tokens set aside for THINKs still queued or in flight.
    reserved: u64,
}

/// The THINK subsystem.
#[derive(Debug)]
pub struct Llm {
    kind: ProviderKind,
    model: String,
    /// Why THINK cannot work on this host, if it cannot.
    unavailable: Option<String>,
    local: Option<Arc<LocalServer>>,
    callers: Option<Callers>,
    /// Tokens of context a request may use, when known (see
    /// [`Llm::context_tokens`]).
    context_tokens: Option<u32>,
    /// Since when the provider could not be connected to, and the last
    /// such error; cleared by the next answered call.
    unreachable: Option<(SystemTime, String)>,
    /// Counts the providers reloads put in place; calls carry the one they
    /// went to.
    provider_generation: u64,
    /// Providers a reload replaced, by generation, while their calls
    /// finish: their call threads, and a local model server to stop.
    retiring: Vec<(u64, Callers, Option<Arc<LocalServer>>)>,
    scheduler: Scheduler<Pending>,
    admission: Admission,
    in_flight: HashMap<u64, InFlight>,
    concurrency: usize,
    timeout: Duration,
    default_max_tokens: u32,
    max_tokens_limit: u32,
    weights: BTreeMap<String, u32>,
    /// Use by agent id; operators' connections are counted in `total` only.
    agents: HashMap<u32, Use>,
    /// Budgets by owner.
    budgets: HashMap<u32, Spent>,
    total: Use,
    /// What the metrics say of THINK.
    counts: counts::ThinkCounts,
    /// Where THINK's spans go.
    tracer: Arc<Tracer>,
    timers: Timers<Wake>,
    admit_wake: Option<Instant>,
}

impl Llm {
    /// THINK as configured. A provider that cannot work here (the local
    /// model not installed, none configured) leaves THINK answering
    /// `unavailable` with the reason; the daemon runs on. The local model
    /// server runs under `confinement` when there is one.
    pub fn new(
        config: &LlmConfig,
        waker: Arc<Waker>,
        log_dir: &Path,
        confinement: Option<Confinement>,
    ) -> Llm {
        let connection = Connection::open(config, waker, log_dir, confinement);
        let mut llm = Llm {
            kind: connection.kind,
            model: connection.model,
            unavailable: connection.unavailable,
            local: connection.local,
            callers: connection.callers,
            context_tokens: config.context_tokens(),
            unreachable: None,
            provider_generation: 0,
            retiring: Vec::new(),
            scheduler: Scheduler::new(config.max_queued),
            admission: Admission::new(config.rpm, config.tpm, Instant::now()),
            in_flight: HashMap::new(),
            concurrency: config.concurrency,
            timeout: Duration::from_millis(config.timeout_ms),
            default_max_tokens: config.default_max_tokens,
            max_tokens_limit: config.max_tokens_limit,
            weights: config.weights.clone(),
            agents: HashMap::new(),
            budgets: HashMap::new(),
            total: Use::default(),
            counts: counts::ThinkCounts::default(),
            tracer: Arc::new(Tracer::default()),
            timers: Timers::default(),
            admit_wake: None,
        };
        llm.set_concurrency(config.concurrency);
        llm.counts.configured(&llm.model);
        llm
    }

    /// Lets `concurrency` requests be at the provider at once, and caps
    /// each caller's share of them (see [`flow_cap`]).
    fn set_concurrency(&mut self, concurrency: usize) {
        self.concurrency = concurrency;
        self.scheduler.set_flow_cap(flow_cap(concurrency));
    }

    /// Spans of THINK calls go to `tracer`.
    pub fn trace_with(&mut self, tracer: Arc<Tracer>) {
        self.tracer = tracer;
    }

    /// A `chat {model}` span for `chat`, under `parent`, with tracing on
    /// (the GenAI semantic conventions' inference span).
    fn open_chat_span(
        &self,
        chat: &Chat,
        parent: Option<&TraceContext>,
        agent: Option<&SpanAgent>,
    ) -> Option<OpenSpan> {
        let name = format!("chat {}", chat.model);
        let mut span = self.tracer.open(name, SpanKind::Client, parent)?;
        span.agent(agent);
        span.text("gen_ai.operation.name", "chat");
        span.text("gen_ai.provider.name", self.kind.as_str());
        span.text("gen_ai.request.model", chat.model.clone());
        span.int("gen_ai.request.max_tokens", i64::from(chat.max_tokens));
        if let Some(temperature) = chat.temperature {
            span.float("gen_ai.request.temperature", temperature);
        }
        if self.tracer.record_content {
            if let Some(system) = &chat.system {
                let parts = serde_json::json!([{"type": "text", "content": system}]);
                span.text("gen_ai.system_instructions", parts.to_string());
            }
            let messages: Vec<serde_json::Value> = chat
                .messages
                .iter()
                .map(|m| {
                    serde_json::json!({
                        "role": m.role,
                        "parts": [{"type": "text", "content": m.content}],
                    })
                })
                .collect();
            span.text(
                "gen_ai.input.messages",
                serde_json::Value::from(messages).to_string(),
            );
        }
        Some(span)
    }

    /// Adds THINK's series to the kernel's metrics.
    pub fn add_metrics(&self, snapshot: &mut crate::telemetry::metrics::Snapshot) {
        self.counts.add_to(self.kind.as_str(), snapshot);
    }

    /// THINKs waiting in the fair queue.
    pub fn queued(&self) -> usize {
        self.scheduler.len()
    }

    /// Whether THINK can be served on this host.
    pub fn is_available(&self) -> bool {
        self.unavailable.is_none()
    }

    /// Tokens of context one THINK may use, prompt and answer together,
    /// when the kernel knows it: its own local model's, or what
    /// `llm.context_tokens` says of a remote provider's.
    pub fn context_tokens(&self) -> Option<u32> {
        self.context_tokens
    }

    /// An agent's use of THINK, for LIST.
    pub fn stats(&self, agent: u32) -> LlmStats {
        let used = self.agents.get(&agent).copied().unwrap_or_default();
        LlmStats {
            calls: used.calls,
            tokens: used.tokens,
            queue_ms: used.queue_ms,
        }
    }

    /// Forgets what was spent of the budget kept under `owner` (a run's
    /// own, once the run is over: its number is never used again).
    pub fn forget_budget(&mut self, owner: u32) {
        self.budgets.remove(&owner);
    }

    /// The weight configured for an agent of this name.
    pub fn weight_of(&self, agent_name: &str) -> u32 {
        self.weights.get(agent_name).copied().unwrap_or(1)
    }

    /// Queues a THINK; its reply is delivered through [`Llm::poll`] or
    /// [`Llm::on_deadlines`]. Refusals come back at once.
    pub fn think(
        &mut self,
        asker: &Asker,
        reply_to: ReplyTo,
        request: ThinkRequest,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        let queued = self.enqueue(asker, reply_to, request, replies);
        if let Err(refusal) = &queued {
            self.counts.refused(refusal.code.as_str());
        }
        queued
    }

    /// [`Llm::think`] before its refusals are counted.
    fn enqueue(
        &mut self,
        asker: &Asker,
        reply_to: ReplyTo,
        request: ThinkRequest,
        replies: &mut Vec<Reply>,
    ) -> Result<(), ErrorReply> {
        if let Some(reason) = &self.unavailable {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!("THINK is unavailable: {reason}"),
            ));
        }
        let default_model = request.model.is_none();
        let parent = request.trace.as_deref().and_then(TraceContext::parse);
        let mut chat = self.chat_for(request)?;
        let prompt_tokens = estimate_prompt_tokens(&chat);
        if let Some((budget, left)) = self.tightest(&asker.budgets) {
            if prompt_tokens >= left {
                let spent = self.budgets.get(&budget.owner).copied().unwrap_or_default();
                let whose = if budget.owner == asker.id {
                    "its own".to_owned()
                } else {
                    format!("the budget of agent {}, which it shares,", budget.owner)
                };
                return Err(ErrorReply::new(
                    ErrorCode::LimitExceeded,
                    format!(
                        "agent {}: {whose} of {} LLM tokens has {left} left ({} used, {} \
                         reserved by THINKs in progress); this prompt alone needs about \
                         {prompt_tokens}",
                        asker.id, budget.tokens, spent.used, spent.reserved
                    ),
                ));
            }
            // An answer may not outgrow what is left; a budget is then
            // overrun only by the error of the prompt's estimate.
            let room = u32::try_from(left - prompt_tokens).unwrap_or(u32::MAX);
            chat.max_tokens = chat.max_tokens.min(room);
        }
        let estimate = prompt_tokens + u64::from(chat.max_tokens);
        let now = Instant::now();
        let deadline = now + self.timeout;
        let budgets: Vec<u32> = asker.budgets.iter().map(|b| b.owner).collect();
        let span = self.open_chat_span(&chat, parent.as_ref(), asker.agent.as_ref());
        let pending = Pending {
            budgets: budgets.clone(),
            reply_to,
            chat,
            default_model,
            enqueued: now,
            deadline,
            span,
        };
        self.scheduler
            .push(asker.id, asker.weight, estimate, pending)
            .map_err(|Full| {
                ErrorReply::new(
                    ErrorCode::Busy,
                    format!(
                        "the THINK queue is full ({} waiting); retry later",
                        self.scheduler.len()
                    ),
                )
            })?;
        for owner in budgets {
            self.budgets.entry(owner).or_default().reserved += estimate;
        }
        self.timers.schedule(deadline, Wake::Expire);
        self.pump(now, replies);
        Ok(())
    }

    /// Collects finished calls, answers them, and sends what may go next.
    pub fn poll(&mut self, replies: &mut Vec<Reply>) {
        let finished: Vec<CallDone> = self
            .callers
            .iter()
            .chain(self.retiring.iter().map(|(_, callers, _)| callers))
            .flat_map(Callers::finished)
            .collect();
        for done in finished {
            self.finished(done, replies);
        }
        if !self.retiring.is_empty() {
            self.retire_finished();
        }
        if self.callers.is_some() {
            self.pump(Instant::now(), replies);
        }
    }

    /// Handles deadlines that are due: expired requests, admission. Does
    /// nothing (it runs on every turn of the reactor) when none is.
    pub fn on_deadlines(&mut self, now: Instant, replies: &mut Vec<Reply>) {
        let (mut expire, mut admit) = (false, false);
        while let Some(wake) = self.timers.pop_due(now) {
            match wake {
                Wake::Expire => expire = true,
                Wake::Admit => {
                    self.admit_wake = None;
                    admit = true;
                }
            }
        }
        if !(expire || admit) {
            return;
        }
        if expire {
            for expired in self.withdraw(|pending| pending.deadline <= now, "timeout") {
                self.counts.refused(ErrorCode::Timeout.as_str());
                let waited = now.saturating_duration_since(expired.item.enqueued);
                let failure = Failure::fatal(
                    ErrorCode::Timeout,
                    format!(
                        "THINK waited {} ms in the queue and its deadline passed before the \
                         provider could take it",
                        waited.as_millis()
                    ),
                );
                replies.push((
                    expired.item.reply_to,
                    failed(&failure, &expired.item.chat.model, waited, Duration::ZERO).into(),
                ));
            }
        }
        self.pump(now, replies);
    }

    /// The earliest deadline the reactor must wake up for.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.timers.time_to_next(now)
    }

    /// Drops the queued THINKs of a connection that has closed: nobody
    /// would read their answers. (Ones already at the provider finish.)
    pub fn connection_closed(&mut self, connection: u64) {
        let dropped = self.withdraw(
            |pending| pending.reply_to.connection() == Some(connection),
            "connection_closed",
        );
        if !dropped.is_empty() {
            log::debug!(
                "conn {connection}: {} queued THINK(s) dropped",
                dropped.len()
            );
        }
    }

    /// Withdraws the queued THINK whose reply goes to `reply_to` (a
    /// cancelled task's); returns whether it was still queued. One already
    /// at the provider runs on, and its reply is for no one.
    pub fn withdraw_reply(&mut self, reply_to: ReplyTo) -> bool {
        !self
            .withdraw(|pending| pending.reply_to == reply_to, "cancelled")
            .is_empty()
    }

    /// Takes the queued requests `reject` picks out of the queue and frees
    /// their budget reservations; the caller answers them (or not). Their
    /// spans end as failed, `why` their error type.
    fn withdraw(
        &mut self,
        reject: impl Fn(&Pending) -> bool,
        why: &'static str,
    ) -> Vec<Waiting<Pending>> {
        let mut withdrawn = self.scheduler.remove_where(|w| reject(&w.item));
        for waiting in &mut withdrawn {
            self.release(&waiting.item.budgets, waiting.estimate);
            if let Some(mut span) = waiting.item.span.take() {
                span.text("error.type", why);
                self.tracer
                    .end(span, Some(format!("withdrawn from the queue: {why}")));
            }
        }
        withdrawn
    }

    /// Stops the call threads and the local model.
    pub fn shutdown(&mut self) {
        if let Some(callers) = &mut self.callers {
            callers.stop();
        }
        let retiring = self
            .retiring
            .iter()
            .filter_map(|(_, _, local)| local.as_ref());
        for local in self.local.iter().chain(retiring) {
            local.stop();
        }
    }

    /// The provider-neutral request, with defaults applied.
    fn chat_for(&self, request: ThinkRequest) -> Result<Chat, ErrorReply> {
        let max_tokens = request.max_tokens.unwrap_or(self.default_max_tokens);
        if max_tokens > self.max_tokens_limit {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "THINK field `max_tokens` is {max_tokens}, outside the allowed range \
                     1..={}",
                    self.max_tokens_limit
                ),
            ));
        }
        if let Some(asked) = &request.model {
            self.check_served(asked)?;
        }
        let mut messages = request.messages.unwrap_or_default();
        if let Some(prompt) = request.prompt.filter(|p| !p.trim().is_empty()) {
            messages.push(ChatMessage {
                role: "user".into(),
                content: prompt,
            });
        }
        Ok(Chat {
            // The local model under the name it is served by, however the
            // request spelt it.
            model: match request.model {
                Some(model) if self.kind != ProviderKind::Local => model,
                _ => self.model.clone(),
            },
            system: request.system,
            messages,
            max_tokens,
            temperature: request.temperature,
        })
    }

    /// Sends queued requests while there is room at the provider and the
    /// rate limits allow, passing over callers at their cap (the
    /// scheduler's `peek` shows none of theirs).
    fn pump(&mut self, now: Instant, replies: &mut Vec<Reply>) {
        if self.callers.is_none() {
            return;
        }
        while self.in_flight.len() < self.concurrency {
            let Some((_, head)) = self.scheduler.peek() else {
                return;
            };
            if let Err(ready) = self.admission.admit(head.estimate, now) {
                if self.admit_wake.is_none() {
                    self.counts.rate_limit_wait("kernel", 1);
                }
                if self.admit_wake.is_none_or(|at| at > ready) {
                    self.timers.schedule(ready, Wake::Admit);
                    self.admit_wake = Some(ready);
                }
                return;
            }
            let Some((flow, waiting)) = self.scheduler.pop() else {
                return;
            };
            let mut pending = waiting.item;
            if pending.default_model {
                pending.chat.model.clone_from(&self.model);
            }
            let queue_ms = now.saturating_duration_since(pending.enqueued).as_millis() as u64;
            self.in_flight.insert(
                waiting.ticket,
                InFlight {
                    flow,
                    budgets: pending.budgets,
                    reply_to: pending.reply_to,
                    estimate: waiting.estimate,
                    prompt_estimate: waiting.estimate - u64::from(pending.chat.max_tokens),
                    queue_ms,
                    model: pending.chat.model.clone(),
                    generation: self.provider_generation,
                    span: pending.span,
                },
            );
            let job = CallJob {
                ticket: waiting.ticket,
                chat: pending.chat,
                deadline: pending.deadline,
            };
            let sent = match &self.callers {
                Some(callers) => callers.send(job),
                None => Err(job),
            };
            if let Err(job) = sent {
                log::error!("the LLM call threads are gone; THINK {} fails", job.ticket);
                let done = CallDone {
                    ticket: job.ticket,
                    result: Err(Failure::fatal(
                        ErrorCode::Internal,
                        "the kernel's LLM call threads have stopped",
                    )),
                    latency: Duration::ZERO,
                    attempts: 0,
                    rate_limited: 0,
                    unreachable: false,
                };
                self.finished(done, replies);
            }
        }
    }

    /// Answers a finished call and settles its accounts.
    fn finished(&mut self, done: CallDone, replies: &mut Vec<Reply>) {
        let Some(mut call) = self.in_flight.remove(&done.ticket) else {
            return;
        };
        let now = Instant::now();
        let used = match &done.result {
            Ok(completion) => charged_tokens(completion, &call),
            Err(_) => 0,
        };
        self.scheduler.settle(call.flow, call.estimate, used);
        self.admission.settle(call.estimate, used, now);
        self.release(&call.budgets, call.estimate);
        let queue = Duration::from_millis(call.queue_ms);
        // Only the provider in place now says whether it is reachable.
        if call.generation == self.provider_generation {
            self.note_reachability(&done);
        }
        self.counts
            .timed(queue.as_secs_f64(), done.latency.as_secs_f64());
        self.counts.rate_limit_wait("provider", done.rate_limited);
        if let Some(mut span) = call.span.take() {
            span.int("agentos.think.queue_ms", call.queue_ms as i64);
            let error = match &done.result {
                Ok(completion) => {
                    span.text("gen_ai.response.model", completion.model.clone());
                    if let Some(reason) = &completion.finish_reason {
                        span.texts("gen_ai.response.finish_reasons", &[reason]);
                    }
                    span.int(
                        "gen_ai.usage.input_tokens",
                        completion.usage.prompt_tokens as i64,
                    );
                    span.int(
                        "gen_ai.usage.output_tokens",
                        completion.usage.completion_tokens as i64,
                    );
                    if self.tracer.record_content {
                        let output = serde_json::json!([{
                            "role": "assistant",
                            "parts": [{"type": "text", "content": completion.content}],
                            "finish_reason": completion.finish_reason.as_deref().unwrap_or(""),
                        }]);
                        span.text("gen_ai.output.messages", output.to_string());
                    }
                    None
                }
                Err(failure) => {
                    span.text("error.type", failure.code.as_str());
                    Some(failure.message.clone())
                }
            };
            self.tracer.end(span, error);
        }
        let payload = match done.result {
            Ok(completion) => {
                let usage = &completion.usage;
                self.counts
                    .answered(&call.model, usage.prompt_tokens, usage.completion_tokens);
                self.charge(call.flow, &call.budgets, used, call.queue_ms);
                answered(completion, &call.model, queue, done.latency)
            }
            Err(failure) => {
                self.counts.failed(failure.code.as_str());
                log::info!(
                    "THINK for {} failed after {} attempt(s): {}",
                    call.flow,
                    done.attempts,
                    failure.message
                );
                failed(&failure, &call.model, queue, done.latency)
            }
        };
        replies.push((call.reply_to, payload.into()));
    }

    /// Counts an answered THINK, and charges it to its budgets.
    fn charge(&mut self, flow: FlowId, budgets: &[u32], tokens: u64, queue_ms: u64) {
        let add = |record: &mut Use| {
            record.calls += 1;
            record.tokens += tokens;
            record.queue_ms += queue_ms;
        };
        add(&mut self.total);
        if flow < FIRST_OPERATOR_ID {
            add(self.agents.entry(flow).or_default());
        }
        // A budget is there since the request reserved from it, unless it
        // was forgotten meanwhile (a run's, its run over): nothing to charge.
        for owner in budgets {
            if let Some(spent) = self.budgets.get_mut(owner) {
                spent.used += tokens;
            }
        }
    }

    /// Frees a request's reservations.
    fn release(&mut self, budgets: &[u32], estimate: u64) {
        for owner in budgets {
            if let Some(spent) = self.budgets.get_mut(owner) {
                spent.reserved = spent.reserved.saturating_sub(estimate);
            }
        }
    }

    /// Tokens the budgets still allow, if there are any: what the tightest
    /// of them has left.
    pub fn tokens_left(&self, budgets: &[Budget]) -> Option<u64> {
        self.tightest(budgets).map(|(_, left)| left)
    }

    /// The budget with the least left, and what it has left.
    fn tightest(&self, budgets: &[Budget]) -> Option<(Budget, u64)> {
        budgets
            .iter()
            .map(|budget| {
                let spent = self.budgets.get(&budget.owner).copied().unwrap_or_default();
                let left = budget.tokens.saturating_sub(spent.used + spent.reserved);
                (*budget, left)
            })
            .min_by_key(|(_, left)| *left)
    }
}

/// How many of `concurrency` provider slots one caller may hold: all but
/// one, so a caller whose turn comes while another's slow requests are at
/// the provider is sent at once rather than after one of them finishes.
/// (A newcomer starts no lower than the callers already waiting, so the
/// fair order puts it first; the free slot makes that order count.) With
/// one slot, that one.
fn flow_cap(concurrency: usize) -> u32 {
    u32::try_from(concurrency.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// What an answered call is charged: the provider's count, or, if it gave
/// none, an estimate from the prompt and the answer's length — never more
/// than a generous multiple of what was expected, so a provider reporting
/// absurd usage cannot wreck the counters, buckets and budgets.
fn charged_tokens(completion: &Completion, call: &InFlight) -> u64 {
    let reported = completion.usage.total_tokens;
    let tokens = if reported > 0 {
        reported
    } else {
        call.prompt_estimate + (completion.content.len() as u64).div_ceil(4)
    };
    tokens.min(call.estimate.saturating_mul(8).saturating_add(1024))
}

/// Tokens a chat template adds before any message: role markers, and the
/// default system prompt some models' templates insert (SmolLM2's is
/// about 30 tokens).
const TEMPLATE_TOKENS: u64 = 32;

/// A rough prompt size before the provider counts it: about four
/// characters a token, a few per message for its role markers, and the
/// template's own. Generous rather than short, since budgets rely on it.
fn estimate_prompt_tokens(chat: &Chat) -> u64 {
    let characters: usize = chat.system.as_deref().map_or(0, str::len)
        + chat.messages.iter().map(|m| m.content.len()).sum::<usize>();
    (characters as u64).div_ceil(4) + 4 * chat.messages.len() as u64 + TEMPLATE_TOKENS
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_proto::payload::Usage;

    fn in_flight(estimate: u64, prompt_estimate: u64) -> InFlight {
        InFlight {
            flow: 1,
            budgets: Vec::new(),
            reply_to: ReplyTo::for_tests(),
            estimate,
            prompt_estimate,
            queue_ms: 0,
            model: "m".into(),
            generation: 0,
            span: None,
        }
    }

    fn completion(content: &str, total_tokens: u64) -> Completion {
        Completion {
            content: content.into(),
            usage: Usage {
                total_tokens,
                ..Usage::default()
            },
            model: "m".into(),
            finish_reason: None,
        }
    }

    #[test]
    fn one_slot_is_left_for_another_caller() {
        assert_eq!(flow_cap(4), 3);
        assert_eq!(flow_cap(256), 255);
        assert_eq!(flow_cap(2), 1);
        assert_eq!(flow_cap(1), 1, "a lone slot is still usable");
    }

    #[test]
    fn the_providers_count_is_charged() {
        assert_eq!(
            charged_tokens(&completion("hi", 77), &in_flight(100, 40)),
            77
        );
    }

    #[test]
    fn a_reply_without_usage_is_charged_by_its_length() {
        let answer = "x".repeat(400);
        assert_eq!(
            charged_tokens(&completion(&answer, 0), &in_flight(600, 40)),
            140
        );
    }

    #[test]
    fn absurd_usage_is_capped() {
        assert_eq!(
            charged_tokens(&completion("hi", u64::MAX), &in_flight(100, 40)),
            100 * 8 + 1024
        );
    }
}
