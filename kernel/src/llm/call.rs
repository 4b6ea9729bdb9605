//! Provider calls, on threads of their own: one per request the kernel
//! lets be in flight at once, all sharing one keep-alive connection pool
//! (`ureq::Agent`). Each call retries on its own — after the provider's
//! hint or with backoff — within the request's deadline and the retry
//! budget, then hands its result to the reactor through a channel and the
//! reactor's waker. Each attempt waiting for the provider's answer is
//! listed in [`Unanswered`], which the health watch ([`super::health`])
//! reads to tell a provider that is slow from one that is not answering.

use std::collections::HashMap;
use std::io::Read;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentos_primitives::http_agent::{HttpAgent, Timeouts};
use agentos_primitives::pool::{Fifo, Outbox, Pool};
use agentos_primitives::threads::Named;
use agentos_proto::ErrorCode;
use mio::Waker;

use super::provider::{Chat, Completion, Failure, HttpRequest, Provider, ReplyHeaders, Retry};
use super::retry::Backoff;

/// Largest provider reply read; a bigger one is an error.
const MAX_REPLY_BYTES: u64 = 16 << 20;
/// Attempts at a provider that cannot be connected to, and the pause
/// between them: down is reported within about a second, not after the
/// minute of polite retries a busy provider gets.
const CONNECT_ATTEMPTS: u32 = 2;
const RECONNECT_DELAY: Duration = Duration::from_millis(750);
/// Longest wait for a connection (name lookup, TCP, TLS): a host that
/// drops packets is unreachable as surely as one that refuses them.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where calls go: a fixed provider, or one that is not always there (the
/// local model server between restarts).
pub trait CallTarget: Send + Sync + std::fmt::Debug {
    /// The provider to call now, or why there is none (a transient
    /// failure is retried).
    fn provider(&self) -> Result<Arc<dyn Provider>, Failure>;

    /// Whether a refused connection means a server the kernel is about to
    /// start again (the local model's, whose supervisor restarts it): then
    /// it is waited for within the request's deadline, not reported
    /// unreachable after two tries.
    fn restarts_itself(&self) -> bool {
        false
    }
}

/// A provider that is always there.
#[derive(Debug)]
pub struct Fixed(pub Arc<dyn Provider>);

impl CallTarget for Fixed {
    fn provider(&self) -> Result<Arc<dyn Provider>, Failure> {
        Ok(self.0.clone())
    }
}

/// A request to make.
#[derive(Debug)]
pub struct CallJob {
    /// The scheduler's ticket, to match the result.
    pub ticket: u64,
    /// What to ask.
    pub chat: Chat,
    /// When the caller stops waiting.
    pub deadline: Instant,
}

/// A finished call.
#[derive(Debug)]
pub struct CallDone {
    /// The job's ticket.
    pub ticket: u64,
    /// The answer, or the last failure.
    pub result: Result<Completion, Failure>,
    /// From sending the first attempt to the end of the last.
    pub latency: Duration,
    /// Attempts made.
    pub attempts: u32,
    /// Retries after the provider said it was rate-limiting (HTTP 429).
    pub rate_limited: u32,
    /// The call failed because no connection could be made to the
    /// provider: HELLO reports it unreachable until a call succeeds.
    pub unreachable: bool,
}

/// Retry limits.
#[derive(Clone, Copy, Debug)]
pub struct RetryBudget {
    /// Total time a call may spend waiting between attempts.
    pub max_wait: Duration,
    /// Longest single attempt: one that hangs is abandoned and retried
    /// while the request's deadline allows.
    pub attempt_timeout: Duration,
}

/// The attempts waiting for the provider's answer, by ticket, with when
/// each was sent.
#[derive(Debug, Default)]
pub struct Unanswered(Mutex<HashMap<u64, Instant>>);

impl Unanswered {
    /// When the attempt that has waited longest was sent, if one waits.
    pub fn oldest(&self) -> Option<Instant> {
        self.lock().values().min().copied()
    }

    /// Lists the attempt of `ticket` until the guard is dropped (a panic
    /// inside the attempt included).
    fn begin(&self, ticket: u64) -> WaitGuard<'_> {
        self.lock().insert(ticket, Instant::now());
        WaitGuard(self, ticket)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        // Only inserts and removes happen under it: a panic cannot leave
        // the map half-changed.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An attempt listed in [`Unanswered`].
struct WaitGuard<'a>(&'a Unanswered, u64);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.0.lock().remove(&self.1);
    }
}

