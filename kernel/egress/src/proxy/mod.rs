//! The egress proxy: one event loop thread of its own serving every
//! sandbox's endpoint, so a flood of connections from one sandbox never
//! delays a kernel request.
//!
//! The kernel makes each endpoint (a TCP socket listening on loopback
//! inside the sandbox's network namespace, see [`crate::endpoint`]) and
//! hands it over with the sandbox's policy ([`Proxy::serve`]); from then
//! on the proxy accepts on it, reads each request head (CONNECT, or plain
//! HTTP in absolute form), resolves the name on a resolver thread, decides
//! on name and address, connects, checks a tunnel's TLS server name, and
//! moves bytes. Every attempt goes to the endpoint's [`Record`] and to the
//! log.
//!
//! A host with a credential is intercepted: its tunnel's TLS is ended at
//! the proxy with a leaf signed by a CA minted at start (see
//! [`Proxy::ca_certificate_pem`]), and every request head on it gets the
//! credential's header. Other hosts' TLS is never touched.
//!
//! Files: `settings`; `event_loop` (the thread: its endpoints,
//! connections and deadlines), `served` (one endpoint as it is served, and
//! what is written about its connections), `connection` (one client
//! connection's state) and `phases` (what is done with a connection in
//! each phase); `resolver` (DNS threads); `splice` (moving bytes with
//! backpressure, through a kernel pipe for bulk); `intercept` and `tls`
//! (the TLS both ways, the CA); `http` (request heads rewritten); `admit`
//! (which requests a tunnel takes) and `refusal` (why one is refused;
//! `tunnel_tests` drives both); `body` (where a request's body ends);
//! `reply` (refusals); `log_budget` (log lines within a budget).

mod admit;
mod body;
mod connection;
mod event_loop;
mod http;
mod intercept;
mod log_budget;
mod phases;
mod refusal;
mod reply;
mod resolver;
mod served;
mod settings;
mod splice;
mod tls;
#[cfg(test)]
mod tunnel_tests;

pub use settings::{Credential, EndpointId, ProxySettings};

use std::io;
use std::net::TcpListener;
use std::panic;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use agentos_primitives::threads;
use mio::{Poll, Waker};

use crate::policy::Policy;
use crate::record::Record;
use event_loop::{Control, EventLoop, Parts, WAKER};

/// How many threads resolve names.
const RESOLVER_THREADS: usize = 8;

/// The running proxy: a handle to its thread. Dropping it stops the
/// thread (every endpoint and connection closes) and waits for it; the
/// resolver threads end after the lookup they are in.
pub struct Proxy {
    control: Sender<Control>,
    waker: Arc<Waker>,
    ca_pem: String,
    intercepts: bool,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("intercepts", &self.intercepts)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Starts the proxy's thread (and its resolver threads) and mints the
    /// per-boot certificate authority interception signs with.
    pub fn start(settings: ProxySettings) -> io::Result<Proxy> {
        let provider = tls::provider();
        let authority = tls::Authority::mint(provider.clone()).map_err(io::Error::other)?;
        let upstream_tls =
            tls::upstream_config(provider, &settings.extra_roots_pem).map_err(io::Error::other)?;
        let ca_pem = authority.certificate_pem().to_owned();
        let intercepts = !settings.credentials.is_empty();
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let (resolver, answers) = resolver::Resolver::start(RESOLVER_THREADS, waker.clone())?;
        let (control, control_from) = mpsc::channel();
        let event_loop = EventLoop::new(Parts {
            poll,
            settings,
            authority,
            upstream_tls,
            control: control_from,
            resolver,
            answers,
        });
        let thread = threads::spawn("proxy", move || {
            // Every sandbox's egress stops with this thread: say so, then
            // let the panic go on to be logged with its message.
            let run = panic::AssertUnwindSafe(move || event_loop.run());
            if let Err(payload) = panic::catch_unwind(run) {
                log::error!(
                    "network: the egress proxy's thread panicked; no sandbox can reach out now"
                );
                panic::resume_unwind(payload);
            }
        })?;
        Ok(Proxy {
            control,
            waker,
            ca_pem,
            intercepts,
            thread: Some(thread),
        })
    }

    /// The per-boot CA certificate (PEM) a sandbox trusts so that hosts
    /// with a credential can be intercepted.
    pub fn ca_certificate_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Whether any host has a credential (only then does a sandbox need
    /// the CA in its trust).
    pub fn intercepts(&self) -> bool {
        self.intercepts
    }

    /// Serves endpoint `id`: `listener` (non-blocking, bound inside a
    /// sandbox's network namespace) under `policy`; `label` names it in the
    /// log (`agent worker1`, `run 17 of operator`). The record it returns
    /// is the one the proxy writes to. Serving an `id` again replaces its
    /// listener (the old one's connections close).
    pub fn serve(
        &self,
        id: EndpointId,
        label: String,
        listener: TcpListener,
        policy: Policy,
    ) -> Arc<Mutex<Record>> {
        let record = Arc::new(Mutex::new(Record::default()));
        self.send(Control::Serve {
            id,
            label,
            listener,
            policy,
            record: record.clone(),
        });
        record
    }

    /// Replaces endpoint `id`'s policy; its open connections that the new
    /// policy refuses are closed.
    pub fn set_policy(&self, id: EndpointId, policy: Policy) {
        self.send(Control::SetPolicy { id, policy });
    }

    /// Stops serving endpoint `id`: its listener and connections close.
    pub fn forget(&self, id: EndpointId) {
        self.send(Control::Forget { id });
    }

    fn send(&self, control: Control) {
        // A proxy thread that is gone has nothing left to serve.
        if self.control.send(control).is_ok() {
            let _ = self.waker.wake();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.send(Control::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handle_can_be_shared_with_the_kernels_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<Proxy>();
    }

    #[test]
    fn a_credentials_value_is_not_shown() {
        let settings = ProxySettings {
            credentials: vec![Credential {
                host: "api.example".into(),
                header: "Authorization".into(),
                value: "Bearer hidden-value".into(),
            }],
            ..ProxySettings::default()
        };
        let shown = format!("{settings:?}");
        assert!(
            shown.contains("api.example") && !shown.contains("hidden-value"),
            "{shown}"
        );
    }
}
