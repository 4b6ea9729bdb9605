//! SUBSCRIBE (0x60), UNSUBSCRIBE (0x61), POLL (0x62) and EMIT (0x63):
//! the kernel's events, as the Clove SDK's `subscribe`, `unsubscribe`,
//! `poll_events` and `emit_event` send them.
//!
//! An event has a type: one of the kernel's own ([`KernelEvent`]: an
//! agent spawned, exited, was paused, ...), which only the kernel makes,
//! or `CUSTOM`, which EMIT makes and which carries the emitter's own type
//! name as `custom_type`. Subscribing to a name that is not the kernel's
//! subscribes to the CUSTOM events of that `custom_type`; `CUSTOM` itself
//! to every CUSTOM event.

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, parse_empty_or_object, parse_json};
use crate::error::{ErrorCode, ErrorReply};

/// The longest event type name, in bytes.
pub const MAX_EVENT_TYPE_LEN: usize = 128;
/// The most type names one SUBSCRIBE or UNSUBSCRIBE names.
pub const MAX_EVENT_TYPES: usize = 64;
/// The largest `data` EMIT carries, in bytes of JSON.
pub const MAX_EVENT_DATA_BYTES: usize = 64 * 1024;
/// The most events one POLL returns, whatever its `max`.
pub const MAX_POLL_EVENTS: usize = 500;
/// POLL's `max` when it gives none.
pub const DEFAULT_POLL_EVENTS: usize = 100;

/// The event types the kernel makes (Clove's names, and two of this
/// kernel's own). EMIT may not make one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum KernelEvent {
    /// An agent's first incarnation runs.
    AgentSpawned,
    /// An agent has ended for good (exited, killed, failed).
    AgentExited,
    /// An agent's processes were frozen.
    AgentPaused,
    /// A paused agent goes on.
    AgentResumed,
    /// An agent's incarnation ended and its restart policy starts another.
    AgentRestarting,
    /// An agent used up its restarts.
    AgentEscalated,
    /// The memory limit killed a process of an agent.
    AgentOomKilled,
    /// A message arrived in a mailbox.
    MessageReceived,
    /// A key of the state store changed.
    StateChanged,
    /// A request was refused for want of a permission.
    SyscallBlocked,
    /// An agent nears one of its limits.
    ResourceWarning,
    /// A background task ended.
    TaskEnded,
}

impl KernelEvent {
    /// Every kernel event type.
    pub const ALL: [KernelEvent; 12] = [
        KernelEvent::AgentSpawned,
        KernelEvent::AgentExited,
        KernelEvent::AgentPaused,
        KernelEvent::AgentResumed,
        KernelEvent::AgentRestarting,
        KernelEvent::AgentEscalated,
        KernelEvent::AgentOomKilled,
        KernelEvent::MessageReceived,
        KernelEvent::StateChanged,
        KernelEvent::SyscallBlocked,
        KernelEvent::ResourceWarning,
        KernelEvent::TaskEnded,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelEvent::AgentSpawned => "AGENT_SPAWNED",
            KernelEvent::AgentExited => "AGENT_EXITED",
            KernelEvent::AgentPaused => "AGENT_PAUSED",
            KernelEvent::AgentResumed => "AGENT_RESUMED",
            KernelEvent::AgentRestarting => "AGENT_RESTARTING",
            KernelEvent::AgentEscalated => "AGENT_ESCALATED",
            KernelEvent::AgentOomKilled => "AGENT_OOM_KILLED",
            KernelEvent::MessageReceived => "MESSAGE_RECEIVED",
            KernelEvent::StateChanged => "STATE_CHANGED",
            KernelEvent::SyscallBlocked => "SYSCALL_BLOCKED",
            KernelEvent::ResourceWarning => "RESOURCE_WARNING",
            KernelEvent::TaskEnded => "TASK_ENDED",
        }
    }

    /// The kernel event type `name` is, if it is one (case as on the
    /// wire).
    pub fn from_name(name: &str) -> Option<KernelEvent> {
        KernelEvent::ALL.into_iter().find(|e| e.as_str() == name)
    }
}

/// The type name of every CUSTOM event, and of the topic that matches
/// them all.
pub const CUSTOM: &str = "CUSTOM";

/// What a subscription asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Topic {
    /// One kernel event type.
    Kernel(KernelEvent),
    /// Every CUSTOM event.
    AnyCustom,
    /// The CUSTOM events of one `custom_type`.
    Custom(String),
}

impl Topic {
    /// The topic a type name names.
    pub fn from_name(name: &str) -> Topic {
        match KernelEvent::from_name(name) {
            Some(kernel) => Topic::Kernel(kernel),
            None if name == CUSTOM => Topic::AnyCustom,
            None => Topic::Custom(name.to_owned()),
        }
    }

    /// Its type name.
    pub fn name(&self) -> &str {
        match self {
            Topic::Kernel(kernel) => kernel.as_str(),
            Topic::AnyCustom => CUSTOM,
            Topic::Custom(name) => name,
        }
    }
}