/// The call threads.
#[derive(Debug)]
pub struct Callers {
    /// Dropping it ends the threads once their calls have (they are
    /// detached: a call blocked on a slow provider must not hold up
    /// shutdown).
    jobs: Pool<Fifo<CallJob>>,
    done: Receiver<CallDone>,
    /// The attempts of these threads waiting for an answer.
    waiting: Arc<Unanswered>,
    /// Set when the threads are given up on ([`Callers::replace_threads`]):
    /// their calls then end without another attempt.
    abandoned: Arc<AtomicBool>,
    /// What starting the threads again takes.
    recipe: Recipe,
}

/// What the call threads are started from.
#[derive(Clone, Debug)]
struct Recipe {
    count: usize,
    endpoint: Arc<dyn CallTarget>,
    budget: RetryBudget,
    agent: ureq::Agent,
    outbox: Outbox<CallDone>,
}

impl Callers {
    /// Starts `count` threads calling `endpoint`.
    pub fn start(
        count: usize,
        endpoint: Arc<dyn CallTarget>,
        budget: RetryBudget,
        waker: Arc<Waker>,
    ) -> std::io::Result<Callers> {
        let (outbox, done) = Outbox::channel(waker);
        let agent = HttpAgent::new(Timeouts {
            connect: Some(CONNECT_TIMEOUT),
            // Each attempt has its own, within the request's deadline.
            call: None,
        })
        // A provider's error body says why it refused.
        .statuses_as_answers()
        .idle_connections_per_host(count.max(1))
        .user_agent(concat!("agentosd/", env!("CARGO_PKG_VERSION")))
        .build();
        let recipe = Recipe {
            count,
            endpoint,
            budget,
            agent,
            outbox,
        };
        let (waiting, abandoned) = (Arc::default(), Arc::default());
        let jobs = threads(&recipe, &waiting, &abandoned)?;
        Ok(Callers {
            jobs,
            done,
            waiting,
            abandoned,
            recipe,
        })
    }

    /// Gives up on the threads and their calls (the provider took them and
    /// is not answering): each ends when its attempt does, with no other,
    /// and what it then reports goes to a ticket no longer waited for. A
    /// fresh set takes the next calls, so that a provider answering again
    /// is not kept waiting behind the abandoned ones.
    pub fn replace_threads(&mut self) -> std::io::Result<()> {
        self.abandoned.store(true, Ordering::SeqCst);
        self.jobs.stop();
        let (waiting, abandoned) = (Arc::default(), Arc::default());
        self.jobs = threads(&self.recipe, &waiting, &abandoned)?;
        self.waiting = waiting;
        self.abandoned = abandoned;
        Ok(())
    }

    /// The attempts waiting for the provider's answer.
    pub fn unanswered(&self) -> &Unanswered {
        &self.waiting
    }

    /// Hands a job to the next free thread. The kernel sends no more jobs
    /// than there are threads, so none waits. Gives the job back if the
    /// threads are gone.
    pub fn send(&self, job: CallJob) -> Result<(), Box<CallJob>> {
        self.jobs
            .submit(job)
            .map_err(|refused| Box::new(refused.into_job()))
    }

    /// Calls that have finished since the last look.
    pub fn finished(&self) -> impl Iterator<Item = CallDone> + '_ {
        self.done.try_iter()
    }

    /// Stops the threads once their current calls end; does not wait.
    pub fn stop(&mut self) {
        self.jobs.close();
    }
}

