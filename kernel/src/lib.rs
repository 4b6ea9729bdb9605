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
//! ([`tasks`]); a sandbox's egress (what it may reach beyond its own
//! loopback, and the proxy that holds it to that) is the `agentos_egress`
//! crate's. What a principal may be given — tool patterns, token
//! budgets — is [`permissions`], below them all. Replies travel by
//! [`address`] and stay typed until the reactor writes them. Subsystems
//! that run processes of their own share [`process`] (pidfds, memfds),
//! [`fd`] (descriptors passed over Unix sockets, non-blocking mode,
//! watching one with mio) and [`supervisor`] (a long-running child,
//! restarted when it ends); the leaves — [`clock`], [`random`],
//! [`python_names`] — serve everyone, as do the mechanisms of
//! `agentos_primitives` (named threads, worker pools, timer heaps, log
//! throttles, the outbound HTTP agent). Dependencies point from the
//! reactor down to the leaves, never back up, and no file depends on one
//! that depends on it: a test reads the sources to keep it so, and
//! `docs/architecture.md` draws the map.

mod address;
pub mod agents;
mod as_caller;
mod async_calls;
mod audit;
mod cgroup;
mod clock;
pub mod config;
pub mod daemon;
mod events;
pub mod exec;
mod fd;
mod files;
pub mod fleet;
mod http_call;
mod identity;
mod kernel;
mod llm;
mod messages;
mod permissions;
pub mod process;
mod python_names;
mod random;
mod reactor;
mod recording;
pub mod sandbox;
mod service;
mod socket;
mod state_dir;
mod state_store;
mod supervisor;
mod syscall;
mod tasks;
mod telemetry;
pub mod tools;
mod workers;
