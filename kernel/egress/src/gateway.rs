//! The egress service as the kernel's subsystems share it ([`Gateway`]):
//! the proxy that serves endpoints (or why none runs), the policy for
//! requests that leave `network` out, the numbering of endpoints, and the
//! environment that points a sandbox at its endpoint. Agents and EXEC
//! open an [`Endpoint`] through it for each sandbox or run whose
//! [`Egress`](crate::Egress) is a policy.

use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agentos_proto::payload::{NetAttempt, NetTotals};

use crate::endpoint::{self, Endpoint};
use crate::policy::Policy;
use crate::proxy::Proxy;
use crate::record::{lock, Record};

/// Where a sandbox finds the bundle of certificates it trusts: the
/// system's, and the proxy's per-boot CA.
pub const CA_BUNDLE_INSIDE: &str = "/run/agentos/ca-bundle.pem";

/// The egress service: the one proxy, as every subsystem that gives a
/// sandbox a policy holds it.
#[derive(Debug)]
pub struct Gateway {
    proxy: Result<Arc<Proxy>, Unavailable>,
    default: Option<Policy>,
    next_id: AtomicU64,
}

/// Why no egress proxy serves policies (they are then refused as
/// unavailable).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unavailable {
    /// Without namespaces a sandbox has no network of its own to put an
    /// endpoint in.
    #[error("this host gives the daemon no namespaces, so sandboxes share its network")]
    NoNamespaces,
    /// Making an endpoint inside a sandbox's network takes root.
    #[error("the daemon is not root, so it cannot make endpoints in sandboxes' networks")]
    NotRoot,
    /// The proxy failed to start (shared: every refused policy says it).
    #[error("the egress proxy cannot start: {0}")]
    CannotStart(Arc<io::Error>),
    /// None was started (in tests of other subsystems).
    #[error("no egress proxy runs")]
    NotStarted,
}

impl Gateway {
    /// `proxy`: the running proxy, or why none runs (policies are then
    /// refused as unavailable); `default`: the policy for requests that
    /// leave out `network`.
    pub fn new(proxy: Result<Proxy, Unavailable>, default: Option<Policy>) -> Gateway {
        Gateway {
            proxy: proxy.map(Arc::new),
            default,
            next_id: AtomicU64::new(1),
        }
    }

    /// A gateway without a proxy, for tests of other subsystems.
    pub fn without_proxy() -> Gateway {
        Gateway::new(Err(Unavailable::NotStarted), None)
    }

    /// The policy for requests that leave out `network`.
    pub fn default_policy(&self) -> Option<&Policy> {
        self.default.as_ref()
    }

    /// Why policies cannot be served, if they cannot.
    pub fn unavailable(&self) -> Option<&Unavailable> {
        self.proxy.as_ref().err()
    }

    /// Whether sandboxes need the CA bundle in their trust.
    pub fn intercepts(&self) -> bool {
        self.proxy.as_ref().is_ok_and(|proxy| proxy.intercepts())
    }

    /// Serves a sandbox's endpoint, `listener` (made with
    /// [`endpoint::listen_inside`]), under `policy`; `label` names it in
    /// the log.
    pub fn open(
        &self,
        label: String,
        listener: TcpListener,
        policy: Policy,
    ) -> io::Result<Endpoint> {
        let proxy = self
            .proxy
            .as_ref()
            .map_err(|why| io::Error::other(why.clone()))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        Ok(Endpoint::serve(
            Arc::clone(proxy),
            id,
            label,
            listener,
            policy,
        ))
    }

    /// The environment of a sandbox with an endpoint.
    pub fn environment(&self) -> Vec<(String, String)> {
        endpoint::proxy_environment(self.intercepts().then_some(CA_BUNDLE_INSIDE))
    }
}

/// A record's counters, as LIST and EXEC replies carry them.
pub fn net_totals(record: &Mutex<Record>) -> NetTotals {
    let totals = lock(record).totals();
    NetTotals {
        allowed: totals.allowed,
        refused: totals.refused,
        bytes_out: totals.bytes_out,
        bytes_in: totals.bytes_in,
    }
}

/// A record's kept attempts, oldest first, and how many older ones are
/// gone, as NET's reply carries them.
pub fn net_attempts(record: &Mutex<Record>) -> (Vec<NetAttempt>, u64) {
    let record = lock(record);
    let (attempts, dropped) = record.attempts();
    let attempts = attempts
        .map(|attempt| NetAttempt {
            at_ms: attempt.at_ms,
            host: attempt.host.clone(),
            port: attempt.port,
            address: attempt.address.clone(),
            allowed: attempt.allowed,
            reason: attempt.reason.clone(),
            bytes_out: attempt.bytes_out,
            bytes_in: attempt.bytes_in,
            duration_ms: attempt.duration_ms,
        })
        .collect();
    (attempts, dropped)
}
