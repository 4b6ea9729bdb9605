//! THINK: one shared LLM connection for every agent.
//!
//! Requests are queued fairly per caller ([`scheduler`]), admitted by the
//! provider's rate limits ([`admission`]), charged against agents' token
//! budgets (one budget shared by a tree of agents), and sent by a fixed set of call threads ([`call`]) over one
//! keep-alive pool — never by the reactor. Results come back through the
//! reactor's waker and are answered from [`Llm::poll`]. The provider's wire
//! format is in [`provider`]; whether the provider is answering at all is
//! [`health`]'s to find out. The default provider is the local model
//! ([`local`]), so THINK works with no key and no network.
//!
//! All of this state lives on the reactor thread.

pub mod admission;
pub mod call;
mod connection;
mod counts;
mod health;
mod ledger;
pub mod local;
pub mod provider;
mod quota;
mod reload;
mod reply;
mod request;
pub mod retry;
pub mod scheduler;
mod spans;
mod status;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_primitives::timers::Timers;
use agentos_proto::payload::{LlmInfo, LlmStats, ThinkRequest};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::Waker;

use self::admission::Admission;
use self::call::{CallDone, CallJob};
use self::connection::Connection;
use self::ledger::{charged_tokens, estimate_prompt_tokens, Ledger};
use self::provider::Failure;
use self::quota::{Offer, Paid, Quotas, Released};
use self::reload::{same_provider, Limits};
use self::reply::{answered, failed};
pub use self::request::Asker;
use self::request::{chat_for, InFlight, Pending};
use self::scheduler::{flow_cap, Full, Scheduler, Waiting};
use self::spans::{end_chat_span, open_chat_span};
use crate::address::{Reply, ReplyTo};
use crate::config::llm::LlmConfig;
use crate::permissions::allowance::{Grant, LeaseAsk, LedgerUnreachable};
use crate::permissions::Budget;
use crate::sandbox::confine::Confinement;
use crate::telemetry::tracer::Tracer;
use crate::telemetry::TraceContext;

/// Deadlines the subsystem keeps.
#[derive(Debug)]
enum Wake {
    /// A queued request's deadline.
    Expire,
    /// The rate limits will admit the next request.
    Admit,
}

/// The THINK subsystem.
#[derive(Debug)]
pub struct Llm {
    /// The provider, and those a reload replaced while their calls finish.
    connection: Connection,
    /// The kernel's own limits.
    limits: Limits,
    scheduler: Scheduler<Pending>,
    admission: Admission,
    in_flight: HashMap<u64, InFlight>,
    concurrency: usize,
    /// Use, and what the token budgets have spent.
    ledger: Ledger,
    /// Each principal's `[llm.quota]`, and the THINKs held for it.
    quotas: Quotas<Pending>,
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
    /// server runs under `confinement` when there is one. In a fleet
    /// (`in_fleet`), quotas are leased from the fleet's ledger.
    pub fn new(
        config: &LlmConfig,
        waker: Arc<Waker>,
        log_dir: &Path,
        confinement: Option<Confinement>,
        in_fleet: bool,
    ) -> Llm {
        let mut llm = Llm {
            quotas: Quotas::new(&config.quota, in_fleet.then(|| Arc::clone(&waker))),
            connection: Connection::open(config, waker, log_dir, confinement),
            limits: Limits::of(config),
            scheduler: Scheduler::new(config.max_queued),
            admission: Admission::new(config.rpm, config.tpm, Instant::now()),
            in_flight: HashMap::new(),
            concurrency: config.concurrency,
            ledger: Ledger::default(),
            counts: counts::ThinkCounts::default(),
            tracer: Arc::new(Tracer::default()),
            timers: Timers::default(),
            admit_wake: None,
        };
        llm.set_concurrency(config.concurrency);
        llm.counts.configured(llm.connection.model());
        llm
    }

    /// Takes up `config` in place of `old` (see `reload`). When only
    /// the kernel's own limits changed, the provider stays connected (and a
    /// loaded local model stays loaded).
    pub fn reconfigure(
        &mut self,
        old: &LlmConfig,
        config: &LlmConfig,
        waker: Arc<Waker>,
        log_dir: &Path,
        confinement: Option<Confinement>,
    ) {
        if same_provider(old, config) {
            log::info!(
                "THINK: new limits; provider {} and model {} unchanged",
                self.connection.kind(),
                self.connection.model()
            );
            self.take_limits(old, config);
            return;
        }
        self.connection
            .reconnect(config, waker, log_dir, confinement);
        self.counts.configured(self.connection.model());
        // Calls still at the old provider count against the new
        // concurrency and per-caller cap alike: a smaller one sends
        // nothing more until they are under it.
        self.set_concurrency(config.concurrency);
        self.take_limits(old, config);
        self.retire_finished();
    }

