//! GET_PERMS (0x40) and SET_PERMS (0x41): what the caller may do now, and
//! lowering it, by one of the Clove SDK's levels or its `can_*` switches.
//! Nothing here ever raises a permission: a level keeps at most what it
//! names of what the caller already has.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::parse::{bad_request, parse_empty_or_object, parse_json};
use super::spawn::Permissions;
use crate::error::ErrorReply;

/// The Clove SDK's permission levels, from most to least.
///
/// | level          | keeps of what the caller has                        |
/// |----------------|-----------------------------------------------------|
/// | `unrestricted` | everything (setting it changes nothing)             |
/// | `standard`     | all but `exec`, `spawn`, `http`                     |
/// | `sandboxed`    | as `readonly` (the kernel cannot confine to paths)  |
/// | `readonly`     | all but `exec`, `spawn`, `http`, `write`            |
/// | `minimal`      | all but `exec`, `spawn`, `http`, `write`, `read`    |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum PermissionLevel {
    /// Everything the caller was granted.
    Unrestricted,
    /// No EXEC, SPAWN or HTTP.
    Standard,
    /// Clove's paths-confined level; here the same as `readonly`.
    Sandboxed,
    /// Files read only; no EXEC, SPAWN or HTTP.
    Readonly,
    /// THINK (and TASKs of THINK) only.
    Minimal,
}

impl PermissionLevel {
    /// `permissions` lowered to what this level keeps.
    ///
    /// ```
    /// use agentos_proto::payload::{PermissionLevel, Permissions};
    /// let standard = PermissionLevel::Standard.lower(Permissions::default());
    /// assert!(!standard.exec && !standard.http && standard.write && standard.think);
    /// let unchanged = PermissionLevel::Unrestricted.lower(Permissions::default());
    /// assert_eq!(unchanged, Permissions::default());
    /// ```
    pub fn lower(self, mut permissions: Permissions) -> Permissions {
        if self == PermissionLevel::Unrestricted {
            return permissions;
        }
        permissions.exec = false;
        permissions.spawn = false;
        permissions.http = false;
        if matches!(
            self,
            PermissionLevel::Sandboxed | PermissionLevel::Readonly | PermissionLevel::Minimal
        ) {
            permissions.write = false;
        }
        if self == PermissionLevel::Minimal {
            permissions.read = false;
        }
        permissions
    }

    /// The level `permissions` amount to: the lowest whose switches are
    /// all off, else `unrestricted` when EXEC, HTTP, READ and WRITE are all
    /// on, else `custom`.
    ///
    /// ```
    /// use agentos_proto::payload::{PermissionLevel, Permissions};
    /// assert_eq!(PermissionLevel::name_of(&Permissions::default()), "unrestricted");
    /// let readonly = PermissionLevel::Readonly.lower(Permissions::default());
    /// assert_eq!(PermissionLevel::name_of(&readonly), "readonly");
    /// let no_exec = Permissions { exec: false, ..Permissions::default() };
    /// assert_eq!(PermissionLevel::name_of(&no_exec), "custom");
    /// ```
    pub fn name_of(permissions: &Permissions) -> &'static str {
        let p = permissions;
        let lowered = !p.exec && !p.spawn && !p.http;
        match (lowered, p.write, p.read) {
            (true, false, false) => "minimal",
            (true, false, true) => "readonly",
            (true, true, _) => "standard",
            (false, ..) if p.exec && p.http && p.read && p.write => "unrestricted",
            (false, ..) => "custom",
        }
    }
}

/// A GET_PERMS request: empty, or `{}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct GetPermsRequest {}

impl GetPermsRequest {
    /// Parses a GET_PERMS payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        parse_empty_or_object("GET_PERMS", payload)
    }
}

/// A caller's permissions as GET_PERMS and SET_PERMS give them: the
/// protocol's switches and the level they amount to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PermissionsView {
    /// `unrestricted`, `standard`, `readonly`, `minimal` or `custom`.
    pub level: String,
    /// The switches, tools and token quota.
    #[serde(flatten)]
    pub permissions: Permissions,
}

impl From<Permissions> for PermissionsView {
    fn from(permissions: Permissions) -> Self {
        PermissionsView {
            level: PermissionLevel::name_of(&permissions).to_owned(),
            permissions,
        }
    }
}

/// GET_PERMS' and SET_PERMS' reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PermsReply {
    /// Always true.
    pub success: bool,
    /// Whose permissions these are: the caller's own id, or the agent
    /// SET_PERMS named.
    pub agent_id: u32,
    /// What it may do now.
    pub permissions: PermissionsView,
}

