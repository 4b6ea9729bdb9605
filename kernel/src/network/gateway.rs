//! What the kernel's subsystems share to give sandboxes a policy: the
//! proxy (or why there is none), the configured default, and the
//! environment that points a sandbox at its endpoint.

use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::endpoint;
use super::policy::Policy;
use super::proxy::{Proxy, SandboxId};
use agentos_proto::payload::{NetAttempt, NetTotals};

use super::record::{lock, Record};

/// Where a sandbox finds the bundle of certificates it trusts: the
/// system's, and the proxy's per-boot CA.
pub const CA_BUNDLE_INSIDE: &str = "/run/agentos/ca-bundle.pem";

/// The egress proxy as the subsystems see it.
#[derive(Debug)]
pub struct Gateway {
    proxy: Result<Arc<Proxy>, String>,
    default: Option<Policy>,
    next_id: AtomicU64,
}

/// A sandbox served by the proxy: its record, and its endpoint, which
/// closes (with every connection through it) when this is dropped.
#[derive(Debug)]
pub struct Endpoint {
    id: SandboxId,
    proxy: Arc<Proxy>,
    record: Arc<Mutex<Record>>,
}

impl Gateway {
    /// `proxy`: the running proxy, or why none runs (policies are then
    /// refused as unavailable); `default`: the policy for requests that
    /// leave out `network`.
    pub fn new(proxy: Result<Proxy, String>, default: Option<Policy>) -> Gateway {
        Gateway {
            proxy: proxy.map(Arc::new),
            default,
            next_id: AtomicU64::new(1),
        }
    }

    /// A gateway without a proxy, for tests of other subsystems.
    pub fn without_proxy() -> Gateway {
        Gateway::new(Err("no egress proxy runs".into()), None)
    }

    /// The policy for requests that leave out `network`.
    pub fn default_policy(&self) -> Option<&Policy> {
        self.default.as_ref()
    }

    /// Why policies cannot be served, if they cannot.
    pub fn unavailable(&self) -> Option<&str> {
        self.proxy.as_ref().err().map(String::as_str)
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
        let record = proxy.serve(id, label, listener, policy);
        Ok(Endpoint {
            id,
            proxy: Arc::clone(proxy),
            record,
        })
    }

    /// The environment of a sandbox with an endpoint.
    pub fn environment(&self) -> Vec<(String, String)> {
        endpoint::proxy_environment(self.intercepts().then_some(CA_BUNDLE_INSIDE))
    }
}

impl Endpoint {
    /// Its record.
    pub fn record(&self) -> &Arc<Mutex<Record>> {
        &self.record
    }

    /// Replaces its policy; connections the new one refuses close.
    pub fn set_policy(&self, policy: Policy) {
        self.proxy.set_policy(self.id, policy);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.proxy.forget(self.id);
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
