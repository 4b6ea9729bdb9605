//! EXEC: agent-written code run in pooled, isolated sandboxes. Only what a
//! run prints comes back, each stream capped in fixed memory ([`output`]).
//!
//! The dispatcher ([`Exec`], `dispatch`) holds EXEC's parts, each the owner
//! of its own state, and does what takes more than one of them:
//!
//! - the pool (`pool`): exec hosts (`exec_host`, started and replaced by
//!   `hosts`), sandboxes of the runtime whose workload is a Python zygote
//!   ([`zygote`]); it keeps run children forked from its warm image, each
//!   already isolated and waiting for code, and hands them to the kernel
//!   over the channel its claim brought ([`wire`]). The kernel holds each
//!   child (`child`, all of them in `children`, their descriptors watched
//!   as `sources`) until it has served one run and is gone, and the host
//!   prepares another. An order goes to a child and is answered once the
//!   child has said how it ended and its output pipes have closed
//!   (`order`); a run gets a kernel connection of its own (`connections`).
//!   A timeout kills the run's whole PID namespace through the pidfd the
//!   child sent first. What runs and children come to is counted here for
//!   the metrics (`counts`).
//! - the backlog (`backlog`): requests waiting (`waiting`) in their owners'
//!   queues (`requests`), and sessions, which keep their child from run to
//!   run (`sessions`), each with a queue of its own; what is done to a
//!   session that runs no code of the caller's (`session_ops`); and the
//!   disks sessions, their snapshots, templates and volumes live on
//!   (`disks`, `disk_work`).
//! - runs' cgroups (`exec_cgroups`): each run has one of its own
//!   (`run_cgroup`), made ahead of need off the reactor (`cgroups`), with
//!   limits within its caller's ([`limits`]); an agent's runs have theirs
//!   inside the agent's own cgroup, so what they use adds up against the
//!   agent's limits.
//! - runs' network (`network`), held to its owner's policy when a run
//!   starts, and runs' spans (`spans`).
//!
//! EXEC is shared fairly between owners ([`queues`]): each agent tree and
//! each operator has a queue of its own, served in turn, with a cap on the
//! runs one owner holds and room always kept for operators. An owner's
//! work ends with it: a closed connection's runs, an ended agent's runs
//! and sessions.
//!
//! This file only declares the parts.

mod backlog;
mod cgroups;
mod child;
mod children;
mod connections;
mod counts;
mod dirs;
mod disk_work;
mod disks;
mod dispatch;
mod exec_cgroups;
mod exec_host;
pub mod files;
mod front;
mod hosts;
mod lifetimes;
pub mod limits;
mod network;
mod order;
pub mod output;
mod pool;
mod procs;
pub mod queues;
mod requests;
mod run_cgroup;
mod session_meta;
mod session_ops;
mod sessions;
mod sources;
mod spans;
mod waiting;
pub mod wire;
pub mod zygote;

pub use dirs::ExecDirs;
pub use disk_work::Build;
pub use disks::templates::key as template_key;
pub use disks::volumes::VolumeUse;
pub use disks::{carried as carried_template, is_hash, FleetFiles, ImportError};
pub use disks::{SessionRecord, StoreError, TemplateMoveError};
pub use exec_host::HostId;
pub use front::Exec;
pub use procs::Answered;
pub use queues::Share;
pub use run_cgroup::ChargedTo;
pub use session_ops::SessionOp;
pub use sources::TOKEN_SPAN;
pub use waiting::RunCaller;