/// Starts the threads of `recipe`, listing their waits in `waiting` and
/// ending their calls early once `abandoned` is set.
fn threads(
    recipe: &Recipe,
    waiting: &Arc<Unanswered>,
    abandoned: &Arc<AtomicBool>,
) -> std::io::Result<Pool<Fifo<CallJob>>> {
    let (endpoint, budget, agent) = (recipe.endpoint.clone(), recipe.budget, recipe.agent.clone());
    let (waiting, abandoned) = (waiting.clone(), abandoned.clone());
    Pool::start(
        Named::new("llm"),
        recipe.count,
        // The kernel sends no more jobs than there are threads.
        Fifo::unbounded(),
        recipe.outbox.clone(),
        move |job: CallJob, done: &Outbox<CallDone>| {
            let ticket = job.ticket;
            let finished = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let watch = Watch {
                    unanswered: &waiting,
                    abandoned: &abandoned,
                };
                call(&agent, endpoint.as_ref(), budget, watch, job)
            }))
            .unwrap_or_else(|_| CallDone {
                ticket,
                result: Err(Failure::fatal(
                    ErrorCode::Internal,
                    "the LLM call failed inside the kernel (see its log)",
                )),
                latency: Duration::ZERO,
                attempts: 1,
                rate_limited: 0,
                unreachable: false,
            });
            done.send(finished)
        },
    )
}

/// What a call thread tells the health watch, and hears from it.
#[derive(Clone, Copy)]
struct Watch<'a> {
    unanswered: &'a Unanswered,
    abandoned: &'a AtomicBool,
}

/// Makes one request, retrying as the provider and the budget allow.
fn call(
    agent: &ureq::Agent,
    endpoint: &dyn CallTarget,
    budget: RetryBudget,
    watch: Watch<'_>,
    job: CallJob,
) -> CallDone {
    let started = Instant::now();
    let mut backoff = Backoff::new();
    let mut waited = Duration::ZERO;
    let mut attempts = 0u32;
    let mut connect_failures = 0u32;
    let mut rate_limited = 0u32;
    let result = loop {
        attempts += 1;
        let answer = {
            let _listed = watch.unanswered.begin(job.ticket);
            attempt(agent, endpoint, &job.chat, job.deadline, budget)
        };
        let failure = match answer {
            Ok(completion) => break Ok(completion),
            Err(failure) => failure,
        };
        if watch.abandoned.load(Ordering::SeqCst) {
            // The caller has had its answer (the provider is not
            // answering); another attempt would only hold this thread.
            break Err(failure);
        }
        let delay = match failure.retry {
            Retry::Never => break Err(failure),
            Retry::After(hint) => backoff.delay(attempts - 1, hint),
            Retry::Reconnect if endpoint.restarts_itself() => backoff.delay(attempts - 1, None),
            Retry::Reconnect => {
                connect_failures += 1;
                if connect_failures >= CONNECT_ATTEMPTS {
                    break Err(gave_up(failure, attempts, "the provider is unreachable"));
                }
                RECONNECT_DELAY
            }
        };
        let now = Instant::now();
        if now + delay >= job.deadline {
            break Err(gave_up(failure, attempts, "the request's deadline is near"));
        }
        if waited + delay > budget.max_wait {
            break Err(gave_up(failure, attempts, "the retry budget is spent"));
        }
        log::debug!(
            "LLM call {}: attempt {attempts} failed ({}); retrying in {delay:?}",
            job.ticket,
            failure.message
        );
        if failure.code == ErrorCode::Busy {
            rate_limited += 1;
        }
        std::thread::sleep(delay);
        waited += delay;
    };
    let unreachable = result.is_err() && connect_failures >= CONNECT_ATTEMPTS;
    CallDone {
        ticket: job.ticket,
        result,
        latency: started.elapsed(),
        attempts,
        rate_limited,
        unreachable,
    }
}

/// The last failure, saying why no retry followed.
fn gave_up(failure: Failure, attempts: u32, why: &str) -> Failure {
    let message = if attempts > 1 {
        format!(
            "{} (gave up after {attempts} attempts: {why})",
            failure.message
        )
    } else {
        format!("{} ({why})", failure.message)
    };
    Failure {
        retry: Retry::Never,
        message,
        ..failure
    }
}

/// One attempt: build, send, read.
fn attempt(
    agent: &ureq::Agent,
    endpoint: &dyn CallTarget,
    chat: &Chat,
    deadline: Instant,
    budget: RetryBudget,
) -> Result<Completion, Failure> {
    let provider = endpoint.provider()?;
    let request = provider.request(chat);
    let timeout = deadline
        .saturating_duration_since(Instant::now())
        .min(budget.attempt_timeout);
    if timeout.is_zero() {
        return Err(Failure::fatal(
            ErrorCode::Timeout,
            "the request's deadline passed before the provider answered",
        ));
    }
    let (status, headers, body) = send(agent, &request, timeout, provider.name())?;
    if (200..300).contains(&status) {
        provider.parse(&body)
    } else {
        Err(provider.failure(status, &headers, &body))
    }
}

