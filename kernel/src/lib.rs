//! The AgentOS kernel: the `agentosd` daemon and the `agentos` command-line
//! client.
//!
//! One reactor thread ([`reactor`]) owns the socket ([`socket`]) and every
//! connection, identifies callers from their socket credentials
//! ([`identity`]), answers each opcode through its syscall handler
//! ([`syscall`]), and hands blocking work to worker threads ([`workers`]).
//! [`daemon`] puts it together from a [`config::Config`]. Subsystems that
//! run processes of their own share [`process`] (pidfds, memfds) and
//! [`supervisor`] (a long-running child, restarted when it ends).

pub mod agents;
pub mod cgroup;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod identity;
pub mod llm;
pub mod process;
pub mod reactor;
pub mod sandbox;
pub mod socket;
pub mod supervisor;
pub mod syscall;
pub mod timers;
pub mod workers;
