//! A task's work: done as its owner, with the task as the reply address
//! (the kernel starts it on EXEC or THINK); the queued tasks that may
//! start, each told of the tools its owner may call; stopped when the task
//! is cancelled; its progress read from what its run has printed so far.

use agentos_proto::{ErrorCode, ErrorReply};

use super::actor::Actor;
use super::runs::Runs;
use crate::address::{Reply, ReplyTo};
use crate::agents::Agents;
use crate::exec::Exec;
use crate::identity::Principal;
use crate::llm::Llm;
use crate::permissions::allowed_by;
use crate::tasks::tool_menu::{Ranked, ToolMenu};
use crate::tasks::{CancelledWork, Start, Tasks, PROGRESS_BYTES};
use crate::tools::offer::{self, offered, Listing, Offered};
use crate::tools::servers::Servers;

/// Who a task's work is done for, with what it was given: its owner,
/// which must still be there.
pub fn owner<'a>(
    principal: Principal,
    agents: &'a Agents,
    runs: &'a Runs,
) -> Result<Actor<'a>, ErrorReply> {
    Actor::of(principal, agents, runs)
        .map_err(|_| ErrorReply::new(ErrorCode::Unavailable, "the task's owner has ended"))
}

/// The queued tasks whose owners have room, taken off the queue to start.
/// Each owner is told only of the tools it may call, as TOOL `list` and
/// `search` would show it (an owner that has gone is told of none: its
/// task fails at its first THINK); `context_tokens` is THINK's context.
pub fn startable(
    tasks: &mut Tasks,
    tools: &Servers,
    agents: &Agents,
    runs: &Runs,
    context_tokens: Option<u32>,
) -> Vec<Start> {
    let on_offer = if tasks.prompt_queued() {
        offered(tools, Listing::Known)
    } else {
        Vec::new()
    };
    let menu = ToolMenu::new(
        |prompt: &str, owner: Principal| {
            let Ok(actor) = Actor::of(owner, agents, runs) else {
                return Ranked::default();
            };
            ranked_for(&on_offer, actor.tools(), prompt)
        },
        context_tokens,
    );
    tasks.startable(&menu)
}

/// The EXEC sessions of prompt loops that have ended go.
pub fn close_ended_sessions(tasks: &mut Tasks, exec: &mut Exec, replies: &mut Vec<Reply>) {
    for (owner, session) in tasks.take_ended_sessions() {
        exec.close(owner, &session, replies);
    }
}

/// Every running task's progress (`save`: and into the store).
pub fn refresh_all_progress(save: bool, tasks: &mut Tasks, exec: &Exec) {
    for number in tasks.running() {
        refresh_progress(number, save, tasks, exec);
    }
}

/// The progress of the task whose work runs under `number`: what its run
/// has printed so far (`save`: and into the store).
pub fn refresh_progress(number: u64, save: bool, tasks: &mut Tasks, exec: &Exec) {
    if let Some(output) = exec
        .pool()
        .children()
        .output_so_far(ReplyTo::Task(number), PROGRESS_BYTES)
    {
        tasks.progress(number, output, save);
    }
}

/// Stops a cancelled task's work: its EXEC run is killed, its THINK
/// withdrawn from the queue (one already at the provider answers no one).
pub fn stop(stop: CancelledWork, exec: &mut Exec, llm: &mut Llm, replies: &mut Vec<Reply>) {
    // Its work is an EXEC run or a THINK (a prompt task's, either): each
    // subsystem stops what it has under this address, if anything.
    let reply_to = ReplyTo::Task(stop.number);
    exec.cancel(reply_to, replies);
    llm.withdraw_reply(reply_to);
}

/// Every tool on offer that `patterns` allow (`None`: all) as a line of
/// the prompt loop's list: the ones `prompt` names, best first, and the
/// rest in their usual order.
fn ranked_for(on_offer: &[Offered<'_>], patterns: Option<&[String]>, prompt: &str) -> Ranked {
    let mine: Vec<Offered<'_>> = on_offer
        .iter()
        .filter(|offered| {
            patterns.is_none_or(|patterns| allowed_by(patterns, offered.server, &offered.tool.name))
        })
        .cloned()
        .collect();
    let line = |index: usize| offer::summary(std::slice::from_ref(&mine[index]));
    let named = offer::named_in(&mine, prompt);
    let mut is_named = vec![false; mine.len()];
    for index in &named {
        is_named[*index] = true;
    }
    Ranked {
        named: named.into_iter().map(line).collect(),
        rest: (0..mine.len())
            .filter(|index| !is_named[*index])
            .map(line)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::mcp::client::ToolInfo;

    #[test]
    fn a_loop_is_told_only_of_the_tools_its_owner_may_call() {
        let tool = |name: &str| ToolInfo {
            name: name.into(),
            description: format!("Does {name}."),
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
        };
        let (read, write, echo) = (tool("read_file"), tool("write_file"), tool("echo"));
        let on_offer = offer::name_for_python([
            ("filesystem", &read),
            ("filesystem", &write),
            ("everything", &echo),
        ]);
        let prompt = "Use the filesystem server's write_file and the everything server.";
        let all = ranked_for(&on_offer, None, prompt);
        assert_eq!(
            all.named,
            [
                "tools.filesystem.write_file()  # Does write_file.",
                "tools.everything.echo()  # Does echo."
            ],
            "a server's tool named leaves its others out"
        );
        let narrowed = vec!["filesystem.read_file".to_owned()];
        let mine = ranked_for(&on_offer, Some(&narrowed), prompt);
        assert_eq!(
            (mine.named, mine.rest),
            (
                vec!["tools.filesystem.read_file()  # Does read_file.".to_owned()],
                vec![]
            ),
            "a tool it may not call is neither listed nor counted"
        );
        assert!(ranked_for(&on_offer, Some(&[]), prompt).named.is_empty());
    }
}
