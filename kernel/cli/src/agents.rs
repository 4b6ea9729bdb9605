//! The agent commands: `ps`, `inspect`, `spawn`, `kill`, `stop`,
//! `restart`, `rm`. What the kernel knows of an agent comes from LIST;
//! waiting for an agent to end is polling LIST, since KILL answers as soon
//! as the stop has begun.

use std::time::{Duration, Instant};

use agentos_proto::payload::{
    AgentInfo, AgentState, KillReply, KillRequest, Network, PauseRequest, RestartPolicy,
    RestartReply, SpawnReply,
};
use agentos_proto::{Client, Opcode};
use serde::Serialize;

use crate::error::CliError;
use crate::failure::{self, no_such_agent, usage};
use crate::format::{human_size, print_json, print_one_or_all};
use crate::raw::Raw;

/// How often LIST is asked while waiting for an agent.
const POLL: Duration = Duration::from_millis(50);

/// `agentos ps`'s options.
#[derive(Debug, clap::Args)]
pub struct PsArgs {
    /// Show ended agents too (the kernel keeps them for a while)
    #[arg(short, long)]
    all: bool,
    /// Only agents matching KEY=VALUE: state=running (any state word, or
    /// live), name=TEXT (names containing TEXT); repeatable, all must match
    #[arg(long = "filter", value_name = "KEY=VALUE")]
    filters: Vec<String>,
}

/// A `--filter` of `ps`.
#[derive(Debug, PartialEq, Eq)]
enum Filter {
    /// In this state (`live`: any live state).
    State(String),
    /// Named with this text in it.
    Name(String),
}

impl Filter {
    fn parse(text: &str) -> Result<Filter, CliError> {
        match text.split_once('=') {
            Some(("state", state)) => {
                let known = [
                    "live",
                    "starting",
                    "running",
                    "paused",
                    "exited",
                    "killed",
                    "oom_killed",
                    "failed",
                    "restarting",
                ];
                if !known.contains(&state) {
                    return Err(usage(format!(
                        "unknown state {state:?} in --filter: use one of {}",
                        known.join(", ")
                    )));
                }
                Ok(Filter::State(state.to_owned()))
            }
            Some(("name", name)) => Ok(Filter::Name(name.to_owned())),
            _ => Err(usage(format!(
                "--filter takes state=STATE or name=TEXT, not {text:?}"
            ))),
        }
    }

    fn matches(&self, agent: &AgentInfo) -> bool {
        match self {
            Filter::State(state) if state == "live" => agent.state.is_live(),
            Filter::State(state) => agent.state.as_str() == state,
            Filter::Name(text) => agent.name.contains(text.as_str()),
        }
    }
}

pub fn ps(client: &mut Client, args: PsArgs, json: bool) -> Result<(), CliError> {
    let filters = args
        .filters
        .iter()
        .map(|f| Filter::parse(f))
        .collect::<Result<Vec<_>, _>>()?;
    // A state filter names what to show; otherwise only live ones unless -a.
    let by_state = filters.iter().any(|f| matches!(f, Filter::State(_)));
    let agents: Vec<AgentInfo> = client
        .list()?
        .into_iter()
        .filter(|a| args.all || by_state || a.state.is_live())
        .filter(|a| filters.iter().all(|f| f.matches(a)))
        .collect();
    if json {
        return print_json(&agents);
    }
    print!("{}", format_table(&agents));
    if agents.is_empty() && !args.all {
        eprintln!("agentos: no live agents (agentos ps -a shows ended ones too)");
    }
    Ok(())
}

/// The `ps` table: one line per agent under a header.
fn format_table(agents: &[AgentInfo]) -> String {
    let mut out = table_row([
        "ID", "NAME", "PID", "STATE", "RESTARTS", "UPTIME", "MEMORY", "PEAK", "CPU", "EXIT",
    ]);
    for agent in agents {
        out.push_str(&table_row([
            &agent.id.to_string(),
            &agent.name,
            &agent.pid.map_or_else(|| "-".into(), |p| p.to_string()),
            agent.state.as_str(),
            &agent.restarts.to_string(),
            &format!("{:.1}s", agent.uptime_ms as f64 / 1000.0),
            &human_size(agent.memory.current),
            &human_size(agent.memory.peak),
            &format!("{:.2}s", agent.cpu.usage_usec as f64 / 1e6),
            &ending(agent),
        ]));
    }
    out
}

