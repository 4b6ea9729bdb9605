//! The AgentOS kernel: the `agentosd` daemon and the `agentos` command-line
//! client.
//!
//! One reactor thread ([`reactor`]) owns the socket ([`socket`]) and every
//! connection, identifies callers from their socket credentials
//! ([`identity`]), answers each opcode through its syscall handler
//! ([`syscall`]), and hands blocking work to worker threads ([`workers`]).
//! [`daemon`] puts it together from a [`config::Config`].
//!
//! The subsystems — the sandbox runtime ([`sandbox::runtime`]), the agents
//! ([`agents`]) and THINK ([`llm`]) — are wired in one place, the
//! [`syscall::Kernel`]; replies travel by [`address`]. Subsystems that run
//! processes of their own share [`process`] (pidfds, memfds) and
//! [`supervisor`] (a long-running child, restarted when it ends). Modules
//! depend on each other without cycles (a test reads the sources to keep
//! it so); `docs/architecture.md` draws the map.

pub mod address;
pub mod agents;
pub mod cgroup;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod exec;
pub mod identity;
pub mod llm;
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
pub mod timers;
pub mod tools;
pub mod workers;
