//! The audit log (GET_AUDIT_LOG, SET_AUDIT_CONFIG): what was done in the
//! kernel and by whom — agents spawned, killed and ended, permissions and
//! networks changed, refusals — in the task store's SQLite database, so
//! it outlives the kernel, and bounded (the oldest entries go first).
//!
//! Nothing here blocks the reactor: an entry becomes a transaction handed
//! to the task store's writer thread, and a read is one too, whose answer
//! a worker waits for. One writer keeps the order: a read after an event
//! sees its entry.
//!
//! Who reads what is decided where an entry is written: each row keeps the
//! operator whose tree it concerns, the operator tree that caused it, the
//! line of agents it is about, and the run that caused it (see
//! [`Reader`]).

mod sql;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_proto::payload::{
    AgentState, AuditCategory, AuditConfig, AuditLogRequest, PrincipalInfo, SetAuditConfigRequest,
};
use agentos_proto::{ErrorCode, ErrorReply};
use rusqlite::Connection;
use serde::Serialize;

use crate::agents::{AgentFacts, Agents};
use crate::config::audit::AuditSettings;
use crate::tasks::store::{answered, hand, now_ms, Database, Transaction};
use crate::workers::Job;
pub use sql::Reader;
use sql::{line_of, Row};

/// Callers (agents, for their ends; principals, for their refusals)
/// remembered before that memory is pruned to those still of interest.
const REMEMBERED: usize = 4096;

/// Refusal entries one principal may add in [`REFUSAL_WINDOW`]: a hostile
/// caller that is refused in a loop must neither push everyone else's
/// entries out of the bound nor flood the writer. Past it, refusals are
/// counted, and the count goes with its next entry.
const REFUSALS_PER_WINDOW: u32 = 20;
/// See [`REFUSALS_PER_WINDOW`].
const REFUSAL_WINDOW: Duration = Duration::from_secs(1);
/// Entries handed to the writer and not yet written, past which new
/// entries are dropped (and counted in the log): the writer's queue has
/// no bound of its own.
const MAX_QUEUED: usize = 10_000;

/// Whose refusals are counted together: an agent, an EXEC run, or an
/// operator's uid.
pub type RefusedBy = (u32, Option<u32>, Option<u64>);

/// One principal's refusals in the current window.
#[derive(Debug)]
struct Refusals {
    since: Instant,
    written: u32,
    suppressed: u64,
}

/// Who caused an entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    /// As the entry shows it.
    pub principal: PrincipalInfo,
    /// The uid of the operator whose tree it acts in.
    pub tree_uid: u32,
    /// The EXEC run it is, if one.
    pub run: Option<u64>,
}

/// The agent an entry is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// Its id.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// The uid of the operator whose tree it is in.
    pub owner_uid: u32,
    /// Its ancestors, eldest first, and itself last.
    pub line: Vec<u32>,
}

impl Subject {
    /// Agent `id`, while the agents table knows it.
    pub fn of(agents: &Agents, id: u32) -> Option<Subject> {
        agents.facts(id).map(|facts| Subject::from_facts(id, facts))
    }

    fn from_facts(id: u32, facts: AgentFacts) -> Subject {
        Subject {
            id,
            name: facts.name,
            owner_uid: facts.owner_uid,
            line: facts.line,
        }
    }
}

/// An entry to record.
#[derive(Clone, Debug)]
pub struct Event {
    /// What it is about.
    pub category: AuditCategory,
    /// What happened.
    pub event_type: &'static str,
    /// Who caused it.
    pub cause: Cause,
    /// The agent it is about, if one.
    pub subject: Option<Subject>,
    /// Whether what was asked was done.
    pub success: bool,
    /// What else there is to say of it.
    pub details: serde_json::Value,
}

/// The audit log: the way to its database, the kernel it is (rows say
/// which kernel wrote them), and what SET_AUDIT_CONFIG changed.
#[derive(Debug)]
pub struct Audit {
    /// `None` if the task store had closed when the kernel started.
    database: Option<Database>,
    boot: i64,
    /// SET_AUDIT_CONFIG's switches, over the config file's; kept until the
    /// kernel stops.
    changes: SetAuditConfigRequest,
    /// The incarnation whose end was last logged, by agent: an agent's end
    /// is reported when it is asked to stop and again when it has.
    ends: HashMap<u32, u32>,
    /// Refusals by principal, in their current window.
    refusals: HashMap<RefusedBy, Refusals>,
    /// Entries handed to the writer, not yet written.
    queued: Arc<AtomicUsize>,
    /// Entries dropped because too many were queued.
    dropped: u64,
}