/// How an ended agent ended: its exit code, `sigN`, or `OOM`.
fn ending(agent: &AgentInfo) -> String {
    match (agent.exit_code, agent.signal, agent.oom_killed) {
        (_, _, true) => "OOM".to_owned(),
        (Some(code), _, _) => code.to_string(),
        (None, Some(signal), _) => format!("sig{signal}"),
        (None, None, false) => "-".to_owned(),
    }
}

/// One line of the `ps` table, columns aligned.
fn table_row(cells: [&str; 10]) -> String {
    let [id, name, pid, state, restarts, uptime, memory, peak, cpu, exit] = cells;
    format!(
        "{id:>7}  {name:<20} {pid:>8}  {state:<11} {restarts:>8} {uptime:>8} \
         {memory:>8} {peak:>8} {cpu:>8} {exit:>6}\n"
    )
}

/// The agent named on the command line (a number is an id): the live one
/// of that name, else the latest that ended.
fn find<'a>(agents: &'a [AgentInfo], agent: &str) -> Option<&'a AgentInfo> {
    let by_id = agent.parse::<u32>().ok();
    agents
        .iter()
        .filter(|a| Some(a.id) == by_id || a.name == agent)
        .max_by_key(|a| (a.state.is_live(), a.id))
}

/// An agent named on the command line as a request's `id` or `name`.
pub fn id_or_name(agent: &str) -> (Option<u32>, Option<String>) {
    match agent.parse::<u32>() {
        Ok(id) => (Some(id), None),
        Err(_) => (None, Some(agent.to_owned())),
    }
}

pub fn inspect(client: &mut Client, names: &[String], json: bool) -> Result<(), CliError> {
    let agents = client.list()?;
    let found = names
        .iter()
        .map(|name| find(&agents, name).ok_or_else(|| no_such_agent(name)))
        .collect::<Result<Vec<_>, _>>()?;
    if json {
        return print_json(&found);
    }
    for (n, agent) in found.iter().enumerate() {
        if n > 0 {
            println!();
        }
        print!("{}", describe(agent));
    }
    Ok(())
}

