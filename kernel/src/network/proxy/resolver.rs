//! Name resolution off the event loop: getaddrinfo blocks (for seconds,
//! when a DNS server is slow), so a few threads of its own do it, fed by a
//! bounded queue, and post each answer back with a wake of the loop.

use std::net::{IpAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread;

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
pub struct Answer {
    pub key: usize,
    pub id: u64,
    pub addresses: Result<Vec<IpAddr>, String>,
}

/// The queue to the resolver threads. Dropping it ends them (each after
/// the lookup it is in).
#[derive(Debug)]
pub struct Resolver {
    questions: SyncSender<Question>,
}

impl Resolver {
    /// Starts `threads` resolver threads answering on `answers`.
    pub fn start(
        threads: usize,
        answers: Sender<Answer>,
        waker: Arc<Waker>,
    ) -> std::io::Result<Resolver> {
        let (questions, queue) = mpsc::sync_channel(QUEUED_NAMES);
        let queue = Arc::new(Mutex::new(queue));
        for index in 0..threads {
            let (queue, answers, waker) = (queue.clone(), answers.clone(), waker.clone());
            thread::Builder::new()
                .name(format!("proxy-resolve-{index}"))
                .spawn(move || serve(&queue, &answers, &waker))?;
        }
        Ok(Resolver { questions })
    }

    /// Queues a question; gives it back if the queue is full.
    pub fn ask(&self, question: Question) -> Result<(), Question> {
        match self.questions.try_send(question) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(question) | TrySendError::Disconnected(question)) => {
                Err(question)
            }
        }
    }
}

fn serve(queue: &Mutex<Receiver<Question>>, answers: &Sender<Answer>, waker: &Waker) {
    loop {
        // The lock is held only while waiting for the next question.
        let question = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        let Ok(question) = question else { return };
        // A connection that went while its question waited (closed, timed
        // out) costs no lookup: a sandbox cannot pile up abandoned ones.
        if !question.wanted.load(Ordering::Relaxed) {
            continue;
        }
        let addresses = (question.host.as_str(), question.port)
            .to_socket_addrs()
            .map(|found| found.map(|address| address.ip()).collect::<Vec<_>>())
            .map_err(|e| format!("{} does not resolve: {e}", question.host));
        let answer = Answer {
            key: question.key,
            id: question.id,
            addresses,
        };
        if answers.send(answer).is_err() || waker.wake().is_err() {
            return;
        }
    }
}
