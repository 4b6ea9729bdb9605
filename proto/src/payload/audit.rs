//! GET_AUDIT_LOG (0x76) and SET_AUDIT_CONFIG (0x77): the kernel's audit
//! log, as the Clove SDK's `get_audit_log` and `set_audit_config` send
//! them.
//!
//! An entry says what happened (`category`, `event_type`), to which agent
//! (`agent_id`, `agent_name`), who caused it (`principal`), and when. The
//! log is read forwards: entries come in ascending `id`, after `since_id`,
//! at most `limit` of them, so a reader that asks again from the last id
//! it saw misses nothing.

use serde::{Deserialize, Serialize};

use super::hello::PrincipalInfo;
use super::parse::{bad_request, parse_empty_or_object};
use crate::error::ErrorReply;

/// The most entries one GET_AUDIT_LOG reply holds.
pub const MAX_AUDIT_ENTRIES: u32 = 1000;
/// The entries a GET_AUDIT_LOG without a `limit` gets.
pub const DEFAULT_AUDIT_ENTRIES: u32 = 100;

/// What an entry is about, in the Clove SDK's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AuditCategory {
    /// Refusals, and changes to what a caller may do or reach.
    Security,
    /// Agents spawned, killed, ended.
    AgentLifecycle,
    /// Messages between agents.
    Ipc,
    /// The state store.
    StateStore,
    /// Quotas and limits reached.
    Resource,
    /// Calls made (verbose): TOOL calls.
    Syscall,
    /// Network requests.
    Network,
    /// World simulations.
    World,
}

impl AuditCategory {
    /// Every category.
    pub const ALL: [AuditCategory; 8] = [
        AuditCategory::Security,
        AuditCategory::AgentLifecycle,
        AuditCategory::Ipc,
        AuditCategory::StateStore,
        AuditCategory::Resource,
        AuditCategory::Syscall,
        AuditCategory::Network,
        AuditCategory::World,
    ];

    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditCategory::Security => "SECURITY",
            AuditCategory::AgentLifecycle => "AGENT_LIFECYCLE",
            AuditCategory::Ipc => "IPC",
            AuditCategory::StateStore => "STATE_STORE",
            AuditCategory::Resource => "RESOURCE",
            AuditCategory::Syscall => "SYSCALL",
            AuditCategory::Network => "NETWORK",
            AuditCategory::World => "WORLD",
        }
    }

    /// The category a wire word names.
    pub fn from_name(name: &str) -> Option<AuditCategory> {
        AuditCategory::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

/// A GET_AUDIT_LOG request: empty, or `{"category": "...", "agent_id":
/// N, "since_id": N, "limit": N}`.
///
/// ```
/// use agentos_proto::payload::{AuditCategory, AuditLogRequest};
/// let asked = AuditLogRequest::parse(br#"{"category":"AGENT_LIFECYCLE","limit":20}"#).unwrap();
/// assert_eq!(asked.category, Some(AuditCategory::AgentLifecycle));
/// assert_eq!(AuditLogRequest::parse(b"").unwrap().limit(), 100);
/// assert!(AuditLogRequest::parse(br#"{"category":"EVERYTHING"}"#).is_err());
/// assert!(AuditLogRequest::parse(br#"{"limit":0}"#).is_err());
/// assert!(AuditLogRequest::parse(br#"{"since":3}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AuditLogRequest {
    /// Only entries of this category.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<AuditCategory>,
    /// Only entries about this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<u32>,
    /// Only entries after this id (exclusive).
    #[serde(default)]
    pub since_id: u64,
    /// At most this many entries: at least 1, capped at
    /// [`MAX_AUDIT_ENTRIES`] (default [`DEFAULT_AUDIT_ENTRIES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

impl AuditLogRequest {
    /// Parses a GET_AUDIT_LOG payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: AuditLogRequest = parse_empty_or_object("GET_AUDIT_LOG", payload)?;
        if request.limit == Some(0) {
            return Err(bad_request(
                "GET_AUDIT_LOG field `limit`: at least 1 (leave it out for 100)",
            ));
        }
        Ok(request)
    }

    /// How many entries at most: what was asked, capped at
    /// [`MAX_AUDIT_ENTRIES`] (a reply says `more`, and the rest are a
    /// `since_id` away).
    pub fn limit(&self) -> u32 {
        self.limit
            .unwrap_or(DEFAULT_AUDIT_ENTRIES)
            .min(MAX_AUDIT_ENTRIES)
    }
}

/// One entry of the audit log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AuditEntry {
    /// Its number: entries are numbered in the order they happened.
    pub id: u64,
    /// When (RFC 3339, UTC).
    pub timestamp: String,
    /// What it is about.
    pub category: AuditCategory,
    /// What happened, e.g. `AGENT_SPAWNED`, `PERMISSION_DENIED`.
    pub event_type: String,
    /// The agent it is about, if one.
    #[serde(default)]
    pub agent_id: Option<u32>,
    /// That agent's name, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
    /// Who caused it.
    pub principal: PrincipalInfo,
    /// Whether what was asked was done (`false` for a refusal).
    pub success: bool,
    /// What else there is to say of it.
    pub details: serde_json::Value,
}

/// GET_AUDIT_LOG's reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AuditLogReply {
    /// Always true.
    pub success: bool,
    /// How many entries there are.
    pub count: usize,
    /// The entries, ascending by id.
    pub entries: Vec<AuditEntry>,
    /// Whether more entries the caller may read follow the last one (ask
    /// again with its id as `since_id`).
    pub more: bool,
}