/// `inspect`'s text for one agent.
fn describe(agent: &AgentInfo) -> String {
    let pid = agent.pid.map_or_else(String::new, |p| format!(", pid {p}"));
    let limits = &agent.limits;
    let cpu = match (limits.cpu_quota, limits.cpu_period) {
        (Some(quota), Some(period)) if period > 0 => {
            format!("{:.2} CPUs", quota as f64 / period as f64)
        }
        _ => "no cpu limit".to_owned(),
    };
    let permissions = &agent.permissions;
    let allowed: Vec<&str> = [
        ("think", permissions.think),
        ("exec", permissions.exec),
        ("spawn", permissions.spawn),
        ("task", permissions.task),
    ]
    .iter()
    .filter(|(_, yes)| *yes)
    .map(|(name, _)| *name)
    .collect();
    let tokens = match permissions.llm_tokens {
        0 => "unlimited".to_owned(),
        n => n.to_string(),
    };
    let isolation = &agent.isolation;
    let mut lines = vec![
        format!(
            "agent {} ({}): {}{pid}, up {:.1}s",
            agent.id,
            agent.name,
            agent.state.as_str(),
            agent.uptime_ms as f64 / 1e3
        ),
        format!("command:     {}", shell_words(&agent.command)),
        format!(
            "cwd:         {}",
            agent.cwd.as_deref().unwrap_or("(default)")
        ),
        format!(
            "limits:      memory {}, {cpu}, processes {}",
            limits.memory.map_or_else(|| "unlimited".into(), human_size),
            limits
                .max_pids
                .map_or_else(|| "unlimited".into(), |n| n.to_string())
        ),
        format!(
            "permissions: {}; tools {}; LLM tokens {tokens}",
            if allowed.is_empty() {
                "none".to_owned()
            } else {
                allowed.join(", ")
            },
            permissions.tools.join(" ")
        ),
        format!("network:     {}", network_line(agent)),
        format!(
            "isolation:   {}",
            if isolation.sandboxed {
                format!(
                    "namespaces {}, cgroup {}",
                    isolation.namespaces.join(" "),
                    isolation.cgroup.map_or("none", |v| v.as_str())
                )
            } else if agent.sandboxed {
                "none in force (asked for a sandbox)".to_owned()
            } else {
                "none (not sandboxed)".to_owned()
            }
        ),
        format!(
            "restarts:    {} so far; policy {}, at most {} in {} s",
            agent.restarts,
            restart_policy_word(agent.restart_policy),
            agent.max_restarts,
            agent.restart_window
        ),
    ];
    if let Some(reason) = &isolation.degraded_reason {
        lines.push(format!("degraded:    {reason}"));
    }
    if !agent.state.is_live() {
        lines.push(format!("ended:       {}", ending(agent)));
    }
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// A restart policy's protocol word, as the protocol's type writes it.
fn restart_policy_word(policy: RestartPolicy) -> String {
    serde_json::to_string(&policy)
        .map_or_else(|_| "?".to_owned(), |word| word.trim_matches('"').to_owned())
}

/// An argv as a shell would take it back: words with spaces or quotes
/// in single quotes.
fn shell_words(argv: &[String]) -> String {
    let quote = |word: &String| {
        let plain = !word.is_empty()
            && word
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-=:,+@%".contains(c));
        if plain {
            word.clone()
        } else {
            format!("'{}'", word.replace('\'', r"'\''"))
        }
    };
    argv.iter().map(quote).collect::<Vec<_>>().join(" ")
}

/// `kill`, `stop`: what to stop and how.
#[derive(Debug, clap::Args)]
pub struct StopArgs {
    /// Agent names, or ids
    #[arg(required = true)]
    agents: Vec<String>,
    /// Milliseconds between SIGTERM and SIGKILL [default: 5000]
    #[arg(long, value_name = "MS")]
    grace_ms: Option<u64>,
}

/// `pause` and `resume`: agents, or one of your sessions.
#[derive(Debug, clap::Args)]
pub struct FreezeArgs {
    /// Agent names, or ids
    #[arg(required_unless_present = "session", conflicts_with = "session")]
    agents: Vec<String>,
    /// One of your EXEC sessions instead of agents: its interpreter
    #[arg(long, value_name = "SESSION")]
    pub session: Option<String>,
}

/// `pause`'s options: `resume`'s, and hibernating a session.
#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    #[command(flatten)]
    pub freeze: FreezeArgs,
    /// With --session: save its globals and end its interpreter, freeing
    /// its memory, rather than freeze it (its next run, or resume, brings
    /// it back with its globals)
    // `requires` alone lets `pause AGENT --hibernate` through: clap waives
    // the need for --session once an agent, which conflicts with it, is
    // given.
    #[arg(long, requires = "session", conflicts_with = "agents")]
    pub hibernate: bool,
}

/// `pause` (PAUSE) and `resume` (RESUME): each agent in turn; PAUSE
/// answers once the agent stands still.
pub fn freeze(
    client: &mut Client,
    args: FreezeArgs,
    pause: bool,
    json: bool,
) -> Result<(), CliError> {
    let mut replies = Vec::new();
    for agent in &args.agents {
        let (id, name) = id_or_name(agent);
        let request = PauseRequest {
            id,
            name,
            ..PauseRequest::default()
        };
        let reply = if pause {
            client.pause(&request)
        } else {
            client.resume(&request)
        }
        .map_err(|err| failure::about_agent(agent, err))?;
        if !json {
            println!(
                "agent {} ({}) {}",
                reply.id,
                reply.name,
                reply.state.as_str()
            );
        }
        replies.push(reply);
    }
    if json {
        print_one_or_all(&replies)?;
    }
    Ok(())
}

/// `stop`'s and `kill`'s JSON for one agent: KILL's reply, and once the
/// agent has ended (when the command waits for that) the state it ended
/// in, `null` if it is gone.
#[derive(Debug, Serialize)]
struct Stopped {
    #[serde(flatten)]
    reply: KillReply,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<Option<AgentState>>,
}

