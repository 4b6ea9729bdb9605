//! SPAWN (0x10): start an agent process.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::agent_state::AgentState;
use super::hello::CgroupVersion;
use super::network::Network;
use super::parse::{bad_request, check_range, parse_json, validate_name};
use crate::error::ErrorReply;

/// Resource limits of an agent's cgroup. Absent fields take the kernel's
/// defaults. LIST reports them too, so the type itself reads fields it
/// does not know; a request refuses them when it is parsed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
// Published schemas describe requests, which refuse unknown fields.
#[cfg_attr(feature = "schema", schemars(deny_unknown_fields))]
pub struct Limits {
    /// Hard memory limit in bytes, swap excluded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// CPU time allowed per period, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_quota: Option<u64>,
    /// The CPU accounting period, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_period: Option<u64>,
    /// Maximum number of processes and threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pids: Option<u64>,
}

impl Limits {
    /// Smallest memory limit: below this not even an interpreter starts.
    pub const MIN_MEMORY: u64 = 1 << 20;
    /// Largest memory limit (1 TiB).
    pub const MAX_MEMORY: u64 = 1 << 40;
    /// CPU period bounds the Linux scheduler accepts (1 ms to 1 s).
    pub const CPU_PERIOD_RANGE: (u64, u64) = (1_000, 1_000_000);
    /// CPU quota bounds: at least 1 ms, at most 1024 CPUs' worth of the longest period.
    pub const CPU_QUOTA_RANGE: (u64, u64) = (1_000, 1_024_000_000);
    /// Process-count bounds (Linux's `PID_MAX_LIMIT`).
    pub const MAX_PIDS_RANGE: (u64, u64) = (1, 4_194_304);

    /// Checks every limit against its allowed range.
    pub fn validate(&self) -> Result<(), ErrorReply> {
        check_range(
            "limits.memory",
            self.memory,
            Self::MIN_MEMORY,
            Self::MAX_MEMORY,
        )?;
        let (lo, hi) = Self::CPU_PERIOD_RANGE;
        check_range("limits.cpu_period", self.cpu_period, lo, hi)?;
        let (lo, hi) = Self::CPU_QUOTA_RANGE;
        check_range("limits.cpu_quota", self.cpu_quota, lo, hi)?;
        let (lo, hi) = Self::MAX_PIDS_RANGE;
        check_range("limits.max_pids", self.max_pids, lo, hi)
    }
}

/// When the kernel restarts an agent that ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Never restart (the default).
    #[default]
    Never,
    /// Restart after a non-zero exit, a signal or an OOM kill.
    OnFailure,
    /// Restart whenever it ends, unless it was KILLed.
    Always,
}

/// What an agent may ask of the kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Permissions {
    /// May use THINK.
    #[serde(default = "yes")]
    pub think: bool,
    /// May use EXEC.
    #[serde(default = "yes")]
    pub exec: bool,
    /// May SPAWN agents of its own.
    #[serde(default)]
    pub spawn: bool,
    /// May dispatch TASKs (of the kinds its other permissions allow).
    #[serde(default = "yes")]
    pub task: bool,
    /// May READ files (0x03) in its own view of the filesystem.
    #[serde(default = "yes")]
    pub read: bool,
    /// May WRITE files (0x04) in its own view of the filesystem.
    #[serde(default = "yes")]
    pub write: bool,
    /// May have the kernel make HTTP requests (0x50), within its network
    /// policy.
    #[serde(default = "yes")]
    pub http: bool,
    /// May message every agent of its operator's tree (SEND, BROADCAST);
    /// without it, only its operator, its parent and its children.
    #[serde(default)]
    pub ipc: bool,
    /// LLM token quota; 0 means unlimited.
    #[serde(default)]
    pub llm_tokens: u64,
    /// The tools it may call, as `server.tool` patterns where `*` stands
    /// for any run of characters.
    #[serde(default = "every_tool")]
    pub tools: Vec<String>,
}

