//! The tools for agents: list them, spawn one, kill one, read its log.

use agentos_proto::payload::{
    AgentInfo, KillReply, KillRequest, Limits, ListRequest, LogsReply, LogsRequest, Network,
    SpawnReply, SpawnRequest,
};
use agentos_proto::Opcode;
use rmcp::model::CallToolResult;

use super::arguments::{
    AgentLogsArguments, ArgumentError, KillArguments, ListAgentsArguments, SpawnArguments,
    SpawnLimits,
};
use super::kernel::{KernelLink, Wait};
use super::results::{answer, structured, structured_json, AgentsOutput};
use super::tool_error::ToolError;

/// The CFS period a CPU share is a quota of, as the CLI's `--cpus`.
const CPU_PERIOD_US: u64 = 100_000;

/// `list_agents`: the caller's live agents (ended ones too with `all`).
pub async fn list(
    kernel: &KernelLink,
    arguments: ListAgentsArguments,
) -> Result<CallToolResult, ToolError> {
    let agents: Vec<AgentInfo> = kernel
        .request(Opcode::LIST, &ListRequest {}, Wait::Quick)
        .await?;
    let agents = agents
        .into_iter()
        .filter(|agent| arguments.all || agent.running)
        .collect();
    Ok(structured_json(&AgentsOutput { agents })?)
}

/// `spawn`: a new agent from a script or a command.
pub async fn spawn(
    kernel: &KernelLink,
    arguments: SpawnArguments,
) -> Result<CallToolResult, ToolError> {
    let request = spawn_request(arguments)?;
    answer::<SpawnReply>(kernel, Opcode::SPAWN, &request, Wait::Quick).await
}

/// `kill`: stops the agent named by name or by id.
pub async fn kill(
    kernel: &KernelLink,
    arguments: KillArguments,
) -> Result<CallToolResult, ToolError> {
    let (name, id) = name_or_id(arguments.name, arguments.id)?;
    let request = KillRequest {
        name,
        id,
        ..KillRequest::default()
    };
    answer::<KillReply>(kernel, Opcode::KILL, &request, Wait::Quick).await
}

/// `agent_logs`: the last lines of an agent's log.
pub async fn logs(
    kernel: &KernelLink,
    arguments: AgentLogsArguments,
) -> Result<CallToolResult, ToolError> {
    let (name, id) = name_or_id(arguments.name, arguments.id)?;
    let request = LogsRequest {
        name,
        id,
        lines: arguments.lines,
        ..LogsRequest::default()
    };
    let reply: LogsReply = kernel.request(Opcode::LOGS, &request, Wait::Quick).await?;
    let text = reply.text.clone();
    Ok(structured(&reply, text)?)
}

/// Exactly one of an agent's name and its id, as a request names it.
fn name_or_id(
    name: Option<String>,
    id: Option<u32>,
) -> Result<(Option<String>, Option<u32>), ArgumentError> {
    match (name, id) {
        (Some(name), None) => Ok((Some(name), None)),
        (None, Some(id)) => Ok((None, Some(id))),
        _ => Err(ArgumentError::OneOf("name", "id")),
    }
}

/// The SPAWN request for `arguments`, in the kernel's terms: what the
/// tool sets, the rest left to the kernel's defaults.
fn spawn_request(arguments: SpawnArguments) -> Result<SpawnRequest, ArgumentError> {
    let mut request = SpawnRequest::named(arguments.name);
    match (arguments.script, arguments.command) {
        (Some(script), None) => {
            // The kernel resolves nothing against this server's directory,
            // so a relative script path is made absolute here, as the CLI
            // does.
            let script = std::path::absolute(&script).map_err(ArgumentError::Script)?;
            let script =
                script
                    .into_os_string()
                    .into_string()
                    .map_err(|_| ArgumentError::Refused {
                        argument: "script",
                        why: "must be a UTF-8 path",
                    })?;
            request.script = Some(script);
            request.args = arguments.args;
        }
        (None, Some(command)) => {
            if command.is_empty() {
                return Err(ArgumentError::Refused {
                    argument: "command",
                    why: "give the program to run",
                });
            }
            if !arguments.args.is_empty() {
                return Err(ArgumentError::Refused {
                    argument: "args",
                    why: "goes with script; put a command's arguments in command",
                });
            }
            request.command = Some(command);
        }
        _ => return Err(ArgumentError::OneOf("script", "command")),
    }
    if let Some(limits) = arguments.limits {
        request.limits = kernel_limits(limits)?;
    }
    request.network = arguments
        .network
        .map(|policy| Network::Policy(Box::new(policy)));
    Ok(request)
}

/// A tool's limits as the kernel's: a CPU share becomes a CFS quota per
/// period, as the CLI's `--cpus` does.
fn kernel_limits(limits: SpawnLimits) -> Result<Limits, ArgumentError> {
    let cpu = match limits.cpus {
        Some(cpus) if !(cpus > 0.0 && cpus.is_finite()) => {
            return Err(ArgumentError::Refused {
                argument: "limits.cpus",
                why: "must be a positive number",
            })
        }
        Some(cpus) => Some((CPU_PERIOD_US as f64 * cpus).round() as u64),
        None => None,
    };
    Ok(Limits {
        memory: limits.memory_bytes,
        cpu_quota: cpu,
        cpu_period: cpu.map(|_| CPU_PERIOD_US),
        max_pids: limits.max_pids,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::super::arguments::read;
    use super::*;

    fn spawn(value: Value) -> Result<Value, ArgumentError> {
        let call = spawn_request(read(value.as_object().expect("an object").clone())?)?;
        Ok(serde_json::to_value(call).expect("a request"))
    }

    #[test]
    fn an_agent_is_a_script_or_a_command_and_named_by_name_or_id() {
        let command = spawn(json!({"name": "w", "command": ["/bin/true"]})).unwrap();
        assert_eq!(command, json!({"name": "w", "command": ["/bin/true"]}));
        let neither = spawn(json!({"name": "w"})).unwrap_err().to_string();
        assert_eq!(
            neither,
            "give exactly one of the arguments script and command"
        );
        let args = spawn(json!({"name": "w", "command": ["ls"], "args": ["-l"]}))
            .unwrap_err()
            .to_string();
        assert!(
            args.starts_with("argument args: goes with script"),
            "{args}"
        );
        let cpus = spawn(json!({"name": "w", "command": ["ls"], "limits": {"cpus": 0}}))
            .unwrap_err()
            .to_string();
        assert_eq!(cpus, "argument limits.cpus: must be a positive number");
        let both = name_or_id(Some("w".into()), Some(1))
            .unwrap_err()
            .to_string();
        assert_eq!(both, "give exactly one of the arguments name and id");
        assert_eq!(name_or_id(None, Some(1)).unwrap(), (None, Some(1)));
    }

    #[test]
    fn a_cpu_share_is_a_quota_of_the_period() {
        let half = spawn(json!({"name": "w", "command": ["ls"], "limits": {"cpus": 0.5}}));
        assert_eq!(
            half.unwrap()["limits"],
            json!({"cpu_quota": 50_000, "cpu_period": 100_000})
        );
    }
}