/// Stops each agent; with `wait`, returns once each has ended (within
/// `wait_for`).
pub fn stop(
    client: &mut Client,
    args: StopArgs,
    wait: bool,
    wait_for: Duration,
    json: bool,
) -> Result<(), CliError> {
    let mut replies = Vec::new();
    for agent in &args.agents {
        let (id, name) = id_or_name(agent);
        let request = KillRequest {
            id,
            name,
            grace_ms: args.grace_ms,
            ..KillRequest::default()
        };
        let reply = client
            .kill(&request)
            .map_err(|err| failure::about_agent(agent, err))?;
        let id = reply.id.unwrap_or_default();
        let mut shown = Stopped { reply, state: None };
        if wait {
            let ended =
                wait_until(client, id, wait_for, |a| !a.state.is_live()).map_err(|err| {
                    CliError::StillStopping {
                        agent: agent.clone(),
                        cause: Box::new(err),
                    }
                })?;
            shown.state = Some(ended.as_ref().map(|a| a.state));
            if !json {
                let state = ended.map_or("gone", |a| a.state.as_str());
                println!("agent {id} ({agent}) stopped: {state}");
            }
        } else if !json {
            println!("agent {id} ({agent}) is being stopped");
        }
        replies.push(shown);
    }
    if json {
        print_one_or_all(&replies)?;
    }
    Ok(())
}

/// Polls LIST until agent `id` satisfies `done` (or is gone: `None`).
fn wait_until(
    client: &mut Client,
    id: u32,
    within: Duration,
    done: impl Fn(&AgentInfo) -> bool,
) -> Result<Option<AgentInfo>, CliError> {
    let deadline = Instant::now() + within;
    loop {
        let agent = client.list()?.into_iter().find(|a| a.id == id);
        match agent {
            None => return Ok(None),
            Some(agent) if done(&agent) => return Ok(Some(agent)),
            Some(agent) if Instant::now() >= deadline => {
                return Err(CliError::StillIn {
                    state: agent.state.as_str(),
                    waited: within,
                })
            }
            Some(_) => std::thread::sleep(POLL),
        }
    }
}

/// `restart`: stops the agent and waits until its next incarnation runs.
pub fn restart(
    client: &mut Client,
    args: StopArgs,
    wait_for: Duration,
    json: bool,
) -> Result<(), CliError> {
    let mut replies = Vec::new();
    for agent in &args.agents {
        let before = client.list()?;
        let restarts = find(&before, agent)
            .ok_or_else(|| no_such_agent(agent))?
            .restarts;
        let (id, name) = id_or_name(agent);
        let request = KillRequest {
            id,
            name,
            grace_ms: args.grace_ms,
            restart: true,
            ..KillRequest::default()
        };
        let raw: Raw = client
            .call_json(Opcode::KILL, &serde_json::to_vec(&request)?)
            .map_err(|err| failure::about_agent(agent, err))?;
        let id = raw.decode::<RestartReply>()?.id;
        let after = wait_until(client, id, wait_for, |a| {
            a.restarts > restarts && !matches!(a.state, AgentState::Starting)
        })?
        .ok_or_else(|| CliError::RemovedWhileRestarting(agent.clone()))?;
        if !json {
            println!("agent {id} ({agent}) restarted: {}", after.state.as_str());
        }
        if after.state != AgentState::Running && !after.state.is_live() {
            return Err(CliError::EndedAfterRestart {
                agent: agent.clone(),
                state: after.state.as_str(),
                ending: ending(&after),
            });
        }
        replies.push(raw);
    }
    if json {
        print_one_or_all(&replies)?;
    }
    Ok(())
}

/// `rm`'s options.
#[derive(Debug, clap::Args)]
pub struct RmArgs {
    /// Agent names, or ids: every ended record of a name goes
    #[arg(required = true)]
    agents: Vec<String>,
    /// Stop a live agent first (with the grace), instead of refusing
    #[arg(short, long)]
    force: bool,
    /// Milliseconds between SIGTERM and SIGKILL, with -f [default: 5000]
    #[arg(long, value_name = "MS")]
    grace_ms: Option<u64>,
}