impl Audit {
    /// The audit log in `database`.
    pub fn new(database: Option<Database>) -> Audit {
        Audit {
            database,
            boot: now_ms(),
            changes: SetAuditConfigRequest::default(),
            ends: HashMap::new(),
            refusals: HashMap::new(),
            queued: Arc::new(AtomicUsize::new(0)),
            dropped: 0,
        }
    }

    /// This kernel, as the rows it writes name it.
    pub fn boot(&self) -> i64 {
        self.boot
    }

    /// What is in force under `settings` (the `[audit]` table).
    pub fn config(&self, settings: &AuditSettings) -> AuditConfig {
        let file = AuditConfig {
            max_entries: settings.max_entries,
            log_syscalls: settings.log_syscalls,
            log_security: true,
            log_lifecycle: true,
            log_ipc: false,
            log_state: false,
            log_resource: true,
            log_network: false,
            log_world: false,
        };
        let mut config = self.changes.applied_to(file);
        // The file's bound is a ceiling (a reload may lower it), and what
        // keeps the kernel accountable is never off.
        config.max_entries = config.max_entries.min(settings.max_entries);
        config.log_security = true;
        config.log_lifecycle = true;
        config
    }

    /// SET_AUDIT_CONFIG: applies `request` over what is in force, and
    /// removes the oldest entries beyond a lowered bound.
    pub fn set(
        &mut self,
        settings: &AuditSettings,
        request: &SetAuditConfigRequest,
    ) -> Result<AuditConfig, ErrorReply> {
        if let Some(field) = request.turns_off_required() {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                format!(
                    "SET_AUDIT_CONFIG field `{field}`: security and lifecycle entries are always \
                     recorded, so that what is done in the kernel stays accountable"
                ),
            ));
        }
        if let Some(max) = request
            .max_entries
            .filter(|max| *max > settings.max_entries)
        {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "SET_AUDIT_CONFIG field `max_entries`: {max} is over the kernel's \
                     `audit.max_entries` ({})",
                    settings.max_entries
                ),
            ));
        }
        let old = &self.changes;
        self.changes = SetAuditConfigRequest {
            max_entries: request.max_entries.or(old.max_entries),
            log_syscalls: request.log_syscalls.or(old.log_syscalls),
            log_security: None,
            log_lifecycle: None,
            log_ipc: request.log_ipc.or(old.log_ipc),
            log_state: request.log_state.or(old.log_state),
            log_resource: request.log_resource.or(old.log_resource),
            log_network: request.log_network.or(old.log_network),
            log_world: request.log_world.or(old.log_world),
        };
        let config = self.config(settings);
        let max_entries = config.max_entries;
        self.run(Box::new(move |connection: &Connection| {
            match sql::trim(connection, max_entries) {
                Ok(0) => {}
                Ok(removed) => log::info!("audit: removed the {removed} oldest entries"),
                Err(err) => log::error!("audit: cannot remove the oldest entries: {err}"),
            }
        }));
        Ok(config)
    }

    /// Whether a refusal of `by` is recorded now: `None` if `by` has had
    /// its share of this window; else how many of its refusals went
    /// unrecorded before this one.
    pub fn admit_refusal(&mut self, by: RefusedBy, now: Instant) -> Option<u64> {
        if self.refusals.len() >= REMEMBERED {
            self.refusals
                .retain(|_, r| now.duration_since(r.since) < REFUSAL_WINDOW || r.suppressed > 0);
        }
        let refusals = self.refusals.entry(by).or_insert(Refusals {
            since: now,
            written: 0,
            suppressed: 0,
        });
        if now.duration_since(refusals.since) >= REFUSAL_WINDOW {
            refusals.since = now;
            refusals.written = 0;
        }
        if refusals.written >= REFUSALS_PER_WINDOW {
            refusals.suppressed += 1;
            return None;
        }
        refusals.written += 1;
        Some(std::mem::take(&mut refusals.suppressed))
    }

    /// Records `event`, if its category is recorded: queued to the
    /// writer, never waited for.
    pub fn record(&mut self, settings: &AuditSettings, event: Event) {
        let config = self.config(settings);
        if !config.records(event.category) {
            return;
        }
        if self.queued.load(Ordering::Relaxed) >= MAX_QUEUED {
            self.dropped += 1;
            if self.dropped.is_power_of_two() {
                log::warn!(
                    "audit: the writer is behind; {} entries dropped so far",
                    self.dropped
                );
            }
            return;
        }
        let principal = match serde_json::to_string(&event.cause.principal) {
            Ok(principal) => principal,
            Err(err) => {
                log::error!("audit: cannot write a principal: {err}");
                return;
            }
        };
        let row = Row {
            time_ms: now_ms(),
            category: event.category,
            event_type: event.event_type,
            agent_id: event.subject.as_ref().map(|s| s.id),
            agent_name: event.subject.as_ref().map(|s| s.name.clone()),
            principal,
            success: event.success,
            details: event.details.to_string(),
            tree_uid: event
                .subject
                .as_ref()
                .map_or(event.cause.tree_uid, |s| s.owner_uid),
            by_uid: event.cause.tree_uid,
            line: event.subject.as_ref().map(|s| line_of(&s.line)),
            run: event.cause.run,
            boot: self.boot,
        };
        let max_entries = config.max_entries;
        let queued = Arc::clone(&self.queued);
        queued.fetch_add(1, Ordering::Relaxed);
        self.run(Box::new(move |connection: &Connection| {
            queued.fetch_sub(1, Ordering::Relaxed);
            if let Err(err) = sql::insert(connection, &row, max_entries) {
                log::error!("audit: cannot record {}: {err}", row.event_type);
            }
        }));
    }

    /// Agent `id`'s incarnation has ended, or is being stopped: once it
    /// has ended, its end is recorded (once), as the agent's own doing.
    pub fn agent_ended(&mut self, id: u32, agents: &Agents, settings: &AuditSettings) {
        let Some(facts) = agents.facts(id) else {
            return;
        };
        let ended = !matches!(
            facts.state,
            AgentState::Starting | AgentState::Running | AgentState::Paused
        );
        if !ended || self.ends.get(&id) == Some(&facts.incarnation) {
            return;
        }
        if self.ends.len() >= REMEMBERED {
            self.ends.retain(|id, _| agents.facts(*id).is_some());
        }
        self.ends.insert(id, facts.incarnation);
        let details = Ended {
            state: facts.state,
            exit_code: facts.exit_code,
            signal: facts.signal,
            incarnation: facts.incarnation,
        };
        let event_type = match facts.state {
            AgentState::OomKilled => "AGENT_OOM_KILLED",
            _ => "AGENT_EXITED",
        };
        let cause = Cause {
            principal: PrincipalInfo::Agent {
                id,
                name: Some(facts.name.clone()),
            },
            tree_uid: facts.owner_uid,
            run: None,
        };
        let event = Event {
            category: AuditCategory::AgentLifecycle,
            event_type,
            cause,
            subject: Some(Subject::from_facts(id, facts)),
            success: true,
            details: serde_json::to_value(details).unwrap_or_default(),
        };
        self.record(settings, event);
    }

    /// GET_AUDIT_LOG for `reader`: the job a worker runs waits for the
    /// writer's answer.
    pub fn read(&mut self, reader: Reader, request: AuditLogRequest) -> Job {
        let (transaction, job) = answered(
            "audit log",
            move |connection: &Connection| sql::read(connection, reader, &request),
            |_| true,
        );
        self.run(transaction);
        job
    }

    /// Hands `transaction` to the writer thread; dropped if the store has
    /// closed.
    fn run(&mut self, transaction: Transaction) {
        hand(self.database.as_ref(), "audit log", transaction);
    }
}

/// The details of an agent's end.
#[derive(Serialize)]
struct Ended {
    state: AgentState,
    exit_code: Option<i32>,
    signal: Option<i32>,
    incarnation: u32,
}
