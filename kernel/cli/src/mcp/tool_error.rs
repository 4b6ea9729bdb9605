//! Why a tool call failed. The client gets it as a tool error
//! (`isError`) whose text is the message, so the model sees why and can
//! try again; the server tells failures apart by their kind, never by
//! their text.

use agentos_proto::ErrorCode;
use rmcp::model::{ContentBlock, IntoContents};

use super::arguments::ArgumentError;
use super::kernel::KernelError;

/// Why a tool call failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error(transparent)]
    Arguments(#[from] ArgumentError),
    /// The kernel refused, or was not reached.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Reply(#[from] ReplyError),
    /// The client cancelled a call that was following a task.
    #[error("the call was cancelled, and its task with it")]
    TaskCancelled,
    /// A task finished with no result to answer with.
    #[error("task {task_id} ended {state} without a result")]
    NoResult {
        task_id: String,
        state: &'static str,
    },
}

impl ToolError {
    /// The kernel's code, if the kernel refused.
    pub fn refusal_code(&self) -> Option<ErrorCode> {
        match self {
            ToolError::Kernel(err) => err.refusal_code(),
            _ => None,
        }
    }
}

impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<ContentBlock> {
        vec![ContentBlock::text(self.to_string())]
    }
}

/// A task's result that is not what its kind answers with, or an output
/// that cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    /// It does not read as the tool's output type.
    #[error("unexpected reply from the kernel: {0}")]
    Unreadable(serde_json::Error),
    /// The output could not be written as JSON.
    #[error("{0}")]
    Unwritable(serde_json::Error),
}
