//! A task's work, started as its owner on EXEC or THINK with the task as
//! the reply address, and stopped when the task is cancelled; its progress
//! read from what its run has printed so far.

use agentos_proto::{ErrorCode, ErrorReply};

use super::actor::Actor;
use super::Kernel;
use crate::address::ReplyTo;
use crate::identity::{Principal, KERNEL_OPERATOR};
use crate::permissions::allowed_by;
use crate::tasks::tool_menu::{Ranked, ToolMenu};
use crate::tasks::{CancelledWork, Start, WorkRequest, PROGRESS_BYTES};
use crate::tools::offer::{self, offered, Listing, Offered};

impl Kernel {
    /// Starts the queued tasks whose owners have room.
    pub fn start_tasks(&mut self) {
        // Work that cannot start fails its task at once, which frees its
        // owner's place: look again until nothing more starts.
        loop {
            let starts = {
                let on_offer = if self.tasks.prompt_queued() {
                    offered(&self.tools, Listing::Known)
                } else {
                    Vec::new()
                };
                let (agents, runs) = (&self.agents, &self.runs);
                // Each owner is told only of the tools it may call, as TOOL
                // `list` and `search` would show it (an owner that has gone
                // is told of none: its task fails at its first THINK).
                let menu = ToolMenu::new(
                    |prompt: &str, owner: Principal| {
                        let Ok(actor) = Actor::of(owner, agents, runs) else {
                            return Ranked::default();
                        };
                        ranked_for(&on_offer, actor.tools(), prompt)
                    },
                    self.llm.context_tokens(),
                );
                self.tasks.startable(&menu)
            };
            if starts.is_empty() {
                return;
            }
            for start in starts {
                self.start_task_work(start);
            }
        }
    }

    /// Starts a piece of a task's work — an EXEC run or a THINK, as its
    /// owner — whose reply comes back to the task. Work that cannot start
    /// fails the task with the reason.
    pub(super) fn start_task_work(&mut self, start: Start) {
        let reply_to = ReplyTo::Task(start.number);
        let principal = start.owner;
        let trace = start.trace;
        let started = start.work.and_then(|work| match work {
            WorkRequest::Exec(mut run) => {
                run.trace = run.trace.or(trace);
                self.start_run(run, principal, reply_to)
            }
            WorkRequest::Think(mut think) => {
                think.trace = think.trace.or(trace);
                let actor = self.task_actor(principal)?;
                let asker = self.asker(&actor, KERNEL_OPERATOR.id())?;
                self.llm
                    .think(&asker, reply_to, think, &mut self.outbox.replies)
            }
        });
        if let Err(err) = started {
            self.tasks
                .failed_to_start(start.number, err, &mut self.outbox.replies);
        }
    }

    /// The EXEC sessions of prompt loops that have ended go.
    pub fn close_ended_task_sessions(&mut self) {
        for (owner, session) in self.tasks.take_ended_sessions() {
            self.exec.close(owner, &session, &mut self.outbox.replies);
        }
    }

    /// Running tasks' progress: what their runs have printed so far
    /// (`save`: and into the store).
    pub(super) fn refresh_task_progress(&mut self, save: bool) {
        for number in self.tasks.running() {
            self.refresh_progress_of(number, save);
        }
    }

    /// The same, for the task whose work runs under `number`.
    pub fn refresh_progress_of(&mut self, number: u64, save: bool) {
        if let Some(output) = self
            .exec
            .output_so_far(ReplyTo::Task(number), PROGRESS_BYTES)
        {
            self.tasks.progress(number, output, save);
        }
    }

    /// Stops a cancelled task's work: its EXEC run is killed, its THINK
    /// withdrawn from the queue (one already at the provider answers no
    /// one).
    pub fn stop_task(&mut self, stop: CancelledWork) {
        // Its work is an EXEC run or a THINK (a prompt task's, either):
        // each subsystem stops what it has under this address, if anything.
        let reply_to = ReplyTo::Task(stop.number);
        self.exec.cancel(reply_to, &mut self.outbox.replies);
        self.llm.withdraw_reply(reply_to);
    }

    /// Who a task's work is done for, with what it was given: its owner,
    /// which must still be there.
    pub(super) fn task_actor(&self, principal: Principal) -> Result<Actor<'_>, ErrorReply> {
        Actor::of(principal, &self.agents, &self.runs)
            .map_err(|_| ErrorReply::new(ErrorCode::Unavailable, "the task's owner has ended"))
    }
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
        assert_eq!(all.named.len(), 3, "{all:?}");
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