fn every_tool() -> Vec<String> {
    vec!["*".to_owned()]
}

fn yes() -> bool {
    true
}

/// Most patterns in `permissions.tools`.
pub const MAX_TOOL_PATTERNS: usize = 64;
/// Longest pattern in `permissions.tools`, in bytes.
pub const MAX_TOOL_PATTERN: usize = 256;

/// The `permissions` of a SPAWN request: what the new agent may do. An
/// absent field takes the kernel's default for an operator's SPAWN, and
/// the parent's own value for an agent's (which may ask for less, never
/// more).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PermissionsRequest {
    /// May use THINK.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub think: Option<bool>,
    /// May use EXEC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<bool>,
    /// May SPAWN agents of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawn: Option<bool>,
    /// May dispatch TASKs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<bool>,
    /// May READ files in its own view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<bool>,
    /// May WRITE files in its own view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<bool>,
    /// May make HTTP requests through the kernel, within its network policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<bool>,
    /// May message every agent of its operator's tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc: Option<bool>,
    /// LLM token budget; 0 means unlimited (for an operator's SPAWN) or
    /// "share the parent's" (for an agent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm_tokens: Option<u64>,
    /// The tools it may call (`server.tool` patterns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

impl PermissionsRequest {
    /// The permissions asked for, with `defaults` where nothing was asked.
    ///
    /// ```
    /// use agentos_proto::payload::{Permissions, PermissionsRequest};
    /// let asked = PermissionsRequest { spawn: Some(true), ..Default::default() };
    /// let granted = asked.or(Permissions::default());
    /// assert!(granted.spawn && granted.think);
    /// ```
    pub fn or(&self, defaults: Permissions) -> Permissions {
        Permissions {
            think: self.think.unwrap_or(defaults.think),
            exec: self.exec.unwrap_or(defaults.exec),
            spawn: self.spawn.unwrap_or(defaults.spawn),
            task: self.task.unwrap_or(defaults.task),
            read: self.read.unwrap_or(defaults.read),
            write: self.write.unwrap_or(defaults.write),
            http: self.http.unwrap_or(defaults.http),
            ipc: self.ipc.unwrap_or(defaults.ipc),
            llm_tokens: self.llm_tokens.unwrap_or(defaults.llm_tokens),
            tools: self.tools.clone().unwrap_or(defaults.tools),
        }
    }

    /// The first switch asked `true` that `held` lacks: asking for it is
    /// asking for more than is held.
    ///
    /// ```
    /// use agentos_proto::payload::{Permissions, PermissionsRequest};
    /// let asked = PermissionsRequest { spawn: Some(true), ..Default::default() };
    /// assert_eq!(asked.beyond(&Permissions::default()), Some("spawn"));
    /// assert_eq!(PermissionsRequest::default().beyond(&Permissions::default()), None);
    /// ```
    pub fn beyond(&self, held: &Permissions) -> Option<&'static str> {
        let mut asked = self.clone();
        let beyond = asked
            .switches(held)
            .into_iter()
            .find(|(_, asked, held)| **asked == Some(true) && !held)
            .map(|(name, ..)| name);
        beyond
    }

    /// Asks `false` for every switch `held` lacks and the request left out,
    /// so defaults cannot give it.
    pub fn cap(&mut self, held: &Permissions) {
        for (_, asked, held) in self.switches(held) {
            if !held {
                asked.get_or_insert(false);
            }
        }
    }

    /// Each switch: its name, what was asked, and whether `held` has it.
    fn switches(&mut self, held: &Permissions) -> [(&'static str, &mut Option<bool>, bool); 8] {
        [
            ("think", &mut self.think, held.think),
            ("exec", &mut self.exec, held.exec),
            ("spawn", &mut self.spawn, held.spawn),
            ("task", &mut self.task, held.task),
            ("read", &mut self.read, held.read),
            ("write", &mut self.write, held.write),
            ("http", &mut self.http, held.http),
            ("ipc", &mut self.ipc, held.ipc),
        ]
    }
}