    /// The kernel-side limits of `config`: rates (counted afresh only when
    /// they changed, so a reload is no way around them), queue, time,
    /// tokens, weights.
    fn take_limits(&mut self, old: &LlmConfig, config: &LlmConfig) {
        self.limits = Limits::of(config);
        if (old.rpm, old.tpm) != (config.rpm, config.tpm) {
            self.admission = Admission::new(config.rpm, config.tpm, Instant::now());
        }
        self.scheduler.set_capacity(config.max_queued);
        self.quotas.configure(&config.quota);
    }

    /// Lets go of each replaced provider whose calls have all finished.
    fn retire_finished(&mut self) {
        let in_flight = &self.in_flight;
        self.connection.retire_finished(|generation| {
            in_flight.values().any(|call| call.generation == generation)
        });
    }

    /// What HELLO says about THINK.
    pub fn info(&self) -> LlmInfo {
        status::info(&self.connection, self.ledger.total())
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

    /// Adds THINK's series to the kernel's metrics.
    pub fn add_metrics(&self, snapshot: &mut crate::telemetry::metrics::Snapshot) {
        self.counts
            .add_to(self.connection.kind().as_str(), snapshot);
    }

    /// THINKs waiting in the fair queue, or for their quotas.
    pub fn queued(&self) -> usize {
        self.scheduler.len() + self.quotas.held()
    }

    /// Whether principals' THINKs are held to `[llm.quota]`.
    pub fn has_quota(&self) -> bool {
        self.quotas.is_set()
    }

    /// Leases of quotas for the fleet's ledger to grant (the reactor is
    /// woken when there are some); the kernel brings back the answers
    /// ([`Llm::leased`]).
    pub fn take_lease_asks(&mut self) -> Vec<LeaseAsk> {
        self.quotas.take_asks()
    }

    /// The ledger's answer to `ask`: the held THINKs go on, or, when it
    /// could not be asked, fail naming why.
    pub fn leased(
        &mut self,
        ask: &LeaseAsk,
        grant: Result<Grant, LedgerUnreachable>,
        replies: &mut Vec<Reply>,
    ) {
        match grant {
            Ok(grant) => self.quotas.granted(ask, grant, Instant::now()),
            Err(unreachable) => {
                let (held, why) = self.quotas.lease_failed(ask, &unreachable);
                let failure = Failure::fatal(ErrorCode::Unavailable, why);
                for pending in held {
                    self.fail_pending(pending, &failure, "quota_unavailable", replies);
                }
            }
        }
        self.pump(Instant::now(), replies);
    }

    /// Whether THINK can be served on this host.
    pub fn is_available(&self) -> bool {
        self.connection.unavailable().is_none()
    }

    /// Tokens of context one THINK may use, prompt and answer together,
    /// when the kernel knows it: its own local model's, or what
    /// `llm.context_tokens` says of a remote provider's.
    pub fn context_tokens(&self) -> Option<u32> {
        self.limits.context_tokens
    }

    /// An agent's use of THINK, for LIST.
    pub fn stats(&self, agent: u32) -> LlmStats {
        self.ledger.stats(agent)
    }

    /// Forgets what was spent of the budget kept under `owner` (a run's
    /// own, once the run is over: its number is never used again).
    pub fn forget_budget(&mut self, owner: u32) {
        self.ledger.forget_budget(owner);
    }

    /// The weight configured for an agent of this name.
    pub fn weight_of(&self, agent_name: &str) -> u32 {
        self.limits.weights.get(agent_name).copied().unwrap_or(1)
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
        if let Some(reason) = self.connection.unavailable() {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!("THINK is unavailable: {reason}"),
            ));
        }
        if let Some((_, what)) = self.connection.not_answering() {
            return Err(ErrorReply::new(
                ErrorCode::Unavailable,
                format!("THINK is unavailable: {what}"),
            ));
        }
        let default_model = request.model.is_none();
        let parent = request.trace.as_deref().and_then(TraceContext::parse);
        let mut chat = chat_for(&self.limits, &self.connection, request)?;
        let prompt_tokens = estimate_prompt_tokens(&chat);
        self.ledger.fit(
            asker.id,
            &asker.budgets,
            prompt_tokens,
            &mut chat.max_tokens,
        )?;
        let estimate = prompt_tokens + u64::from(chat.max_tokens);
        let now = Instant::now();
        if self.scheduler.is_full_with(self.quotas.held()) {
            return Err(ErrorReply::new(
                ErrorCode::Busy,
                format!(
                    "the THINK queue is full ({} waiting); retry later",
                    self.queued()
                ),
            ));
        }
        let deadline = now + self.limits.timeout;
        let span = open_chat_span(
            &self.tracer,
            self.connection.kind().as_str(),
            &chat,
            parent.as_ref(),
            asker.agent.as_ref(),
        );
        let pending = Pending {
            flow: asker.id,
            weight: asker.weight,
            budgets: asker.budgets.iter().map(|b| b.owner).collect(),
            reserved: estimate,
            prompt_tokens,
            paid: None,
            reply_to,
            chat,
            default_model,
            enqueued: now,
            deadline,
            span,
        };
        self.ledger.reserve(&pending.budgets, estimate);
        match asker.quota.as_deref() {
            None => self.queue(pending, None, replies),
            Some(owner) => match self.quotas.offer(owner, pending, now) {
                Offer::Go(pending, paid) => self.queue(pending, Some(paid), replies),
                Offer::Held => {}
                Offer::Refused(mut pending, why) => {
                    self.discard(&mut pending, "quota_spent");
                    return Err(ErrorReply::new(ErrorCode::LimitExceeded, why));
                }
            },
        }
        self.timers.schedule(deadline, Wake::Expire);
        self.pump(now, replies);
        Ok(())
    }

    /// Puts a THINK paid for (`paid`, if its principal has a quota) in the
    /// fair queue. Its quota may have lowered its answer's cap: its
    /// budgets keep only what it may now use.
    fn queue(&mut self, mut pending: Pending, paid: Option<Paid>, replies: &mut Vec<Reply>) {
        let estimate = pending.prompt_tokens + u64::from(pending.chat.max_tokens);
        (self.ledger).release(&pending.budgets, pending.reserved.saturating_sub(estimate));
        pending.reserved = pending.reserved.min(estimate);
        pending.paid = paid;
        let (flow, weight) = (pending.flow, pending.weight);
        if let Err(Full(pending)) = self.scheduler.push(flow, weight, estimate, pending) {
            // Only a reload that made the queue smaller gets here.
            let failure = Failure::fatal(ErrorCode::Busy, "the THINK queue is full; retry later");
            self.fail_pending(pending, &failure, "queue_full", replies);
        }
    }

    /// Lets held THINKs whose quotas now allow go into the fair queue, and
    /// fails those whose quotas are spent.
    fn release_held(&mut self, now: Instant, replies: &mut Vec<Reply>) {
        for released in self.quotas.release(now) {
            match released {
                Released::Go(pending, paid) => self.queue(pending, Some(paid), replies),
                Released::Refused(pending, why) => {
                    let failure = Failure::fatal(ErrorCode::LimitExceeded, why);
                    self.fail_pending(pending, &failure, "quota_spent", replies);
                }
            }
        }
    }

    /// Answers a THINK that never reached the provider with `failure`.
    fn fail_pending(
        &mut self,
        mut pending: Pending,
        failure: &Failure,
        why: &'static str,
        replies: &mut Vec<Reply>,
    ) {
        self.discard(&mut pending, why);
        self.counts.refused(failure.code.as_str());
        let waited = pending.enqueued.elapsed();
        let reply = failed(failure, &pending.chat.model, waited, Duration::ZERO);
        replies.push((pending.reply_to, reply.into()));
    }

    /// Frees what a THINK taken out of the queue had set aside — in its
    /// budgets, and of its quota — and ends its span as failed, `why` its
    /// error type.
    fn discard(&mut self, pending: &mut Pending, why: &'static str) {
        self.ledger.release(&pending.budgets, pending.reserved);
        pending.reserved = 0;
        if let Some(paid) = pending.paid.take() {
            self.quotas.refund(&paid);
        }
        if let Some(mut span) = pending.span.take() {
            span.text("error.type", why);
            self.tracer
                .end(span, Some(format!("withdrawn from the queue: {why}")));
        }
    }

    /// Collects finished calls, answers them, and sends what may go next.
    pub fn poll(&mut self, replies: &mut Vec<Reply>) {
        for done in self.connection.finished() {
            self.finished(done, replies);
        }
        if let Some(silence) = self.connection.heard(Instant::now(), self.calls_out()) {
            self.fail_calls_out(&silence, replies);
        }
        if self.connection.is_retiring() {
            self.retire_finished();
        }
        if self.connection.is_connected() {
            self.pump(Instant::now(), replies);
        }
    }

    /// Handles deadlines that are due: expired requests, admission. Does
    /// nothing (it runs on every turn of the reactor) when none is.
    pub fn on_deadlines(&mut self, now: Instant, replies: &mut Vec<Reply>) {
        self.connection.look(now, self.calls_out());
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
        if !(expire || admit || self.quotas.is_due(now)) {
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
        let look = self.connection.next_look(now);
        let quota = (self.quotas.next_wake()).map(|at| at.saturating_duration_since(now));
        let timers = self.timers.time_to_next(now);
        timers.into_iter().chain(look).chain(quota).min()
    }

    /// Whether calls at the provider in place are unanswered.
    fn calls_out(&self) -> bool {
        let generation = self.connection.generation();
        self.in_flight.values().any(|c| c.generation == generation)
    }

    /// Fails every call at the provider in place, which is not answering
    /// (`silence` says so), leaving its threads to their fate, and every
    /// THINK queued for it: a THINK now would be refused the same way.
    fn fail_calls_out(&mut self, silence: &str, replies: &mut Vec<Reply>) {
        let failure = Failure::fatal(ErrorCode::Unavailable, silence);
        for queued in self.withdraw(|_| true, "not_answering") {
            self.counts.failed(failure.code.as_str());
            let waited = queued.item.enqueued.elapsed();
            let reply = failed(&failure, &queued.item.chat.model, waited, Duration::ZERO);
            replies.push((queued.item.reply_to, reply.into()));
        }
        let generation = self.connection.generation();
        let out: Vec<(u64, Instant)> = (self.in_flight.iter())
            .filter(|(_, call)| call.generation == generation)
            .map(|(ticket, call)| (*ticket, call.sent))
            .collect();
        if out.is_empty() {
            return;
        }
        for (ticket, sent) in out {
            let done = CallDone {
                ticket,
                result: Err(failure.clone()),
                latency: sent.elapsed(),
                attempts: 1,
                rate_limited: 0,
                unreachable: false,
            };
            self.finished(done, replies);
        }
        self.connection.abandon_calls();
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
        let held = self.quotas.remove_where(&reject);
        withdrawn.extend(held.into_iter().map(|item| Waiting {
            ticket: 0,
            estimate: item.reserved,
            item,
        }));
        for waiting in &mut withdrawn {
            self.discard(&mut waiting.item, why);
        }
        withdrawn
    }

    /// Stops the call threads and the local model.
    pub fn shutdown(&mut self) {
        self.connection.shutdown();
    }

    /// Sends queued requests while there is room at the provider and the
    /// rate limits allow, passing over callers at their cap (the
    /// scheduler's `peek` shows none of theirs).
    fn pump(&mut self, now: Instant, replies: &mut Vec<Reply>) {
        if self.quotas.is_due(now) {
            self.release_held(now, replies);
        }
        if !self.connection.is_connected() {
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
                self.connection.model().clone_into(&mut pending.chat.model);
            }
            let queue_ms = now.saturating_duration_since(pending.enqueued).as_millis() as u64;
            self.in_flight.insert(
                waiting.ticket,
                InFlight {
                    flow,
                    budgets: pending.budgets,
                    paid: pending.paid,
                    reply_to: pending.reply_to,
                    estimate: waiting.estimate,
                    prompt_estimate: waiting.estimate - u64::from(pending.chat.max_tokens),
                    queue_ms,
                    sent: now,
                    model: pending.chat.model.clone(),
                    generation: self.connection.generation(),
                    span: pending.span,
                },
            );
            let job = CallJob {
                ticket: waiting.ticket,
                chat: pending.chat,
                deadline: pending.deadline,
            };
            self.connection.call_sent(now);
            if let Err(job) = self.connection.send(job) {
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
            Ok(completion) => charged_tokens(completion, call.estimate, call.prompt_estimate),
            Err(_) => 0,
        };
        self.scheduler.settle(call.flow, call.estimate, used);
        self.admission.settle(call.estimate, used, now);
        self.ledger.release(&call.budgets, call.estimate);
        if let Some(paid) = &call.paid {
            self.quotas.settle(paid, used);
        }
        let queue = Duration::from_millis(call.queue_ms);
        // Only the provider in place now says whether it is reachable.
        self.connection.note_reachability(&done, call.generation);
        self.counts
            .timed(queue.as_secs_f64(), done.latency.as_secs_f64());
        self.counts.rate_limit_wait("provider", done.rate_limited);
        if let Some(span) = call.span.take() {
            end_chat_span(&self.tracer, span, &done.result, call.queue_ms);
        }
        let payload = match done.result {
            Ok(completion) => {
                let usage = &completion.usage;
                self.counts
                    .answered(&call.model, usage.prompt_tokens, usage.completion_tokens);
                self.ledger
                    .charge(call.flow, &call.budgets, used, call.queue_ms);
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

    /// Tokens the budgets still allow, if there are any: what the tightest
    /// of them has left.
    pub fn tokens_left(&self, budgets: &[Budget]) -> Option<u64> {
        self.ledger.tightest(budgets).map(|(_, left)| left)
    }
}
