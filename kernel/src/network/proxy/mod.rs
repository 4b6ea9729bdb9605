//! The kernel's egress proxy: one event loop thread of its own serving
//! every sandbox's proxy endpoint, so a flood of connections from one
//! sandbox never delays a kernel request.
//!
//! The kernel makes each endpoint (a TCP socket listening on loopback
//! inside the sandbox's network namespace) and hands it over with the
//! sandbox's policy ([`Proxy::serve`]); from then on the proxy accepts on
//! it, reads each request head (CONNECT, or plain HTTP in absolute form),
//! resolves the name on a resolver thread, decides on name and address,
//! connects, checks a tunnel's TLS server name, and moves bytes. Every
//! attempt goes to the sandbox's [`Record`] and to the log.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::policy::Policy;
use super::record::Record;

/// What the proxy is configured with (`[network]`).
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// Names answered without DNS: a test-only override (`[network] resolve`).
    pub resolve: HashMap<String, Vec<IpAddr>>,
    /// PEM certificates trusted upstream besides the public roots
    /// (`[network] extra_ca`).
    pub extra_roots_pem: Vec<u8>,
    /// Headers added to requests for a host (`[[network.credentials]]`).
    pub credentials: Vec<Credential>,
    /// Connections one sandbox may have open (or opening) at once.
    pub max_connections: usize,
    /// A client that has not sent its whole request head by then is closed.
    pub head_timeout: Duration,
    /// Resolving and connecting upstream must finish by then.
    pub connect_timeout: Duration,
}

/// A header the proxy adds to every request for `host`.
#[derive(Clone)]
pub struct Credential {
    pub host: String,
    pub header: String,
    /// The header's value; never logged, never shown.
    pub value: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("host", &self.host)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// A sandbox's endpoint, as the proxy knows it.
pub type SandboxId = u64;

/// The running proxy: a handle to its thread.
#[derive(Debug)]
pub struct Proxy {}

impl Proxy {
    /// Starts the proxy's thread (and its resolver threads) and mints the
    /// per-boot certificate authority interception signs with.
    pub fn start(settings: ProxySettings) -> io::Result<Proxy> {
        let _ = settings;
        Err(io::Error::other("the egress proxy is not built yet"))
    }

    /// The per-boot CA certificate (PEM) a sandbox trusts so that hosts
    /// with a credential can be intercepted.
    pub fn ca_certificate_pem(&self) -> &str {
        ""
    }

    /// Whether any host has a credential (only then does a sandbox need
    /// the CA in its trust).
    pub fn intercepts(&self) -> bool {
        false
    }

    /// Serves `listener` (non-blocking, bound inside sandbox `id`'s network
    /// namespace) under `policy`; `label` names the sandbox in the log
    /// (`agent worker1`, `run 17 of operator`). The record it returns is
    /// the one the proxy writes to.
    pub fn serve(
        &self,
        id: SandboxId,
        label: String,
        listener: TcpListener,
        policy: Policy,
    ) -> Arc<Mutex<Record>> {
        let _ = (id, label, listener, policy);
        Arc::new(Mutex::new(Record::default()))
    }

    /// Replaces sandbox `id`'s policy; its open connections that the new
    /// policy refuses are closed.
    pub fn set_policy(&self, id: SandboxId, policy: Policy) {
        let _ = (id, policy);
    }

    /// Stops serving sandbox `id`: its endpoint and connections close.
    pub fn forget(&self, id: SandboxId) {
        let _ = id;
    }
}