/// A SUBSCRIBE or UNSUBSCRIBE request: `{"event_types": [...]}` (the
/// Clove SDK's), or `{"events": [...]}` or `{"event": "..."}` (Clove's
/// own other spellings); UNSUBSCRIBE also takes `{"all": true}`.
///
/// ```
/// use agentos_proto::payload::{KernelEvent, SubscribeRequest, Topic};
/// let asked = SubscribeRequest::parse("SUBSCRIBE", br#"{"event_types":["AGENT_SPAWNED","CUSTOM","job.done"]}"#).unwrap();
/// assert_eq!(asked.topics().unwrap(), [
///     Topic::Kernel(KernelEvent::AgentSpawned), Topic::AnyCustom, Topic::Custom("job.done".into())]);
/// assert!(SubscribeRequest::parse("SUBSCRIBE", br#"{"event_types":[""]}"#).unwrap().topics().is_err());
/// assert!(SubscribeRequest::parse("SUBSCRIBE", br#"{"types":["CUSTOM"]}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SubscribeRequest {
    /// The type names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    /// The same (Clove's other spelling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
    /// One type name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// UNSUBSCRIBE only: every type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<bool>,
}

impl SubscribeRequest {
    /// Parses a SUBSCRIBE or UNSUBSCRIBE (`what`) payload.
    pub fn parse(what: &str, payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: SubscribeRequest = parse_json(what, payload)?;
        if request.all.is_some() && what == "SUBSCRIBE" {
            return Err(bad_request(
                "SUBSCRIBE payload: unknown field `all` (subscribe by type name)",
            ));
        }
        Ok(request)
    }

    /// Whether it asks to unsubscribe from every type.
    pub fn is_all(&self) -> bool {
        self.all == Some(true)
    }

    /// The topics it names, each once, in order.
    pub fn topics(&self) -> Result<Vec<Topic>, ErrorReply> {
        let names: Vec<&String> = self
            .event_types
            .iter()
            .chain(&self.events)
            .flatten()
            .chain(&self.event)
            .collect();
        if names.len() > MAX_EVENT_TYPES {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "field `event_types`: at most {MAX_EVENT_TYPES} type names (got {})",
                    names.len()
                ),
            ));
        }
        let mut topics = Vec::with_capacity(names.len());
        for name in names {
            check_type_name("event_types", name)?;
            let topic = Topic::from_name(name);
            if !topics.contains(&topic) {
                topics.push(topic);
            }
        }
        Ok(topics)
    }
}

/// A POLL request: empty, or `{"max": N}` (at most [`MAX_POLL_EVENTS`]
/// are returned whatever `N` is).
///
/// ```
/// use agentos_proto::payload::{PollRequest, MAX_POLL_EVENTS};
/// assert_eq!(PollRequest::parse(b"").unwrap().limit(), 100);
/// assert_eq!(PollRequest::parse(br#"{"max":1000000000}"#).unwrap().limit(), MAX_POLL_EVENTS);
/// assert!(PollRequest::parse(br#"{"max":-1}"#).is_err());
/// assert!(PollRequest::parse(br#"{"mx":1}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PollRequest {
    /// The most events wanted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
}

impl PollRequest {
    /// Parses a POLL payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_empty_or_object("POLL", payload)
    }

    /// How many events it may get: `max`, capped at [`MAX_POLL_EVENTS`].
    pub fn limit(&self) -> usize {
        self.max.map_or(DEFAULT_POLL_EVENTS, |max| {
            usize::try_from(max).map_or(MAX_POLL_EVENTS, |max| max.min(MAX_POLL_EVENTS))
        })
    }
}

/// An EMIT request: `{"event_type": "...", "data": <any JSON>}` (the
/// Clove SDK's; `event` is accepted for `event_type`, as Clove's kernel
/// reads it).
///
/// ```
/// use agentos_proto::payload::EmitRequest;
/// let emit = EmitRequest::parse(br#"{"event_type":"job.done","data":{"n":1}}"#).unwrap();
/// assert_eq!(emit.event_type, "job.done");
/// assert!(EmitRequest::parse(br#"{"event_type":"AGENT_EXITED"}"#).is_err());
/// assert!(EmitRequest::parse(br#"{"event":"CUSTOM","data":1}"#).is_ok());
/// assert!(EmitRequest::parse(br#"{"event_type":"x","source_agent_id":1}"#).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct EmitRequest {
    /// The emitter's own type name (`custom_type` of the event made).
    #[serde(alias = "event", default = "custom_name")]
    pub event_type: String,
    /// Any JSON value.
    #[serde(default)]
    pub data: serde_json::Value,
}

fn custom_name() -> String {
    CUSTOM.to_owned()
}

