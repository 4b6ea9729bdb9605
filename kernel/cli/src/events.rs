//! `agentos events [TYPE...] [-n N]`: subscribes, and prints each event
//! as it comes (the kernel's, of the agents this caller may see, and
//! CUSTOM ones), one a line, until interrupted or N have come.

use std::io::Write;
use std::time::Duration;

use agentos_proto::payload::{
    EventInfo, KernelEvent, PollReply, PollRequest, SubscribeReply, SubscribeRequest, CUSTOM,
    MAX_POLL_EVENTS,
};
use agentos_proto::{Client, Opcode};

use crate::error::CliError;

/// How long to wait between two POLLs that found nothing more.
const POLL_EVERY: Duration = Duration::from_millis(200);

/// What `agentos events` with no type subscribes to.
const AGENT_EVENTS: [KernelEvent; 7] = [
    KernelEvent::AgentSpawned,
    KernelEvent::AgentExited,
    KernelEvent::AgentPaused,
    KernelEvent::AgentResumed,
    KernelEvent::AgentRestarting,
    KernelEvent::AgentEscalated,
    KernelEvent::AgentOomKilled,
];

#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// Event types: the kernel's (AGENT_SPAWNED, AGENT_EXITED, TASK_ENDED,
    /// ...), CUSTOM, or a CUSTOM event's own type name (default: every
    /// agent event, TASK_ENDED and CUSTOM)
    types: Vec<String>,
    /// Stop once N events have been printed
    #[arg(short = 'n', long, value_name = "N")]
    count: Option<u64>,
}

pub fn events(client: &mut Client, args: EventsArgs, json: bool) -> Result<(), CliError> {
    let types = if args.types.is_empty() {
        AGENT_EVENTS
            .iter()
            .chain([&KernelEvent::TaskEnded])
            .map(|kind| kind.as_str().to_owned())
            .chain([CUSTOM.to_owned()])
            .collect()
    } else {
        args.types
    };
    let subscribe = SubscribeRequest {
        event_types: Some(types),
        ..SubscribeRequest::default()
    };
    let _: SubscribeReply =
        client.call_json(Opcode::SUBSCRIBE, &serde_json::to_vec(&subscribe)?)?;
    let poll = serde_json::to_vec(&PollRequest {
        max: Some(MAX_POLL_EVENTS as u64),
    })?;
    let mut stdout = std::io::stdout().lock();
    let mut printed = 0;
    loop {
        let reply: PollReply = client.call_json(Opcode::POLL, &poll)?;
        if reply.dropped > 0 {
            eprintln!(
                "agentos: {} event(s) lost: they came faster than they were read",
                reply.dropped
            );
        }
        for event in &reply.events {
            if args.count.is_some_and(|count| printed >= count) {
                break;
            }
            if json {
                writeln!(stdout, "{}", serde_json::to_string(event)?)?;
            } else {
                writeln!(stdout, "{}", line(event))?;
            }
            printed += 1;
        }
        stdout.flush()?;
        if args.count.is_some_and(|count| printed >= count) {
            return Ok(());
        }
        if reply.pending == 0 {
            std::thread::sleep(POLL_EVERY);
        }
    }
}

/// One event as a line: its time of day (UTC), its type, who made it,
/// and its data.
fn line(event: &EventInfo) -> String {
    let ms_of_day = event.timestamp % 86_400_000;
    let (hours, minutes) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60);
    let (seconds, millis) = (ms_of_day / 1000 % 60, ms_of_day % 1000);
    let kind = match &event.custom_type {
        Some(custom) => format!("{}:{custom}", event.kind),
        None => event.kind.clone(),
    };
    let source = match event.source_agent_id {
        0 => "kernel".to_owned(),
        id => format!("from {id}"),
    };
    format!(
        "{hours:02}:{minutes:02}:{seconds:02}.{millis:03} {kind} ({source}) {}",
        event.data
    )
}
