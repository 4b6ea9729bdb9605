//! How a task ends: its final state from its work's reply, and the result
//! of a task stopped before its work answered — built as a value and
//! serialized once.

use agentos_proto::payload::{to_json, StoppedResult, TaskState};

use crate::address::Answer;

/// Why a task that was running when the kernel stopped ends `interrupted`.
pub const KERNEL_STOPPED: &str = "the kernel stopped while the task ran";
/// Why an agent's task still queued when its kernel stopped ends
/// `interrupted`: the agent went with that kernel.
pub const AGENT_ENDED_WITH_KERNEL: &str = "its agent ended with the kernel";

/// A task's final state from its work's reply: an EXEC run that timed out
/// is `timed_out`; one that did not succeed is `failed`.
pub fn state_of(answer: &Answer) -> TaskState {
    match answer {
        Answer::Exec(run) if run.timed_out => TaskState::TimedOut,
        answer if answer.is_success() => TaskState::Completed,
        _ => TaskState::Failed,
    }
}

/// The result of a task cancelled because `why`.
pub fn cancelled(why: &str) -> Vec<u8> {
    to_json(&StoppedResult::cancelled(why))
}

/// The result of a task that could not go on because `why`, with what it
/// had printed.
pub fn interrupted(why: &str, output: &str) -> Vec<u8> {
    to_json(&StoppedResult::interrupted(why, output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_proto::payload::ExecReply;
    use agentos_proto::{ErrorCode, ErrorReply};
    use serde_json::Value;

    #[test]
    fn stopped_results_are_the_bytes_they_have_always_been() {
        // How a cancelled and an interrupted task's results were written
        // before they were typed: an error reply, its code replaced.
        let why = "the task was cancelled by its owner";
        let mut old = serde_json::to_value(ErrorReply::new(ErrorCode::Other, why)).unwrap();
        old["code"] = Value::String("cancelled".into());
        // Values then kept their keys sorted.
        old.as_object_mut().unwrap().sort_keys();
        assert_eq!(cancelled(why), serde_json::to_vec(&old).unwrap());
        for output in ["", "1\n2\n\"quoted\" \u{e9}"] {
            let mut old =
                serde_json::to_value(ErrorReply::new(ErrorCode::Unavailable, KERNEL_STOPPED))
                    .unwrap();
            old["code"] = Value::String("interrupted".into());
            old["output"] = Value::String(output.to_owned());
            old.as_object_mut().unwrap().sort_keys();
            assert_eq!(
                interrupted(KERNEL_STOPPED, output),
                serde_json::to_vec(&old).unwrap()
            );
        }
    }

    #[test]
    fn a_run_past_its_timeout_is_timed_out_and_a_failed_reply_failed() {
        let timed_out = ExecReply {
            timed_out: true,
            ..ExecReply::default()
        };
        assert_eq!(state_of(&timed_out.into()), TaskState::TimedOut);
        let ran = ExecReply {
            success: true,
            ..ExecReply::default()
        };
        assert_eq!(state_of(&ran.into()), TaskState::Completed);
        assert_eq!(state_of(&ExecReply::default().into()), TaskState::Failed);
        let refused = ErrorReply::new(ErrorCode::Busy, "full");
        assert_eq!(state_of(&refused.into()), TaskState::Failed);
    }
}
