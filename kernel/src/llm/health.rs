//! Whether the provider is answering: told apart from slow by a probe.
//!
//! THINK does not stream, so a call to a provider that took the
//! connection and never answers looks, from its thread, like a slow
//! generation until the attempt's timeout. A first-byte timeout on the
//! call would cut slow local generations short; instead, once an attempt
//! has waited [`WATCH_AFTER`] for its answer, a probe asks the provider
//! for something cheap (its model list) on a thread of its own. Any HTTP
//! answer, whatever its status, shows the provider is answering and the
//! call goes on waiting; no answer within `llm.probe_timeout_ms` makes the
//! provider *not answering*: the THINKs at it fail at once, new ones are
//! refused `unavailable`, and the probe is repeated every [`RECHECK`]
//! until the provider answers again.
//!
//! The state lives on the reactor thread; only the probe runs elsewhere.

use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentos_primitives::http_agent::{HttpAgent, Timeouts};
use agentos_primitives::pool::{Fifo, Outbox, Pool};
use agentos_primitives::threads::Named;
use mio::Waker;

use super::call::{host_of, CallTarget};
use crate::clock::rfc3339;

/// How long an attempt waits for its answer before the provider is
/// probed: answers to most calls come sooner, and they cost no probe.
pub const WATCH_AFTER: Duration = Duration::from_secs(2);
/// How often a provider that answered a probe is probed again while an
/// attempt still waits: a provider that stops answering in the middle of a
/// long generation is found out within this and a probe's timeout.
pub const WATCH_EVERY: Duration = Duration::from_secs(5);
/// How often a provider that is not answering is probed again.
pub const RECHECK: Duration = Duration::from_secs(3);

/// What a probe heard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// An HTTP answer, whatever its status.
    Answer,
    /// A connection, but no answer in time: what is said of the provider.
    Silence(String),
    /// No connection: the calls report that themselves.
    NoConnection,
    /// Nothing to probe (the local model server between restarts).
    Nothing,
}

/// The provider's health, and the probe that finds it out.
#[derive(Debug)]
pub struct Health {
    /// The probe's thread; `None` with probing turned off.
    prober: Option<Prober>,
    /// Since when the provider has not been answering, and what was said
    /// of it; cleared by the next answered probe.
    not_answering: Option<(SystemTime, String)>,
    /// A probe is out.
    probing: bool,
    /// When to look again.
    look_at: Option<Instant>,
}

/// The probe's thread and where it reports.
#[derive(Debug)]
struct Prober {
    jobs: Pool<Fifo<()>>,
    heard: Receiver<Heard>,
}

impl Health {
    /// Health probed with `timeout` through `endpoint` (no probing when
    /// `timeout` is zero or the thread cannot start).
    pub fn watching(endpoint: Arc<dyn CallTarget>, timeout: Duration, waker: Arc<Waker>) -> Health {
        let prober = if timeout.is_zero() {
            None
        } else {
            match Prober::start(endpoint, timeout, waker) {
                Ok(prober) => Some(prober),
                Err(err) => {
                    log::warn!("THINK: no health probe for the provider: {err}");
                    None
                }
            }
        };
        Health {
            prober,
            ..Health::unwatched()
        }
    }

    /// Health that is never probed (no provider).
    pub fn unwatched() -> Health {
        Health {
            prober: None,
            not_answering: None,
            probing: false,
            look_at: None,
        }
    }

    /// Since when the provider has not been answering, and why.
    pub fn not_answering(&self) -> Option<&(SystemTime, String)> {
        self.not_answering.as_ref()
    }

    /// A call went out: look at it once it may have waited long enough.
    pub fn call_sent(&mut self, now: Instant) {
        self.plan(now + WATCH_AFTER);
    }

    /// Time until the next look, if one is planned.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.look_at.map(|at| at.saturating_duration_since(now))
    }

    /// Looks, if a look is due: probes a provider that is not answering,
    /// or one an attempt has waited on for [`WATCH_AFTER`]
    /// (`oldest_wait`: when the longest-waiting attempt was sent), and
    /// keeps looking while `calls_out`.
    pub fn look(&mut self, now: Instant, oldest_wait: Option<Instant>, calls_out: bool) {
        if self.look_at.is_none_or(|at| at > now) {
            return;
        }
        self.look_at = None;
        if self.probing {
            return;
        }
        match oldest_wait {
            _ if self.not_answering.is_some() => self.probe(now),
            Some(sent) if now.saturating_duration_since(sent) >= WATCH_AFTER => self.probe(now),
            Some(sent) => self.plan(sent + WATCH_AFTER),
            // Between attempts, or not yet begun.
            None if calls_out => self.plan(now + WATCH_AFTER),
            None => {}
        }
    }

    /// Takes in what the probes heard. Returns what to say of the provider
    /// when it was found not answering: the calls at it fail with that.
    pub fn heard(&mut self, now: Instant, calls_out: bool) -> Option<String> {
        let heard: Vec<Heard> = match &self.prober {
            Some(prober) => prober.heard.try_iter().collect(),
            None => return None,
        };
        let mut silence = None;
        for heard in heard {
            self.probing = false;
            match heard {
                Heard::Silence(what) => {
                    let since = self
                        .not_answering
                        .as_ref()
                        .map_or_else(SystemTime::now, |(since, _)| *since);
                    if self.not_answering.is_none() {
                        log::warn!("THINK: {what}");
                    }
                    self.not_answering = Some((since, what.clone()));
                    self.plan(now + RECHECK);
                    silence = Some(what);
                }
                Heard::Answer | Heard::NoConnection | Heard::Nothing => {
                    if let Some((since, _)) = self.not_answering.take() {
                        log::info!(
                            "THINK: the provider answers again (not answering since {})",
                            rfc3339(since)
                        );
                    }
                    if calls_out {
                        self.plan(now + WATCH_EVERY);
                    }
                }
            }
        }
        silence
    }

    /// Plans a look at `at`, unless one is planned sooner.
    fn plan(&mut self, at: Instant) {
        if self.prober.is_some() && self.look_at.is_none_or(|planned| planned > at) {
            self.look_at = Some(at);
        }
    }

    /// Sends a probe.
    fn probe(&mut self, now: Instant) {
        let Some(prober) = &self.prober else {
            return;
        };
        if prober.jobs.submit(()).is_ok() {
            self.probing = true;
        } else {
            // The thread is gone: try again later rather than never.
            self.plan(now + RECHECK);
        }
    }
}

