//! The loops of running prompt tasks, by task, and the sessions of those
//! that have ended, for the kernel to close.

use std::collections::HashMap;

use agentos_proto::payload::{PromptRequest, ThinkRequest};

use super::prompt::{PromptLoop, Step};
use crate::address::Answer;
use crate::identity::Principal;

/// Prompt loops under way.
#[derive(Debug, Default)]
pub struct PromptLoops {
    loops: HashMap<String, PromptLoop>,
    /// Sessions of loops that have ended, and whose they are.
    ended_sessions: Vec<(Principal, String)>,
}

impl PromptLoops {
    /// Starts task `id`'s loop for `request`, its code in the session the
    /// request names or else one of its own (`task-<id>`); `tools` lists
    /// the tools there are, a line each. Returns its first THINK and the
    /// iteration under way.
    pub fn start(&mut self, id: &str, request: PromptRequest, tools: &str) -> (ThinkRequest, u32) {
        let session = request
            .session
            .clone()
            .unwrap_or_else(|| format!("task-{id}"));
        let (prompt, think) = PromptLoop::start(request, session, tools);
        let iteration = prompt.iteration();
        self.loops.insert(id.to_owned(), prompt);
        (think, iteration)
    }

    /// Whether task `id` is a loop under way.
    pub fn runs(&self, id: &str) -> bool {
        self.loops.contains_key(id)
    }

    /// The answer to the step under way of task `id`'s loop: what it does
    /// next, and the iteration then under way.
    pub fn on_answer(&mut self, id: &str, answer: Answer) -> Option<(Step, u32)> {
        let prompt = self.loops.get_mut(id)?;
        let step = prompt.on_answer(answer);
        Some((step, prompt.iteration()))
    }

    /// Task `id` has ended, and its loop with it: a session the loop made
    /// for itself goes too; one its `owner` named stays the owner's.
    pub fn end(&mut self, id: &str, owner: Principal) {
        if let Some(prompt) = self.loops.remove(id) {
            if prompt.owns_session() {
                self.ended_sessions
                    .push((owner, prompt.session().to_owned()));
            }
        }
    }

    /// The sessions of loops that have ended (taken): the kernel closes
    /// them.
    pub fn take_ended_sessions(&mut self) -> Vec<(Principal, String)> {
        std::mem::take(&mut self.ended_sessions)
    }
}