/// The Clove SDK's `permissions` object in SET_PERMS: its `can_*`
/// switches lower (`false`) or keep (`true`, only if already held). Its
/// path, command, domain and method lists are refused by name: the kernel
/// cannot enforce them, and ignoring them would promise what is not kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CloveSwitches {
    /// EXEC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_exec: Option<bool>,
    /// READ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_read: Option<bool>,
    /// WRITE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_write: Option<bool>,
    /// THINK.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_think: Option<bool>,
    /// SPAWN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_spawn: Option<bool>,
    /// HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub can_http: Option<bool>,
    /// Clove's path rules: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<Value>,
    /// Clove's allowed command prefixes: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<Value>,
    /// Clove's blocked commands: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_commands: Option<Value>,
    /// Clove's allowed domains: refused (a network policy says this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Value>,
    /// Clove's allowed HTTP methods: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_methods: Option<Value>,
    /// Clove's LLM quotas: refused (SPAWN's `permissions.llm_tokens` sets a
    /// budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<Value>,
    /// Clove's EXEC time limit: refused (EXEC's `timeout_ms` says this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_exec_time_ms: Option<Value>,
}

impl CloveSwitches {
    /// The first field the kernel cannot enforce, with what to use instead.
    fn unenforceable(&self) -> Option<(&'static str, &'static str)> {
        [
            (
                "filesystem",
                &self.filesystem,
                "path rules cannot be kept; use `can_read`/`can_write`",
            ),
            (
                "exec",
                &self.exec,
                "command lists cannot be kept; use `can_exec`",
            ),
            (
                "blocked_commands",
                &self.blocked_commands,
                "command lists cannot be kept; use `can_exec`",
            ),
            (
                "network",
                &self.network,
                "domains are a network policy (SPAWN's `network`, NET)",
            ),
            (
                "http_methods",
                &self.http_methods,
                "method lists cannot be kept; use `can_http`",
            ),
            (
                "llm",
                &self.llm,
                "token budgets are set by SPAWN's `permissions.llm_tokens`",
            ),
            (
                "max_exec_time_ms",
                &self.max_exec_time_ms,
                "EXEC's `timeout_ms` bounds a run",
            ),
        ]
        .into_iter()
        .find(|(_, value, _)| value.is_some())
        .map(|(field, _, instead)| (field, instead))
    }

    /// `permissions` with every switch set to `false` turned off.
    pub fn lower(&self, mut permissions: Permissions) -> Permissions {
        for (_, asked, held) in self.switches(&mut permissions) {
            if asked == Some(false) {
                *held = false;
            }
        }
        permissions
    }

    /// The first switch set to `true` that `permissions` do not hold:
    /// asking for it would be a raise.
    pub fn raise_in(&self, permissions: &Permissions) -> Option<&'static str> {
        let mut held = permissions.clone();
        let raise = self
            .switches(&mut held)
            .into_iter()
            .find(|(_, asked, held)| *asked == Some(true) && !**held)
            .map(|(name, ..)| name);
        raise
    }

    /// Each switch: its name, what was asked, and the permission it is.
    fn switches<'p>(
        &self,
        permissions: &'p mut Permissions,
    ) -> [(&'static str, Option<bool>, &'p mut bool); 6] {
        let Permissions {
            think,
            exec,
            spawn,
            read,
            write,
            http,
            ..
        } = permissions;
        [
            ("can_exec", self.can_exec, exec),
            ("can_read", self.can_read, read),
            ("can_write", self.can_write, write),
            ("can_think", self.can_think, think),
            ("can_spawn", self.can_spawn, spawn),
            ("can_http", self.can_http, http),
        ]
    }
}

/// A SET_PERMS request: a `level`, `permissions` switches, or both, for the
/// caller itself or for `agent_id`, one of the agents it may manage.
///
/// ```
/// use agentos_proto::payload::{PermissionLevel, SetPermsRequest};
/// let request = SetPermsRequest::parse(br#"{"level":"standard"}"#).unwrap();
/// assert_eq!(request.level, Some(PermissionLevel::Standard));
/// assert!(SetPermsRequest::parse(br#"{"level":"root"}"#).is_err());
/// assert!(SetPermsRequest::parse(br#"{"permissions":{"exec":["ls"]}}"#).is_err());
/// assert!(SetPermsRequest::parse(br#"{}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SetPermsRequest {
    /// One of Clove's levels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<PermissionLevel>,
    /// Clove's `can_*` switches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<CloveSwitches>,
    /// The agent to lower instead of the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<u32>,
}

impl SetPermsRequest {
    /// Parses a SET_PERMS payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: SetPermsRequest = parse_json("SET_PERMS", payload)?;
        if request.level.is_none() && request.permissions.is_none() {
            return Err(bad_request(
                "SET_PERMS needs a `level` or `permissions` (Clove's `can_*` switches)",
            ));
        }
        if let Some((field, instead)) = request
            .permissions
            .as_ref()
            .and_then(CloveSwitches::unenforceable)
        {
            return Err(bad_request(format!(
                "SET_PERMS field `permissions.{field}`: not enforced by this kernel, so not \
                 accepted ({instead})"
            )));
        }
        Ok(request)
    }
}
