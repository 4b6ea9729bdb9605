//! `[[agents.boot]]`: agents the kernel starts with itself (and again on
//! SIGHUP when their entries change). Each entry is a SPAWN request in TOML.
//!
//! ```toml
//! [[agents.boot]]
//! name = "watcher"
//! command = ["/usr/bin/python3", "/opt/agents/watcher.py"]
//! restart_policy = "always"
//! limits = { memory = 268435456, max_pids = 64 }
//! ```

use std::collections::HashSet;

use agentos_proto::payload::{noting_unknown, SpawnRequest};
use serde::{de::Error as _, Deserialize, Deserializer};

/// Fields an entry may have: SPAWN's.
const FIELDS: &[&str] = &[
    "name",
    "script",
    "python",
    "command",
    "args",
    "env",
    "cwd",
    "sandboxed",
    "network",
    "limits",
    "restart_policy",
    "max_restarts",
    "restart_window",
    "permissions",
];
/// Fields of an entry's `limits`.
const LIMIT_FIELDS: &[&str] = &["memory", "cpu_quota", "cpu_period", "max_pids"];
/// Fields of an entry's `permissions`.
const PERMISSION_FIELDS: &[&str] = &[
    "think",
    "exec",
    "spawn",
    "task",
    "read",
    "write",
    "http",
    "ipc",
    "llm_tokens",
    "tools",
];

/// Reads the `boot` array: each entry a SPAWN request that follows the
/// protocol's rules, with no field SPAWN does not know (a misspelt
/// `restart_policy` must not pass as a default) and a name of its own.
/// Errors name the entry.
pub fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Vec<SpawnRequest>, D::Error> {
    let tables = Vec::<toml::Table>::deserialize(input)?;
    let mut names = HashSet::new();
    let mut agents = Vec::with_capacity(tables.len());
    for (index, table) in tables.into_iter().enumerate() {
        let entry = entry_name(index, &table);
        check_fields(&table, FIELDS, "")
            .and_then(|()| nested_fields(&table, "limits", LIMIT_FIELDS))
            .and_then(|()| nested_fields(&table, "permissions", PERMISSION_FIELDS))
            .map_err(|reason| D::Error::custom(format!("{entry}: {reason}")))?;
        let mut unknown = None;
        let request: SpawnRequest = noting_unknown(toml::Value::Table(table), &mut unknown)
            .map_err(|err| D::Error::custom(format!("{entry}: {err}")))?;
        if let Some(field) = unknown {
            return Err(D::Error::custom(format!(
                "{entry}: unknown field `{field}`"
            )));
        }
        request
            .validate()
            .map_err(|err| D::Error::custom(format!("{entry}: {}", err.error)))?;
        if !names.insert(request.name.clone()) {
            return Err(D::Error::custom(format!(
                "{entry}: another boot agent has this name"
            )));
        }
        agents.push(request);
    }
    Ok(agents)
}

/// How errors name entry `index`: by position, and by name when it has one.
fn entry_name(index: usize, table: &toml::Table) -> String {
    match table.get("name").and_then(toml::Value::as_str) {
        Some(name) => format!("agents.boot[{index}] ({name:?})"),
        None => format!("agents.boot[{index}]"),
    }
}

/// A field a boot entry (or its `limits` or `permissions`) does not have.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown field `{field}`, expected one of {}", .known.join(", "))]
struct UnknownField {
    /// The field, with the table it is in (`limits.memroy`).
    field: String,
    /// The fields that table has.
    known: &'static [&'static str],
}

/// Checks the fields of the table under `key`, if there is one.
fn nested_fields(
    table: &toml::Table,
    key: &str,
    known: &'static [&'static str],
) -> Result<(), UnknownField> {
    match table.get(key) {
        Some(toml::Value::Table(nested)) => check_fields(nested, known, &format!("{key}.")),
        _ => Ok(()),
    }
}