fn default_max_restarts() -> u32 {
    5
}

fn default_restart_window() -> u64 {
    300
}

impl Default for Permissions {
    fn default() -> Self {
        Permissions {
            think: true,
            exec: true,
            spawn: false,
            task: true,
            read: true,
            write: true,
            http: true,
            ipc: false,
            llm_tokens: 0,
            tools: every_tool(),
        }
    }
}

/// A SPAWN request.
///
/// ```
/// use agentos_proto::payload::SpawnRequest;
/// let request = SpawnRequest::parse(br#"{"name":"w1","script":"/srv/agent.py"}"#).unwrap();
/// assert!(request.sandboxed);
/// assert!(request.network.is_none());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SpawnRequest {
    /// Unique among live agents, `[A-Za-z0-9_.-]{1,64}`.
    pub name: String,
    /// A Python script to run with `python`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// The interpreter for `script`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// An argv to run instead of a script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Extra arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Namespaces and cgroup (default true).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub sandboxed: bool,
    /// `false`: a private network namespace with only loopback; `true`:
    /// the host's network; or a policy. Left out: the kernel's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// cgroup limits.
    #[serde(default, skip_serializing_if = "is_default")]
    pub limits: Limits,
    /// When to restart.
    #[serde(default, skip_serializing_if = "is_default")]
    pub restart_policy: RestartPolicy,
    /// Restarts allowed within `restart_window`.
    #[serde(
        default = "default_max_restarts",
        skip_serializing_if = "is_default_max_restarts"
    )]
    pub max_restarts: u32,
    /// The restart-counting window, in seconds.
    #[serde(
        default = "default_restart_window",
        skip_serializing_if = "is_default_restart_window"
    )]
    pub restart_window: u64,
    /// What the agent may ask of the kernel.
    #[serde(default, skip_serializing_if = "is_default")]
    pub permissions: PermissionsRequest,
    /// Volumes mounted into its sandbox (sandboxed agents only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<super::volumes::VolumeMount>,
    /// Start from this template (sandboxed agents only): its environment
    /// is mounted read-only, first on `PATH`, and runs a `script` unless
    /// `python` names another interpreter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