impl Prober {
    fn start(
        endpoint: Arc<dyn CallTarget>,
        timeout: Duration,
        waker: Arc<Waker>,
    ) -> std::io::Result<Prober> {
        let (outbox, heard) = Outbox::channel(waker);
        let agent = HttpAgent::new(Timeouts {
            // A connection that cannot be made is the calls' to report.
            connect: Some(timeout),
            call: None,
        })
        .statuses_as_answers()
        .user_agent(concat!("agentosd/", env!("CARGO_PKG_VERSION")))
        .build();
        let jobs = Pool::start(
            Named::new("llm-probe"),
            1,
            // One probe at a time: one more waits, the rest are refused.
            Fifo::bounded(1),
            outbox,
            move |(), out: &Outbox<Heard>| out.send(probe(&agent, endpoint.as_ref(), timeout)),
        )?;
        Ok(Prober { jobs, heard })
    }
}

/// Asks the provider for its model list; any answer will do.
fn probe(agent: &ureq::Agent, endpoint: &dyn CallTarget, timeout: Duration) -> Heard {
    let Ok(provider) = endpoint.provider() else {
        return Heard::Nothing;
    };
    let url = provider.probe_url();
    let sent = agent
        .get(&url)
        .config()
        .timeout_send_request(Some(timeout))
        .timeout_recv_response(Some(timeout))
        .build()
        .call();
    use ureq::Error as E;
    use ureq::Timeout as T;
    match sent {
        Ok(_) => Heard::Answer,
        Err(E::Timeout(T::SendRequest | T::RecvResponse | T::Global | T::PerCall)) => {
            Heard::Silence(format!(
                "{} at {} is not answering: it takes connections but sent no reply to a \
                 health probe (GET {}) within {} ms",
                provider.name(),
                host_of(&url),
                url_path(&url),
                timeout.as_millis()
            ))
        }
        Err(E::ConnectionFailed | E::HostNotFound | E::Timeout(_) | E::Io(_)) => {
            Heard::NoConnection
        }
        // A reply the client could not read is still a reply.
        Err(_) => Heard::Answer,
    }
}

/// The path of a URL (what the probe asked for; the host is named apart).
fn url_path(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.find('/').map_or("/", |at| &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::call::Fixed;
    use crate::llm::provider::openai::OpenAi;
    use std::io::Write;
    use std::net::TcpListener;

    /// The local provider at `host`, as the probe sees it.
    fn at(host: &str) -> Fixed {
        Fixed(Arc::new(OpenAi::new(
            "openai",
            &format!("http://{host}/v1"),
            None,
        )))
    }

    fn agent(timeout: Duration) -> ureq::Agent {
        HttpAgent::new(Timeouts {
            connect: Some(timeout),
            call: None,
        })
        .statuses_as_answers()
        .build()
    }

    #[test]
    fn a_held_connection_is_silence_any_status_an_answer_a_closed_port_no_connection() {
        let timeout = Duration::from_millis(300);
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = silent.local_addr().unwrap().to_string();
        let held = std::thread::spawn(move || silent.accept().map(|(stream, _)| stream));
        match probe(&agent(timeout), &at(&host), timeout) {
            Heard::Silence(what) => {
                assert!(what.contains("not answering"), "{what}");
                assert!(
                    what.contains(&host) && what.contains("/v1/models"),
                    "{what}"
                );
            }
            other => panic!("a held connection heard as {other:?}"),
        }
        drop(held.join());

        let answering = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = answering.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut stream, _) = answering.accept().unwrap();
            let _ = stream.write_all(b"HTTP/1.1 401 No\r\ncontent-length: 0\r\n\r\n");
            std::thread::sleep(Duration::from_millis(500));
        });
        assert_eq!(probe(&agent(timeout), &at(&host), timeout), Heard::Answer);

        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = closed.local_addr().unwrap().to_string();
        drop(closed);
        assert_eq!(
            probe(&agent(timeout), &at(&host), timeout),
            Heard::NoConnection
        );
    }

    #[test]
    fn the_probe_names_the_path_it_asked_for() {
        assert_eq!(url_path("http://127.0.0.1:9/v1/models"), "/v1/models");
        assert_eq!(url_path("https://h"), "/");
    }
}