/// Checks that `table` has only `known` fields; `prefix` names the table.
fn check_fields(
    table: &toml::Table,
    known: &'static [&'static str],
    prefix: &str,
) -> Result<(), UnknownField> {
    match table.keys().find(|key| !known.contains(&key.as_str())) {
        Some(key) => Err(UnknownField {
            field: format!("{prefix}{key}"),
            known,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_proto::payload::{Limits, PermissionsRequest};

    #[derive(Debug, Deserialize)]
    struct Holder {
        #[serde(deserialize_with = "deserialize")]
        boot: Vec<SpawnRequest>,
    }

    fn parse(text: &str) -> Result<Vec<SpawnRequest>, toml::de::Error> {
        toml::from_str::<Holder>(text).map(|h| h.boot)
    }

    /// The field lists are SPAWN's own: a request with every field set
    /// serializes to exactly these keys.
    #[test]
    fn field_lists_match_spawn() {
        let full = SpawnRequest {
            network: Some(agentos_proto::payload::Network::Host(false)),
            script: Some("/a.py".into()),
            python: Some("/usr/bin/python3".into()),
            cwd: Some("/".into()),
            limits: Limits {
                memory: Some(1 << 20),
                cpu_quota: Some(1000),
                cpu_period: Some(1000),
                max_pids: Some(1),
            },
            permissions: PermissionsRequest {
                think: Some(true),
                exec: Some(true),
                spawn: Some(true),
                task: Some(true),
                read: Some(true),
                write: Some(true),
                http: Some(true),
                ipc: Some(true),
                llm_tokens: Some(1),
                tools: Some(vec![]),
            },
            // A request leaves defaults out when serialised: none of these is one.
            args: vec!["-v".into()],
            env: [("A".to_owned(), "1".to_owned())].into(),
            sandboxed: false,
            restart_policy: agentos_proto::payload::RestartPolicy::Always,
            max_restarts: 1,
            restart_window: 1,
            ..SpawnRequest::parse(br#"{"name":"a","command":["/bin/true"]}"#).unwrap()
        };
        let value = serde_json::to_value(&full).unwrap();
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let sorted = |list: &[&str]| {
            let mut k: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            k.sort();
            k
        };
        assert_eq!(keys(&value), sorted(FIELDS));
        assert_eq!(keys(&value["limits"]), sorted(LIMIT_FIELDS));
        assert_eq!(keys(&value["permissions"]), sorted(PERMISSION_FIELDS));
    }

    #[test]
    fn entries_are_spawn_requests() {
        let boot = parse(
            r#"
            [[boot]]
            name = "a"
            command = ["/bin/sleep", "1000"]
            restart_policy = "always"
            limits = { memory = 268435456 }
            [[boot]]
            name = "b"
            script = "/opt/b.py"
            env = { KEY = "value" }
            "#,
        )
        .unwrap();
        assert_eq!(boot.len(), 2);
        assert_eq!(boot[0].limits.memory, Some(268435456));
        assert_eq!(boot[1].env["KEY"], "value");
    }

    #[test]
    fn a_bad_entry_is_named() {
        let cases = [
            (
                "name = \"a\"\ncommand = [\"/x\"]\nrestart_polcy = \"always\"",
                "restart_polcy",
            ),
            (
                "name = \"a\"\ncommand = [\"/x\"]\nlimits = { memroy = 1 }",
                "limits.memroy",
            ),
            (
                "name = \"a\"\ncommand = [\"/x\"]\npermissions = { root = true }",
                "permissions.root",
            ),
            (
                "name = \"a\"\ncommand = [\"/x\"]\nnetwork = { allow = [], alow = [] }",
                "network.alow",
            ),
            ("name = \"a\"", "`script` path or a `command`"),
            ("name = \"a b\"\ncommand = [\"/x\"]", "name"),
            (
                "name = \"a\"\ncommand = [\"/x\"]\nlimits = { memory = 1 }",
                "memory",
            ),
            (
                "name = \"a\"\ncommand = [\"/x\"]\nrestart_policy = \"sometimes\"",
                "sometimes",
            ),
        ];
        for (entry, expected) in cases {
            let err = parse(&format!("[[boot]]\n{entry}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("agents.boot[0]"), "{entry}: {err}");
            assert!(err.contains(expected), "{entry}: {err}");
        }
        let err = parse(
            "[[boot]]\nname = \"a\"\ncommand = [\"/x\"]\n[[boot]]\nname = \"a\"\ncommand = [\"/y\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("agents.boot[1] (\"a\")"), "{err}");
        assert!(err.contains("another boot agent"), "{err}");
    }
}