// Serialised, a request leaves out what its reader would default, so a
// client's payload says only what it asks for.
fn is_true(value: &bool) -> bool {
    *value
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

fn is_default_max_restarts(value: &u32) -> bool {
    *value == default_max_restarts()
}

fn is_default_restart_window(value: &u64) -> bool {
    *value == default_restart_window()
}

impl SpawnRequest {
    /// A request for an agent named `name` with every other field the
    /// protocol's default; it needs a `script` or a `command` to be valid.
    ///
    /// ```
    /// use agentos_proto::payload::SpawnRequest;
    /// let request = SpawnRequest {
    ///     command: Some(vec!["/bin/true".into()]),
    ///     ..SpawnRequest::named("w1")
    /// };
    /// let payload = serde_json::to_vec(&request).unwrap();
    /// assert_eq!(payload, br#"{"name":"w1","command":["/bin/true"]}"#);
    /// assert_eq!(SpawnRequest::parse(&payload).unwrap(), request);
    /// ```
    pub fn named(name: impl Into<String>) -> SpawnRequest {
        SpawnRequest {
            name: name.into(),
            script: None,
            python: None,
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            sandboxed: true,
            network: None,
            limits: Limits::default(),
            restart_policy: RestartPolicy::default(),
            max_restarts: default_max_restarts(),
            restart_window: default_restart_window(),
            permissions: PermissionsRequest::default(),
            volumes: Vec::new(),
            template: None,
        }
    }

    /// Parses and validates a SPAWN payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: SpawnRequest = parse_json("SPAWN", payload)?;
        request.validate()?;
        Ok(request)
    }

    /// Checks the protocol's rules for a SPAWN request.
    pub fn validate(&self) -> Result<(), ErrorReply> {
        validate_name("name", &self.name)?;
        match (&self.script, &self.command) {
            (Some(_), Some(_)) => {
                return Err(bad_request(
                    "SPAWN takes either `script` or `command`, not both",
                ))
            }
            (None, None) => {
                return Err(bad_request(
                    "SPAWN needs a `script` path or a `command` argv",
                ))
            }
            (Some(script), None) if script.is_empty() => {
                return Err(bad_request("SPAWN field `script` is empty"))
            }
            (None, Some(argv)) if argv.first().is_none_or(|prog| prog.is_empty()) => {
                return Err(bad_request(
                    "SPAWN field `command` must be a non-empty argv whose first element is the program",
                ))
            }
            _ => {}
        }
        if let Some(key) = self
            .env
            .keys()
            .find(|k| k.is_empty() || k.contains(['=', '\0']))
        {
            return Err(bad_request(format!(
                "SPAWN field `env`: {key:?} is not a valid variable name"
            )));
        }
        let nul = |s: &String| s.contains('\0');
        if self.args.iter().any(nul)
            || self.command.iter().flatten().any(nul)
            || self.env.values().any(nul)
        {
            return Err(bad_request(
                "SPAWN `command`, `args` and `env` values must not contain NUL bytes",
            ));
        }
        if let Some(patterns) = &self.permissions.tools {
            check_tool_patterns("SPAWN field `permissions.tools`", patterns)?;
        }
        super::volumes::check_mounts("SPAWN", "volumes", &self.volumes)?;
        if !self.volumes.is_empty() && !self.sandboxed {
            return Err(bad_request(
                "SPAWN field `volumes`: only a sandboxed agent has volumes mounted",
            ));
        }
        if let Some(template) = &self.template {
            validate_name("template", template)?;
            if !self.sandboxed {
                return Err(bad_request(
                    "SPAWN field `template`: only a sandboxed agent starts from a template",
                ));
            }
        }
        self.limits.validate()?;
        check_range("max_restarts", Some(u64::from(self.max_restarts)), 0, 1000)?;
        check_range("restart_window", Some(self.restart_window), 1, 86_400)
    }
}

/// Checks a list of tool patterns against the protocol's bounds; `field`
/// names it in the message.
pub(crate) fn check_tool_patterns(field: &str, patterns: &[String]) -> Result<(), ErrorReply> {
    let bad = |p: &String| p.is_empty() || p.len() > MAX_TOOL_PATTERN || p.contains('\0');
    if patterns.len() > MAX_TOOL_PATTERNS || patterns.iter().any(bad) {
        return Err(bad_request(format!(
            "{field}: at most {MAX_TOOL_PATTERNS} patterns of 1 to {MAX_TOOL_PATTERN} bytes, like \
             \"everything.*\""
        )));
    }
    Ok(())
}

/// Which isolation is in force for an agent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Isolation {
    /// Whether the agent runs in a sandbox at all.
    pub sandboxed: bool,
    /// The namespaces it has of its own (`pid`, `net`, `mnt`, `uts`, `ipc`, `user`).
    pub namespaces: Vec<String>,
    /// The cgroup version enforcing its limits, or `null` for none.
    pub cgroup: Option<CgroupVersion>,
    /// What was asked for but could not be applied, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded_reason: Option<String>,
}

