//! `agentos spawn`: start an agent.

use agentos_proto::payload::{Limits, Network, RestartPolicy, SpawnReply, SpawnRequest};
use agentos_proto::{Client, Opcode};

use crate::error::CliError;
use crate::failure::usage;
use crate::format::print_json;
use crate::input::protocol_word;
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
    #[arg(long, value_name = "POLICY", value_parser = protocol_word::<RestartPolicy>)]
    restart: Option<RestartPolicy>,
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

pub fn spawn(client: &mut Client, args: SpawnArgs, json: bool) -> Result<(), CliError> {
    let mut request = SpawnRequest::named(args.name);
    let (first, rest) = args
        .program
        .split_first()
        .ok_or_else(|| usage("give a script or a program"))?;
    if first.ends_with(".py") {
        request.script = Some(path_text(std::path::absolute(first)?)?);
        request.args = rest.to_vec();
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
    request.limits = limits;
    request.restart_policy = args.restart.unwrap_or_default();
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
    request.sandboxed = !args.no_sandbox;
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
    use super::*;

    #[test]
    fn restart_takes_the_protocols_words() {
        let restart = protocol_word::<RestartPolicy>;
        assert_eq!(restart("on-failure").unwrap(), RestartPolicy::OnFailure);
        assert_eq!(restart("always").unwrap(), RestartPolicy::Always);
        let refused = restart("sometimes").unwrap_err().to_string();
        assert!(refused.contains("`on-failure`"), "{refused}");
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
