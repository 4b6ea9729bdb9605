//! The small mechanisms AgentOS's daemons share, each written once.
//!
//! A thread pool on a shared queue, a heap of deadlines, a throttle on a
//! log line, an HTTP client that must never follow a redirect: each is
//! easy to write again, and each copy drifts (one pool stops catching
//! panics, one agent forgets to refuse redirects and carries a key to
//! another host). So each has one home here, and a security property set
//! here is set everywhere.
//!
//! - [`threads`]: every thread the daemons start, named, its panic logged.
//! - [`pool`]: N named threads taking jobs from one queue and sending
//!   results back through a channel and a [`mio::Waker`].
//! - [`timers`]: a min-heap of deadlines for a thread that never sleeps
//!   but in `poll`.
//! - [`log_throttle`]: at most N lines of a kind per interval, with a
//!   count of what was held back.
//! - [`http_agent`]: the outbound HTTP agent, which never follows
//!   redirects.
//!
//! Nothing here knows the kernel: no wire types, no connection serials.

pub mod http_agent;
pub mod log_throttle;
pub mod pool;
pub mod threads;
pub mod timers;
