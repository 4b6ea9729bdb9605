//! Sandboxes: isolated process trees, one implementation for agents (SPAWN)
//! and EXEC's exec hosts.
//!
//! The daemon side plans the sandbox ([`plan`] → [`SandboxSpec`]) and starts
//! it ([`launch`]: clone3 into new namespaces, exec the daemon's own binary
//! as [`init`]). The init side builds the root filesystem ([`mounts`]),
//! brings up loopback ([`network`]), gives up privileges ([`privileges`],
//! [`seccomp`]) and runs the workload as its PID 1 ([`pid1`]), reporting
//! over the status pipe ([`status`]) that it started, how it ended, or
//! which step failed ([`error`]). [`view`] answers what a path names
//! inside a sandbox, so an agent's requests are read in its own view.
//! [`confine`] gives the kernel's own children (the local model server)
//! the same view and privileges, without an init of their own.
//!
//! [`runtime`] keeps sandboxes alive for whoever owns them — an agent's
//! run, an EXEC: the launch thread, the warm pool, the doors, and the
//! events each owner hears.

pub mod attach;
pub mod confine;
mod control;
pub mod error;
pub mod init;
pub mod launch;
pub mod lookup;
pub mod mounts;
mod network;
mod pid1;
pub mod plan;
mod privileges;
pub mod runtime;
pub mod seccomp;
pub mod spec;
pub mod status;
pub mod view;

pub use launch::{Control, LaunchRequest, Launched, Launcher};
pub use spec::{Claim, Namespaces, SandboxSpec, User};
pub use status::{Status, StatusReader};