/// What the audit log records, and how many entries it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AuditConfig {
    /// The most entries kept; the oldest go first.
    pub max_entries: u64,
    /// TOOL calls (category `SYSCALL`).
    pub log_syscalls: bool,
    /// Refusals and changes to permissions and networks (always on).
    pub log_security: bool,
    /// Agents spawned, killed and ended (always on).
    pub log_lifecycle: bool,
    /// Messages between agents.
    pub log_ipc: bool,
    /// The state store.
    pub log_state: bool,
    /// Quotas and limits reached.
    pub log_resource: bool,
    /// Network requests.
    pub log_network: bool,
    /// World simulations.
    pub log_world: bool,
}

impl AuditConfig {
    /// Whether entries of `category` are recorded.
    pub fn records(&self, category: AuditCategory) -> bool {
        match category {
            AuditCategory::Security => self.log_security,
            AuditCategory::AgentLifecycle => self.log_lifecycle,
            AuditCategory::Ipc => self.log_ipc,
            AuditCategory::StateStore => self.log_state,
            AuditCategory::Resource => self.log_resource,
            AuditCategory::Syscall => self.log_syscalls,
            AuditCategory::Network => self.log_network,
            AuditCategory::World => self.log_world,
        }
    }
}

/// A SET_AUDIT_CONFIG request: the switches to change, the rest kept.
///
/// ```
/// use agentos_proto::payload::SetAuditConfigRequest;
/// let set = SetAuditConfigRequest::parse(br#"{"log_syscalls":true,"max_entries":1000}"#).unwrap();
/// assert_eq!((set.log_syscalls, set.max_entries), (Some(true), Some(1000)));
/// assert!(SetAuditConfigRequest::parse(br#"{"log_everything":true}"#).is_err());
/// assert!(SetAuditConfigRequest::parse(br#"{"max_entries":0}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SetAuditConfigRequest {
    /// The most entries kept (at most the kernel's `audit.max_entries`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u64>,
    /// TOOL calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_syscalls: Option<bool>,
    /// Security entries: may not be turned off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_security: Option<bool>,
    /// Lifecycle entries: may not be turned off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_lifecycle: Option<bool>,
    /// Messages between agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_ipc: Option<bool>,
    /// The state store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_state: Option<bool>,
    /// Quotas and limits reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_resource: Option<bool>,
    /// Network requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_network: Option<bool>,
    /// World simulations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_world: Option<bool>,
}

impl SetAuditConfigRequest {
    /// Parses a SET_AUDIT_CONFIG payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: SetAuditConfigRequest = parse_empty_or_object("SET_AUDIT_CONFIG", payload)?;
        if request.max_entries == Some(0) {
            return Err(bad_request(
                "SET_AUDIT_CONFIG field `max_entries`: must be at least 1",
            ));
        }
        Ok(request)
    }

    /// The first switch it turns off that may not be turned off, by name.
    pub fn turns_off_required(&self) -> Option<&'static str> {
        if self.log_security == Some(false) {
            Some("log_security")
        } else if self.log_lifecycle == Some(false) {
            Some("log_lifecycle")
        } else {
            None
        }
    }

    /// `config` with this request's changes.
    pub fn applied_to(&self, config: AuditConfig) -> AuditConfig {
        let set = |asked: Option<bool>, was: bool| asked.unwrap_or(was);
        AuditConfig {
            max_entries: self.max_entries.unwrap_or(config.max_entries),
            log_syscalls: set(self.log_syscalls, config.log_syscalls),
            log_security: set(self.log_security, config.log_security),
            log_lifecycle: set(self.log_lifecycle, config.log_lifecycle),
            log_ipc: set(self.log_ipc, config.log_ipc),
            log_state: set(self.log_state, config.log_state),
            log_resource: set(self.log_resource, config.log_resource),
            log_network: set(self.log_network, config.log_network),
            log_world: set(self.log_world, config.log_world),
        }
    }
}

/// SET_AUDIT_CONFIG's reply: the configuration now in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AuditConfigReply {
    /// Always true.
    pub success: bool,
    /// What is in force.
    pub config: AuditConfig,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_clove_words_both_ways() {
        for category in AuditCategory::ALL {
            let word = serde_json::to_string(&category).unwrap();
            assert_eq!(word, format!("\"{}\"", category.as_str()));
            assert_eq!(AuditCategory::from_name(category.as_str()), Some(category));
        }
        assert_eq!(AuditCategory::from_name("security"), None);
    }

    #[test]
    fn the_clove_sdks_payloads_parse_and_limits_are_capped() {
        let asked = AuditLogRequest::parse(
            br#"{"limit":5,"agent_id":3,"since_id":9,"category":"SECURITY"}"#,
        )
        .unwrap();
        assert_eq!(asked.agent_id, Some(3));
        assert_eq!(asked.since_id, 9);
        let over = format!(r#"{{"limit":{}}}"#, MAX_AUDIT_ENTRIES + 1);
        let capped = AuditLogRequest::parse(over.as_bytes()).unwrap();
        assert_eq!(capped.limit(), MAX_AUDIT_ENTRIES);
        assert!(AuditLogRequest::parse(br#"{"since_id":-1}"#).is_err());
        let set = SetAuditConfigRequest::parse(
            br#"{"log_lifecycle":true,"log_security":true,"log_syscalls":false,"max_entries":1000}"#,
        )
        .unwrap();
        assert_eq!(set.turns_off_required(), None);
        let off = SetAuditConfigRequest::parse(br#"{"log_security":false}"#).unwrap();
        assert_eq!(off.turns_off_required(), Some("log_security"));
    }
}
