//! `agentos spawn`: start an agent.

use std::collections::BTreeMap;

use agentos_proto::payload::{Limits, Network, SpawnReply};
use agentos_proto::{Client, Opcode};
use serde::Serialize;

use crate::error::CliError;
use crate::failure::usage;
use crate::format::print_json;
use crate::policy::PolicyArgs;

#[derive(Debug, clap::Args)]
pub struct SpawnArgs {
    /// Agent name ([A-Za-z0-9_.-], up to 64)
    name: String,
    /// A Python script (*.py) and its arguments, or a program and its
    /// arguments; options after it are its own
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    program: Vec<String>,
    /// Interpreter for the script
    #[arg(long, value_name = "PATH")]
    python: Option<String>,
    /// Memory limit: bytes, or with K, M or G
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory: Option<u64>,
    /// CPU share, in CPUs (0.1 = 10% of one CPU)
    #[arg(long, value_name = "CPUS")]
    cpus: Option<f64>,
    /// Process limit
    #[arg(long, value_name = "N")]
    max_pids: Option<u64>,
    /// never, on-failure or always
    #[arg(long, value_name = "POLICY")]
    restart: Option<String>,
    /// Environment variable for the agent (repeatable)
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Working directory inside the sandbox
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Share the host network instead of loopback only
    #[arg(long, conflicts_with = "allow")]
    network: bool,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Run without namespaces or cgroup (operators only)
    #[arg(long)]
    no_sandbox: bool,
}

/// The SPAWN request `spawn` sends: only what the command line gave.
///
/// Not the protocol's `SpawnRequest`, which holds a restart policy it has
/// read: `--restart` passes the word on for the kernel to judge. The
/// kernel's refusal of a word it does not know names the column it is at,
/// so that message depends on the order the fields are written in: the
/// order below. Its parts are the protocol's own.
#[derive(Debug, Default, Serialize)]
struct SpawnCall {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    script: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<Limits>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restart_policy: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    env: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    python: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<Network>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandboxed: Option<bool>,
}

pub fn spawn(client: &mut Client, args: SpawnArgs, json: bool) -> Result<(), CliError> {
    let mut request = SpawnCall {
        name: args.name,
        ..SpawnCall::default()
    };
    let (first, rest) = args
        .program
        .split_first()
        .ok_or_else(|| usage("give a script or a program"))?;
    if first.ends_with(".py") {
        request.script = Some(path_text(std::path::absolute(first)?)?);
        request.args = Some(rest.to_vec());
    } else {
        request.command = Some(args.program.clone());
    }
    let mut limits = Limits {
        memory: args.memory,
        max_pids: args.max_pids,
        ..Limits::default()
    };
    if let Some(cpus) = args.cpus {
        if !(cpus > 0.0 && cpus.is_finite()) {
            return Err(usage("--cpus must be a positive number"));
        }
        limits.cpu_period = Some(100_000);
        limits.cpu_quota = Some((cpus * 100_000.0).round() as u64);
    }
    request.limits = (limits != Limits::default()).then_some(limits);
    request.restart_policy = args.restart;
    for pair in &args.env {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| usage(format!("--env takes KEY=VALUE, not {pair:?}")))?;
        request.env.insert(key.into(), value.into());
    }
    request.python = args.python;
    request.cwd = args.cwd;
    if args.network {
        request.network = Some(Network::Host(true));
    }
    if let Some(policy) = args.policy.network() {
        request.network = Some(policy);
    }
    if args.no_sandbox {
        request.sandboxed = Some(false);
    }
    let reply: SpawnReply = client.call_json(Opcode::SPAWN, &serde_json::to_vec(&request)?)?;
    if json {
        return print_json(&reply);
    }
    for warning in &reply.warnings {
        eprintln!("warning: {warning}");
    }
    crate::agents::print_spawned(&reply);
    Ok(())
}

/// A path as the request's text; one that is not UTF-8 cannot be sent.
fn path_text(path: std::path::PathBuf) -> Result<String, CliError> {
    path.into_os_string().into_string().map_err(|_| {
        CliError::Json(serde::ser::Error::custom(
            "path contains invalid UTF-8 characters",
        ))
    })
}

/// Why a size on the command line cannot be read.
#[derive(Debug, thiserror::Error)]
enum BadSize {
    /// No number leads it.
    #[error("{0:?} is not a size (try 512M)")]
    NotANumber(String),
    /// Its unit is none of K, M, G.
    #[error("unknown unit in {0:?}: use K, M or G")]
    UnknownUnit(String),
    /// It does not fit in 64 bits.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// `512`, `64K`, `50M`, `2G` to bytes.
fn parse_size(text: &str) -> Result<u64, BadSize> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| BadSize::NotANumber(text.to_owned()))?;
    let unit = unit.to_ascii_uppercase();
    let scale: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return Err(BadSize::UnknownUnit(text.to_owned())),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| BadSize::TooLarge(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use agentos_proto::payload::{RestartPolicy, SpawnRequest};

    use super::*;

    #[test]
    fn the_request_is_written_in_its_fixed_order() {
        let request = SpawnCall {
            name: "w1".into(),
            command: Some(vec!["/bin/sleep".into(), "30".into()]),
            limits: Some(Limits {
                memory: Some(64 << 20),
                ..Limits::default()
            }),
            restart_policy: Some("sometimes".into()),
            sandboxed: Some(false),
            ..SpawnCall::default()
        };
        assert_eq!(
            serde_json::to_string(&request).unwrap(),
            r#"{"name":"w1","command":["/bin/sleep","30"],"limits":{"memory":67108864},"restart_policy":"sometimes","sandboxed":false}"#
        );
    }

    #[test]
    fn the_request_is_the_one_spawn_reads() {
        let mut env = BTreeMap::new();
        env.insert("A".to_owned(), "1".to_owned());
        let request = SpawnCall {
            name: "w1".into(),
            script: Some("/srv/agent.py".into()),
            args: Some(vec!["--x".into()]),
            limits: Some(Limits {
                cpu_quota: Some(50_000),
                cpu_period: Some(100_000),
                ..Limits::default()
            }),
            restart_policy: Some("on-failure".into()),
            env: env.clone(),
            cwd: Some("/tmp".into()),
            network: Some(Network::Host(true)),
            sandboxed: Some(false),
            ..SpawnCall::default()
        };
        let read = SpawnRequest::parse(&serde_json::to_vec(&request).unwrap()).unwrap();
        assert_eq!(read.script.as_deref(), Some("/srv/agent.py"));
        assert_eq!((read.args, read.env), (vec!["--x".to_owned()], env));
        assert_eq!(read.limits.cpu_quota, Some(50_000));
        assert_eq!(read.restart_policy, RestartPolicy::OnFailure);
        assert_eq!(read.cwd.as_deref(), Some("/tmp"));
        assert!(read.network.is_some_and(|n| n.is_host()) && !read.sandboxed);
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("50MiB").unwrap(), 50 << 20);
        assert!(matches!(parse_size("2X"), Err(BadSize::UnknownUnit(_))));
        assert!(matches!(parse_size("M"), Err(BadSize::NotANumber(_))));
    }
}