impl EmitRequest {
    /// Parses an EMIT payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: EmitRequest = parse_json("EMIT", payload)?;
        check_type_name("event_type", &request.event_type)?;
        if let Some(kernel) = KernelEvent::from_name(&request.event_type) {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                format!(
                    "EMIT field `event_type`: {} is the kernel's own event type; only the \
                     kernel reports it. EMIT makes CUSTOM events: give a type name of your own",
                    kernel.as_str()
                ),
            ));
        }
        Ok(request)
    }
}

/// A type name: 1 to [`MAX_EVENT_TYPE_LEN`] bytes, no control
/// characters, and not `*` (there is no such wildcard here).
fn check_type_name(field: &str, name: &str) -> Result<(), ErrorReply> {
    if name.is_empty() || name.len() > MAX_EVENT_TYPE_LEN {
        return Err(bad_request(format!(
            "field `{field}`: a type name is 1 to {MAX_EVENT_TYPE_LEN} bytes (got {})",
            name.len()
        )));
    }
    if let Some(bad) = name.chars().find(|c| c.is_control()) {
        return Err(bad_request(format!(
            "field `{field}`: no control characters in a type name (found {bad:?})"
        )));
    }
    Ok(())
}

/// SUBSCRIBE's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SubscribeReply {
    /// Always true.
    pub success: bool,
    /// The type names this request subscribed to.
    pub subscribed: Vec<String>,
}

/// UNSUBSCRIBE's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UnsubscribeReply {
    /// Always true.
    pub success: bool,
    /// The type names this request ended a subscription to.
    pub unsubscribed: Vec<String>,
    /// The type names still subscribed to.
    pub subscribed: Vec<String>,
}

/// One event, as POLL returns it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EventInfo {
    /// Its type: a kernel event type, or `CUSTOM`.
    #[serde(rename = "type")]
    pub kind: String,
    /// For a CUSTOM event, the emitter's type name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_type: Option<String>,
    /// What it says.
    pub data: serde_json::Value,
    /// Who made it, as the kernel knows the emitter (the id its replies
    /// carry); 0 for the kernel.
    pub source_agent_id: u32,
    /// When, in milliseconds since the Unix epoch.
    pub timestamp: u64,
}

/// POLL's reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PollReply {
    /// Always true.
    pub success: bool,
    /// The events, oldest first.
    pub events: Vec<EventInfo>,
    /// How many.
    pub count: usize,
    /// Events lost since the last POLL because the queue was full (the
    /// oldest go first).
    pub dropped: u64,
    /// Events still queued.
    pub pending: usize,
}

/// EMIT's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EmitReply {
    /// Always true.
    pub success: bool,
    /// The type of the event made: `CUSTOM`.
    pub event: String,
    /// Its `custom_type`.
    pub custom_type: String,
    /// How many subscriptions it was queued for.
    pub delivered_to: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_name_round_trips_and_serde_agrees() {
        for kernel in KernelEvent::ALL {
            assert_eq!(KernelEvent::from_name(kernel.as_str()), Some(kernel));
            let json = serde_json::to_string(&kernel).unwrap();
            assert_eq!(json, format!("\"{}\"", kernel.as_str()));
        }
        assert_eq!(KernelEvent::from_name("agent_spawned"), None);
    }

    #[test]
    fn emit_refuses_every_kernel_name_and_bad_names() {
        for kernel in KernelEvent::ALL {
            let payload = format!(r#"{{"event_type":"{}"}}"#, kernel.as_str());
            let err = EmitRequest::parse(payload.as_bytes()).unwrap_err();
            assert_eq!(err.code, ErrorCode::PermissionDenied);
            assert!(err.error.contains(kernel.as_str()), "{}", err.error);
        }
        let long = format!(
            r#"{{"event_type":"{}"}}"#,
            "x".repeat(MAX_EVENT_TYPE_LEN + 1)
        );
        assert!(EmitRequest::parse(long.as_bytes()).is_err());
        assert!(EmitRequest::parse(br#"{"event_type":"a\nb"}"#).is_err());
        assert_eq!(EmitRequest::parse(b"{}").unwrap().event_type, CUSTOM);
    }

    #[test]
    fn subscriptions_are_bounded_and_unsubscribe_all_is_its_own() {
        let many: Vec<String> = (0..=MAX_EVENT_TYPES).map(|n| format!("t{n}")).collect();
        let payload = serde_json::json!({ "event_types": many }).to_string();
        let asked = SubscribeRequest::parse("SUBSCRIBE", payload.as_bytes()).unwrap();
        assert_eq!(asked.topics().unwrap_err().code, ErrorCode::LimitExceeded);
        assert!(SubscribeRequest::parse("SUBSCRIBE", br#"{"all":true}"#).is_err());
        let all = SubscribeRequest::parse("UNSUBSCRIBE", br#"{"all":true}"#).unwrap();
        assert!(all.is_all());
        let twice =
            SubscribeRequest::parse("SUBSCRIBE", br#"{"events":["CUSTOM"],"event":"CUSTOM"}"#)
                .unwrap();
        assert_eq!(twice.topics().unwrap(), [Topic::AnyCustom]);
    }
}