pub fn rm(
    client: &mut Client,
    args: RmArgs,
    wait_for: Duration,
    json: bool,
) -> Result<(), CliError> {
    let mut removed = Vec::new();
    for agent in &args.agents {
        let agents = client.list()?;
        let by_id = agent.parse::<u32>().ok();
        let records: Vec<&AgentInfo> = agents
            .iter()
            .filter(|a| Some(a.id) == by_id || a.name == *agent)
            .collect();
        if records.is_empty() {
            return Err(no_such_agent(agent));
        }
        // Nothing of a name goes while one of its agents still runs,
        // unless -f.
        if let Some(live) = records.iter().find(|a| a.state.is_live() && !args.force) {
            return Err(CliError::StillLive {
                agent: agent.clone(),
                id: live.id,
                state: live.state.as_str(),
            });
        }
        for record in records {
            if record.state.is_live() {
                let stop = KillRequest {
                    id: Some(record.id),
                    grace_ms: args.grace_ms,
                    ..KillRequest::default()
                };
                client.kill(&stop)?;
                wait_until(client, record.id, wait_for, |a| !a.state.is_live())?;
            }
            let request = KillRequest {
                id: Some(record.id),
                remove: true,
                ..KillRequest::default()
            };
            let reply: Raw = client
                .call_json(Opcode::KILL, &serde_json::to_vec(&request)?)
                .map_err(|err| failure::about_agent(agent, err))?;
            if !json {
                println!("removed agent {} ({})", record.id, record.name);
            }
            removed.push(reply);
        }
    }
    if json {
        print_json(&removed)?;
    }
    Ok(())
}

/// Prints a SPAWN reply for a person.
pub fn print_spawned(reply: &SpawnReply) {
    println!(
        "agent {} ({}) {} as pid {}",
        reply.id,
        reply.name,
        reply.status.as_str(),
        reply.pid.map_or_else(|| "-".into(), |p| p.to_string())
    );
    let isolation = &reply.isolation;
    println!(
        "isolation: {}namespaces [{}], cgroup {}",
        if isolation.sandboxed {
            ""
        } else {
            "not sandboxed, "
        },
        isolation.namespaces.join(" "),
        isolation.cgroup.map_or("none", |v| v.as_str())
    );
    if let Some(reason) = &isolation.degraded_reason {
        println!("degraded: {reason}");
    }
}

/// An agent's network in force, and its connections through the proxy.
fn network_line(agent: &AgentInfo) -> String {
    match (&agent.network, agent.connections) {
        (Network::Host(true), _) => "the host's".to_owned(),
        (Network::Host(false), _) => "loopback only".to_owned(),
        (Network::Policy(policy), connections) => {
            let mut line = format!("allow {}", policy.allow.join(" "));
            if !policy.deny.is_empty() {
                line.push_str(&format!("; deny {}", policy.deny.join(" ")));
            }
            if let Some(totals) = connections {
                line.push_str(&format!(
                    " ({} allowed, {} refused; `agentos net {}` for the record)",
                    totals.allowed, totals.refused, agent.name
                ));
            }
            line
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_read_state_and_name_and_refuse_anything_else() {
        assert_eq!(
            Filter::parse("state=running").unwrap(),
            Filter::State("running".into())
        );
        assert_eq!(
            Filter::parse("name=work").unwrap(),
            Filter::Name("work".into())
        );
        for bad in ["state=sleeping", "colour=red", "state"] {
            let err = Filter::parse(bad).unwrap_err();
            assert!(matches!(err, CliError::Usage(_)), "{bad}: {err}");
        }
    }

    fn pause_line(args: &[&str]) -> Result<PauseArgs, clap::Error> {
        use clap::Parser;
        #[derive(Parser)]
        struct Line {
            #[command(flatten)]
            pause: PauseArgs,
        }
        Line::try_parse_from(std::iter::once("pause").chain(args.iter().copied()))
            .map(|line| line.pause)
    }

    #[test]
    fn pause_takes_agents_or_a_session_and_hibernates_only_a_session() {
        let agents = pause_line(&["w1", "7"]).expect("parsed");
        assert_eq!(agents.freeze.agents, ["w1", "7"]);
        assert!(agents.freeze.session.is_none() && !agents.hibernate);
        let session = pause_line(&["--session", "s1", "--hibernate"]).expect("parsed");
        assert_eq!(session.freeze.session.as_deref(), Some("s1"));
        assert!(session.freeze.agents.is_empty() && session.hibernate);
        for refused in [
            &[][..],
            &["w1", "--session", "s1"][..],
            &["w1", "--hibernate"][..],
            &["--hibernate"][..],
        ] {
            assert!(pause_line(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn argv_is_quoted_as_a_shell_would_read_it() {
        let argv = ["/usr/bin/python3", "/a b/w.py", "it's", "--x=1"].map(String::from);
        assert_eq!(
            shell_words(&argv),
            r"/usr/bin/python3 '/a b/w.py' 'it'\''s' --x=1"
        );
    }
}
