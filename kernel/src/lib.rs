//! The AgentOS kernel: the `agentosd` daemon.
//!
//! One reactor thread ([`reactor`]) owns the socket ([`socket`]) and every
//! connection, identifies callers from their socket credentials
//! ([`identity`]), answers each opcode through its syscall handler
//! ([`syscall`]), and hands blocking work to worker threads ([`workers`]).
//! [`daemon`] puts it together from a [`config::Config`] and runs it as a
//! service ([`service`]), with its files beside the socket ([`state_dir`]).
//!
//! The handlers act on the [`kernel::Kernel`], where every subsystem is
//! wired: the sandbox runtime and the one-shot sandboxes it keeps
//! ([`sandbox`], on [`cgroup`]), the agents ([`agents`]), THINK ([`llm`]),
//! EXEC ([`exec`]), the tools ([`tools`]) and the background tasks
//! ([`tasks`]). What a principal may be given — tool patterns, token
//! budgets — is [`permissions`], below them all. Replies travel by
//! [`address`] and stay typed until the reactor writes them. Subsystems
//! that run processes of their own share [`process`] (pidfds, memfds),
//! [`fd`] (descriptors passed over Unix sockets, non-blocking mode,
//! watching one with mio) and [`supervisor`] (a long-running child,
//! restarted when it ends); the leaves — [`clock`], [`timers`],
//! [`random`], [`python_names`] — serve everyone. Dependencies point from
//! the reactor down to the leaves, never back up, and no file depends on
//! one that depends on it: a test reads the sources to keep it so, and
//! `docs/architecture.md` draws the map.

pub mod address;
pub mod agents;
pub mod cgroup;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod exec;
pub mod fd;
pub mod identity;
pub mod kernel;
pub mod llm;
pub mod network;
pub mod permissions;
pub mod process;
pub mod python_names;
pub mod random;
pub mod reactor;
pub mod sandbox;
pub mod service;
pub mod socket;
pub mod state_dir;
pub mod supervisor;
pub mod syscall;
pub mod tasks;
pub mod telemetry;
pub mod timers;
pub mod tools;
pub mod workers;
