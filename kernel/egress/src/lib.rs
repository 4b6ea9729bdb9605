//! AgentOS egress: what a sandbox may reach beyond its own loopback, and
//! the proxy that holds it to that. The kernel daemon uses this crate; it
//! knows nothing of the daemon.
//!
//! The parts, from a request's `network` to the bytes on the wire:
//!
//! - [`Egress`] ([`egress`]): one sandbox's egress as a request gives it,
//!   narrowed to what the caller may give: its own loopback, the host's
//!   network, or a [`policy::Policy`] of hosts and addresses allowed and
//!   denied ([`policy`]).
//! - [`Gateway`] ([`gateway`]): the egress service the kernel's
//!   subsystems share: the one proxy (or why none runs), the default
//!   policy, and the opening of endpoints.
//! - [`Endpoint`] ([`endpoint`]): where a sandbox with a policy reaches
//!   the proxy, a socket the kernel makes inside the sandbox's network
//!   namespace, and the environment that points the sandbox's programs at
//!   it. Each agent sandbox, and each EXEC run or session, has its own.
//! - [`proxy::Proxy`] ([`proxy`]): the event loop thread that serves every
//!   endpoint: it reads what a sandbox asks for ([`request`], the TLS
//!   server name by [`sni`]), resolves and decides it against the
//!   endpoint's policy, connects and moves the bytes.
//! - [`record::Record`] ([`record`]): what an endpoint's connections did,
//!   which NET, LIST and EXEC replies report.
//!
//! The log says `network:` for all of it, as the configuration's
//! `[network]` and a request's `network` do.

pub mod egress;
pub mod endpoint;
pub mod gateway;
pub mod policy;
pub mod proxy;
pub mod record;
pub mod request;
pub mod sni;

pub use egress::Egress;
pub use endpoint::Endpoint;
pub use gateway::Gateway;
