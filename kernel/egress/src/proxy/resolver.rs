//! Name resolution off the event loop: getaddrinfo blocks (for seconds,
//! when a DNS server is slow), so a pool of threads of its own does it,
//! fed by a bounded queue, each answer posted back with a wake of the loop.

use std::io;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use agentos_primitives::pool::{Closed, Fifo, Outbox, Pool, Refused};
use agentos_primitives::threads::Named;
use mio::Waker;

/// How many names may wait for a resolver thread; past it a connection is
/// refused (503) rather than queued without bound.
pub const QUEUED_NAMES: usize = 1024;

/// A name to resolve for connection `key` (whose id is `id`, so a late
/// answer for a closed connection is recognised).
#[derive(Debug)]
pub struct Question {
    pub key: usize,
    pub id: u64,
    pub host: String,
    pub port: u16,
    /// Still wanted: false once its connection has gone.
    pub wanted: Arc<AtomicBool>,
}

/// What a name resolved to, in getaddrinfo's order.
#[derive(Debug)]
pub struct Resolution {
    pub key: usize,
    pub id: u64,
    pub addresses: Result<Vec<IpAddr>, Unresolved>,
}

/// Why a name did not resolve.
#[derive(Debug, thiserror::Error)]
#[error("{host} does not resolve: {error}")]
pub struct Unresolved {
    pub host: String,
    pub error: io::Error,
}

/// The queue to the resolver threads. Dropping it drops the questions
/// still queued and ends the threads, each after the lookup it is in.
#[derive(Debug)]
pub struct Resolver {
    pool: Pool<Fifo<Question>>,
}

impl Resolver {
    /// Starts `threads` resolver threads (`proxy-resolve-N`); their answers
    /// arrive on the receiver, each followed by a wake of `waker`.
    pub fn start(
        threads: usize,
        waker: Arc<Waker>,
    ) -> io::Result<(Resolver, Receiver<Resolution>)> {
        let (outbox, answers) = Outbox::channel(waker);
        let pool = Pool::start(
            Named::new("proxy-resolve"),
            threads,
            Fifo::bounded(QUEUED_NAMES),
            outbox,
            answer,
        )?;
        Ok((Resolver { pool }, answers))
    }

    /// Queues a question; gives it back if the queue is full.
    pub fn ask(&self, question: Question) -> Result<(), Question> {
        self.pool.submit(question).map_err(Refused::into_job)
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.pool.stop();
    }
}

/// Looks `question` up, on a resolver thread, and sends the answer.
fn answer(question: Question, answers: &Outbox<Resolution>) -> Result<(), Closed> {
    // A connection that went while its question waited (closed, timed
    // out) costs no lookup: a sandbox cannot pile up abandoned ones.
    if !question.wanted.load(Ordering::Relaxed) {
        return Ok(());
    }
    let addresses = (question.host.as_str(), question.port)
        .to_socket_addrs()
        .map(|found| found.map(|address| address.ip()).collect::<Vec<_>>())
        .map_err(|error| Unresolved {
            host: question.host.clone(),
            error,
        });
    answers.send(Resolution {
        key: question.key,
        id: question.id,
        addresses,
    })
}
