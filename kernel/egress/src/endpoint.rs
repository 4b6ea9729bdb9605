//! A sandbox's endpoint, where it reaches the egress proxy: a socket
//! listening on loopback inside the sandbox's own network namespace, made
//! by the kernel, so no relay runs in the sandbox and nothing but the
//! proxy is reachable from it; the environment that points the sandbox's
//! programs at it; and [`Endpoint`], the handle that keeps it served.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex};

use agentos_primitives::threads;

use crate::policy::Policy;
use crate::proxy::{EndpointId, Proxy};
use crate::record::Record;

/// Where the proxy listens inside every sandbox.
pub const PROXY_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 3128);

/// A non-blocking socket listening on [`PROXY_ADDRESS`] inside the network
/// namespace of the process `pidfd` refers to. A thread of its own enters
/// the namespace and ends, so no other thread ever makes a socket there.
pub fn listen_inside(pidfd: BorrowedFd<'_>) -> io::Result<TcpListener> {
    let pidfd = pidfd.try_clone_to_owned()?;
    threads::spawn("netns", move || {
        // SAFETY: setns on this thread only, with a pidfd we own.
        if unsafe { libc::setns(pidfd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let listener = TcpListener::bind(PROXY_ADDRESS)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })?
    .join()
    .map_err(|_| io::Error::other("the thread entering the sandbox's network panicked"))?
}

/// An endpoint the proxy serves: its record, and the listener, which
/// closes (with every connection through it) when this is dropped.
#[derive(Debug)]
pub struct Endpoint {
    id: EndpointId,
    proxy: Arc<Proxy>,
    record: Arc<Mutex<Record>>,
}

impl Endpoint {
    /// Has `proxy` serve `listener` as endpoint `id` under `policy`
    /// (`label` names it in the log).
    pub(crate) fn serve(
        proxy: Arc<Proxy>,
        id: EndpointId,
        label: String,
        listener: TcpListener,
        policy: Policy,
    ) -> Endpoint {
        let record = proxy.serve(id, label, listener, policy);
        Endpoint { id, proxy, record }
    }

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

/// The environment that points a sandbox's programs at the proxy: both
/// spellings of each variable (curl reads only the lower-case `http_proxy`;
/// others read either), and `ca_bundle` as the trust of every common
/// client when the proxy intercepts some hosts.
pub fn proxy_environment(ca_bundle: Option<&str>) -> Vec<(String, String)> {
    let url = format!("http://{PROXY_ADDRESS}");
    let mut env = Vec::new();
    for name in ["http_proxy", "https_proxy", "all_proxy"] {
        env.push((name.to_string(), url.clone()));
        env.push((name.to_ascii_uppercase(), url.clone()));
    }
    let local = "localhost,127.0.0.1,::1".to_string();
    env.push(("no_proxy".into(), local.clone()));
    env.push(("NO_PROXY".into(), local));
    // Node's own fetch and http honour the variables only when told to.
    env.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
    if let Some(bundle) = ca_bundle {
        for name in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "PIP_CERT",
            "GIT_SSL_CAINFO",
            "NODE_EXTRA_CA_CERTS",
        ] {
            env.push((name.into(), bundle.into()));
        }
    }
    env
}
