//! What the tasks hand the kernel to do: work to start for a task, work
//! to stop after a cancel, and what a `wait` came to.

use agentos_proto::payload::{ExecRequest, TaskInfo, ThinkRequest};
use agentos_proto::ErrorReply;

use super::store::seam::ReadBack;
use crate::identity::Principal;

/// What the kernel should start for a task, replying to
/// `ReplyTo::Task(number)`.
#[derive(Debug)]
pub struct Start {
    /// The number its reply comes back under.
    pub number: u64,
    /// Whose it is.
    pub owner: Principal,
    /// What to run (or why it cannot be run).
    pub work: Result<WorkRequest, ErrorReply>,
    /// The task's span as a `traceparent`, with tracing on: its work
    /// joins it.
    pub trace: Option<String>,
}

/// The request a task's work makes of the kernel: the EXEC run or THINK
/// of an `exec` or `think` task, or a step of a prompt loop.
#[derive(Debug)]
pub enum WorkRequest {
    /// An EXEC run (boxed: far larger than a THINK).
    Exec(Box<ExecRequest>),
    /// A THINK.
    Think(ThinkRequest),
}

/// The work of a task that was cancelled: the kernel stops whatever
/// replies under `ReplyTo::Task(number)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CancelledWork {
    /// The number the task's work replies under.
    pub number: u64,
}

/// What a `wait` came to.
#[derive(Debug)]
pub enum Waited {
    /// The reply, now.
    Reply(Vec<u8>),
    /// The task has finished but its result is only in the store: read it
    /// (on a worker) and answer with it.
    ReadResult {
        /// The reading.
        read: ReadBack,
        /// The task as it is, without its result.
        task: Box<TaskInfo>,
    },
    /// The reply comes when the task ends or the wait times out.
    Later,
}
