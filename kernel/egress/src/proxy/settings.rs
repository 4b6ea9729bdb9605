//! What the proxy is configured with, and how it names an endpoint.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

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

impl Default for ProxySettings {
    /// No overrides, no extra roots, no credentials; 256 connections a
    /// sandbox; 10 s for a request head (and a tunnel's ClientHello); 10 s
    /// to resolve and connect.
    fn default() -> ProxySettings {
        ProxySettings {
            resolve: HashMap::new(),
            extra_roots_pem: Vec::new(),
            credentials: Vec::new(),
            max_connections: 256,
            head_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
        }
    }
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

/// An endpoint's number, as the proxy knows it: the gateway gives each
/// endpoint it opens one of its own (an agent's sandbox has one, and so
/// has each EXEC run or session, even when runs share a namespace).
pub type EndpointId = u64;
