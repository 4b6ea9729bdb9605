//! `agentos spawn`: start an agent.

use agentos_proto::payload::{Limits, Network, RestartPolicy, SpawnReply, SpawnRequest};
use agentos_proto::{Client, Opcode};

use crate::error::CliError;
use crate::failure::usage;
use crate::format::print_json;
use crate::input::{parse_size, protocol_word};
use crate::policy::PolicyArgs;
use crate::volumes::VolumeArgs;

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
    /// Start from this template: its environment first on PATH, and its
    /// python runs the script (agentos template ls lists them)
    #[arg(long, value_name = "NAME")]
    template: Option<String>,
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
    #[command(flatten)]
    pub volumes: VolumeArgs,
    /// Run without namespaces or cgroup (operators only; no volumes, no
    /// template)
    #[arg(long, conflicts_with_all = ["volumes", "template"])]
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
    request.template = args.template;
    request.cwd = args.cwd;
    if args.network {
        request.network = Some(Network::Host(true));
    }
    if let Some(policy) = args.policy.network() {
        request.network = Some(policy);
    }
    request.sandboxed = !args.no_sandbox;
    request.volumes = args.volumes.mounts();
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        spawn: SpawnArgs,
    }

    fn parsed(args: &[&str]) -> Result<SpawnArgs, clap::Error> {
        Line::try_parse_from(std::iter::once("spawn").chain(args.iter().copied()))
            .map(|line| line.spawn)
    }

    #[test]
    fn volumes_go_before_the_program_and_only_into_a_sandbox() {
        let spawn = parsed(&["--volume", "data:/data:ro", "w", "--", "ls", "--volume"])
            .expect("a valid command line");
        assert_eq!(spawn.program, ["ls", "--volume"]);
        let mounts = spawn.volumes.mounts();
        assert_eq!(
            (mounts[0].name.as_str(), mounts[0].path.as_str()),
            ("data", "/data")
        );
        assert!(mounts[0].read_only);
        let unsandboxed = parsed(&["--no-sandbox", "--volume", "data:/data", "w", "ls"]);
        assert!(unsandboxed.is_err());
    }

    #[test]
    fn restart_takes_the_protocols_words() {
        let restart = protocol_word::<RestartPolicy>;
        assert_eq!(restart("on-failure").unwrap(), RestartPolicy::OnFailure);
        assert_eq!(restart("always").unwrap(), RestartPolicy::Always);
        let refused = restart("sometimes").unwrap_err().to_string();
        assert!(refused.contains("`on-failure`"), "{refused}");
    }
}