/// The reply to SPAWN.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SpawnReply {
    /// Always `true`; failures are [`ErrorReply`]s.
    pub success: bool,
    /// The agent's id, stable across restarts.
    pub id: u32,
    /// The agent's name.
    pub name: String,
    /// The pid of the agent's top process as the caller sees it: the host
    /// pid for an operator; `null` for an agent, which cannot see its
    /// children's processes.
    pub pid: Option<u32>,
    /// Its state right after the spawn.
    pub status: AgentState,
    /// What isolation is in force.
    pub isolation: Isolation,
    /// What the caller should know although the agent started, as
    /// sentences (an interpreter that cannot import the SDK, …); absent
    /// when there is nothing to say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_patterns_are_bounded_in_number_and_size() {
        let with = |patterns: serde_json::Value| {
            let body = serde_json::json!({"name": "a", "command": ["x"],
                                          "permissions": {"tools": patterns}});
            SpawnRequest::parse(body.to_string().as_bytes())
        };
        assert!(with(serde_json::json!(["everything.*"])).is_ok());
        let many: Vec<String> = (0..=MAX_TOOL_PATTERNS).map(|i| format!("s.t{i}")).collect();
        for bad in [
            serde_json::json!(many),
            serde_json::json!(["x".repeat(MAX_TOOL_PATTERN + 1)]),
            serde_json::json!([""]),
            serde_json::json!(["a\u{0}b"]),
        ] {
            let err = with(bad).unwrap_err();
            assert!(err.error.contains("permissions.tools"), "{}", err.error);
        }
    }

    #[test]
    fn defaults_follow_the_protocol() {
        let request = SpawnRequest::parse(br#"{"name":"w","command":["/bin/true"]}"#).unwrap();
        assert!(request.sandboxed);
        assert!(request.network.is_none());
        assert_eq!(request.restart_policy, RestartPolicy::Never);
        assert_eq!(request.max_restarts, 5);
        assert_eq!(request.restart_window, 300);
        assert_eq!(
            request.permissions.or(Permissions::default()),
            Permissions::default()
        );
        assert_eq!(request.permissions, PermissionsRequest::default());
    }

    #[test]
    fn restart_policy_uses_kebab_case() {
        let request = SpawnRequest::parse(
            br#"{"name":"w","command":["/bin/true"],"restart_policy":"on-failure"}"#,
        )
        .unwrap();
        assert_eq!(request.restart_policy, RestartPolicy::OnFailure);
    }

    #[test]
    fn absurd_limits_are_refused_with_the_allowed_range() {
        let err =
            SpawnRequest::parse(br#"{"name":"w","command":["/bin/true"],"limits":{"max_pids":0}}"#)
                .unwrap_err();
        assert_eq!(err.code, crate::error::ErrorCode::LimitExceeded);
        assert!(err.error.contains("1..=4194304"), "{}", err.error);
        let err =
            SpawnRequest::parse(br#"{"name":"w","command":["/bin/true"],"limits":{"memory":-1}}"#)
                .unwrap_err();
        assert!(err.error.contains("limits.memory"), "{}", err.error);
    }

    #[test]
    fn script_or_command_is_required_and_exclusive() {
        assert!(SpawnRequest::parse(br#"{"name":"w"}"#).is_err());
        assert!(SpawnRequest::parse(br#"{"name":"w","script":"a.py","command":["x"]}"#).is_err());
        assert!(SpawnRequest::parse(br#"{"name":"w","command":[]}"#).is_err());
    }

    #[test]
    fn unknown_fields_are_refused_naming_them_at_any_depth() {
        for (json, named) in [
            (
                r#"{"name":"w","command":["/bin/true"],"colour":"blue"}"#,
                "`colour`",
            ),
            (
                r#"{"name":"w","command":["/bin/true"],"restart_polcy":"always"}"#,
                "`restart_polcy`",
            ),
            (
                r#"{"name":"w","command":["/bin/true"],"permissions":{"thnk":false}}"#,
                "`thnk`",
            ),
            (
                r#"{"name":"w","command":["/bin/true"],"limits":{"memroy":1}}"#,
                "`memroy`",
            ),
        ] {
            let err = SpawnRequest::parse(json.as_bytes()).unwrap_err();
            assert_eq!(err.code, crate::error::ErrorCode::BadRequest, "{json}");
            assert!(err.error.contains(named), "{json}: {}", err.error);
        }
    }
}