/// Sends `request` and reads the whole reply, within `timeout`.
fn send(
    agent: &ureq::Agent,
    request: &HttpRequest,
    timeout: Duration,
    provider: &str,
) -> Result<(u16, ReplyHeaders, Vec<u8>), Failure> {
    let mut builder = agent
        .post(&request.url)
        .header("content-type", "application/json");
    for (name, value) in &request.headers {
        builder = builder.header(*name, value.as_str());
    }
    let mut response = builder
        .config()
        .timeout_global(Some(timeout))
        .build()
        .send(&request.body[..])
        .map_err(|err| transport_failure(provider, host_of(&request.url), &err))?;
    let status = response.status().as_u16();
    let headers = ReplyHeaders(
        response
            .headers()
            .iter()
            .filter_map(|(name, value)| {
                value
                    .to_str()
                    .ok()
                    .map(|v| (name.as_str().to_owned(), v.to_owned()))
            })
            .collect(),
    );
    let mut body = Vec::new();
    response
        .body_mut()
        .with_config()
        .limit(MAX_REPLY_BYTES)
        .reader()
        .read_to_end(&mut body)
        .map_err(|err| {
            Failure::transient(
                ErrorCode::Unavailable,
                None,
                format!("reading {provider}'s reply failed: {err}"),
            )
        })?;
    Ok((status, headers, body))
}

/// A failure below HTTP, naming the host it concerns: no connection at
/// all is [`Failure::unreachable`]; a timeout or trouble on a connection
/// made is worth retrying; a bad URL or TLS setup is not.
fn transport_failure(provider: &str, host: &str, err: &ureq::Error) -> Failure {
    use std::io::ErrorKind as K;
    use ureq::Error as E;
    use ureq::Timeout as T;
    match err {
        E::ConnectionFailed | E::HostNotFound | E::Timeout(T::Connect | T::Resolve) => {
            Failure::unreachable(format!("cannot connect to {provider} at {host}: {err}"))
        }
        E::Io(io)
            if matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::HostUnreachable
                    | K::NetworkUnreachable
                    | K::AddrNotAvailable
                    | K::NotFound
            ) =>
        {
            Failure::unreachable(format!("cannot connect to {provider} at {host}: {err}"))
        }
        E::Timeout(_) => Failure::transient(
            ErrorCode::Timeout,
            None,
            format!("{provider} at {host} did not answer in time"),
        ),
        E::Io(_) | E::Protocol(_) | E::BodyStalled => Failure::transient(
            ErrorCode::Unavailable,
            None,
            format!("lost {provider} at {host}: {err}"),
        ),
        _ => Failure::fatal(
            ErrorCode::Unavailable,
            format!("cannot call {provider} at {host}: {err}"),
        ),
    }
}

/// The `host:port` of a URL, as errors name it (the URL's path may carry
/// a model name, never a key, but the host is what the operator checks).
pub(super) fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split(['/', '?', '#']).next().unwrap_or(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_host_and_port_not_the_path() {
        assert_eq!(host_of("https://api.openai.com/v1/chat"), "api.openai.com");
        assert_eq!(host_of("http://127.0.0.1:9/v1"), "127.0.0.1:9");
        assert_eq!(host_of("http://[::1]:8000?x=1"), "[::1]:8000");
    }

    #[test]
    fn a_refused_connection_is_unreachable_a_dropped_one_is_retried() {
        let refused = ureq::Error::Io(std::io::ErrorKind::ConnectionRefused.into());
        let failure = transport_failure("openai", "127.0.0.1:9", &refused);
        assert_eq!(failure.retry, Retry::Reconnect);
        assert!(
            failure.message.contains("127.0.0.1:9"),
            "{}",
            failure.message
        );
        let reset = ureq::Error::Io(std::io::ErrorKind::ConnectionReset.into());
        assert_eq!(
            transport_failure("openai", "h", &reset).retry,
            Retry::After(None)
        );
    }
}
