//! What the kernel's end-to-end tests share: a real `agentosd` on a
//! temporary socket ([`Daemon`], [`UnprivilegedDaemon`]), speaking the
//! protocol byte by byte ([`send`], [`recv_json`], …), driving agents
//! ([`act`], [`wait_for_state`], …; [`egress`] for their runs' network),
//! looking at the host ([`is_root`], [`processes_with`], …) and a stand-in
//! LLM provider ([`llm_stub`], which the THINK benchmark uses too).
//!
//! It needs nothing of the kernel crate: tests drive the daemon as its
//! clients do, and the few that use the kernel's library types import
//! them themselves.

// A harness exists to fail the test it serves: a panic naming what went
// wrong is its report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agents;
mod binaries;
mod daemon;
pub mod egress;
mod host;
pub mod llm_stub;
mod unprivileged;
mod wire;

pub use agents::{
    act, act_in, agent_info, agent_log, agent_log_with_line, calls_as_another_uid, is_agent_cgroup,
    listed_names, shared_dir, wait_for_state, write_actor, write_script, ACTOR, PY_KERNEL,
};
pub use binaries::{agentos, agentosd};
pub use daemon::{settled_fd_count, with_llm_stub, Daemon, StopOnDrop};
pub use host::{is_root, none_left, proc_status_field, processes_with, raise_fd_limit, until};
pub use unprivileged::{UnprivilegedDaemon, WorldExecutable, NOBODY};
pub use wire::{
    assert_closed, assert_usable, call_json, recv, recv_json, request, send, try_recv_json,
};
