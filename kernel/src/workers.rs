//! Worker threads for blocking work.
//!
//! The reactor thread never blocks; anything that might (HTTP to an LLM,
//! filesystem copies, a deliberately slow diagnostic) runs here. A job is a
//! closure producing a reply payload; its result travels back with the
//! address the reactor gave it, through a channel, and the reactor is woken
//! through its [`mio::Waker`].
//!
//! The queue is bounded (a full queue is the caller's `busy`) and fair: each
//! job belongs to a connection, and workers take jobs from the connections
//! with queued work in turn, so one connection's backlog never delays
//! another's first job by more than one job per connection ahead of it. A
//! connection that closes has its queued jobs dropped unrun.
//!
//! The threads, the lock around the queue and the wake are
//! [`agentos_primitives::pool`]'s; the turns between connections are this
//! file's queue, which the pool takes jobs from.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use agentos_primitives::pool::{self, Outbox, Pool};
use agentos_primitives::threads::Named;
use agentos_proto::{ErrorCode, ErrorReply};

/// Blocking work: returns the reply payload.
pub type Job = Box<dyn FnOnce() -> Vec<u8> + Send>;

/// The serial of the connection a job is for: a connection's jobs are
/// served in turn with others' and cancelled together when it closes.
pub type ConnectionSerial = u64;

/// A worker's stack: jobs call out and wait, they do not recurse deeply.
const STACK_SIZE: usize = 256 * 1024;

/// A finished job, addressed back to whoever submitted it.
#[derive(Debug)]
pub struct Completion<A> {
    /// The address given to [`WorkerPool::submit`].
    pub address: A,
    /// The reply payload.
    pub payload: Vec<u8>,
}

/// The queue was full; the job was dropped unrun.
#[derive(Debug)]
pub struct QueueFull;

/// A job waiting its connection's turn.
struct Queued<A> {
    connection: ConnectionSerial,
    address: A,
    job: Job,
}

impl<A> std::fmt::Debug for Queued<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queued")
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

struct Queue<A> {
    per_connection: HashMap<ConnectionSerial, VecDeque<(A, Job)>>,
    /// Owners with queued jobs, in the order they get their next turn.
    turns: VecDeque<ConnectionSerial>,
    queued: usize,
    capacity: usize,
}

impl<A> Queue<A> {
    fn new(capacity: usize) -> Queue<A> {
        Queue {
            per_connection: HashMap::new(),
            turns: VecDeque::new(),
            queued: 0,
            capacity,
        }
    }

    fn cancel(&mut self, connection: ConnectionSerial) -> usize {
        let dropped = self
            .per_connection
            .remove(&connection)
            .map_or(0, |jobs| jobs.len());
        if dropped > 0 {
            self.turns.retain(|o| *o != connection);
            self.queued -= dropped;
        }
        dropped
    }
}

impl<A: Send + 'static> pool::Queue for Queue<A> {
    type Job = Queued<A>;

    fn push(&mut self, queued: Queued<A>) -> Result<(), Queued<A>> {
        if self.queued >= self.capacity {
            return Err(queued);
        }
        let Queued {
            connection,
            address,
            job,
        } = queued;
        let jobs = self.per_connection.entry(connection).or_default();
        if jobs.is_empty() {
            self.turns.push_back(connection);
        }
        jobs.push_back((address, job));
        self.queued += 1;
        Ok(())
    }

    /// The next job, round-robin across connections.
    fn pop(&mut self) -> Option<Queued<A>> {
        let connection = self.turns.pop_front()?;
        let jobs = self.per_connection.get_mut(&connection)?;
        let next = jobs.pop_front();
        if jobs.is_empty() {
            self.per_connection.remove(&connection);
        } else {
            self.turns.push_back(connection);
        }
        self.queued -= usize::from(next.is_some());
        next.map(|(address, job)| Queued {
            connection,
            address,
            job,
        })
    }

    fn len(&self) -> usize {
        self.queued
    }

    fn clear(&mut self) {
        self.per_connection.clear();
        self.turns.clear();
        self.queued = 0;
    }
}

/// A fixed set of worker threads fed from one bounded, fair queue.
pub struct WorkerPool<A> {
    pool: Pool<Queue<A>>,
    completions: Receiver<Completion<A>>,
}

impl<A> std::fmt::Debug for WorkerPool<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (queued, capacity) = self.pool.with_queue(|queue| (queue.queued, queue.capacity));
        f.debug_struct("WorkerPool")
            .field("queued", &queued)
            .field("capacity", &capacity)
            .finish()
    }
}

impl<A: Send + 'static> WorkerPool<A> {
    /// Starts `count` workers sharing a queue of `capacity` jobs; each
    /// completion wakes `waker`.
    pub fn start(count: usize, capacity: usize, waker: Arc<mio::Waker>) -> std::io::Result<Self> {
        let (outbox, completions) = Outbox::channel(waker);
        let threads = Named::new("agentos-worker").stack_size(STACK_SIZE);
        let pool = Pool::start(threads, count, Queue::new(capacity), outbox, work)?;
        Ok(WorkerPool { pool, completions })
    }

    /// Queues a job for `connection`; its completion will carry `address`.
    pub fn submit(
        &self,
        connection: ConnectionSerial,
        address: A,
        job: Job,
    ) -> Result<(), QueueFull> {
        let queued = Queued {
            connection,
            address,
            job,
        };
        self.pool.submit(queued).map_err(|_| QueueFull)
    }

    /// Jobs waiting for a thread.
    pub fn queued(&self) -> usize {
        self.pool.queued()
    }

    /// Drops `connection`'s queued jobs (a job already running still completes).
    /// Returns how many were dropped.
    pub fn cancel(&self, connection: ConnectionSerial) -> usize {
        self.pool.with_queue(|queue| queue.cancel(connection))
    }

    /// Completions that have arrived, without blocking.
    pub fn completed(&self) -> impl Iterator<Item = Completion<A>> + '_ {
        self.completions.try_iter()
    }

    /// Stops the workers: queued jobs are dropped, running ones finish and
    /// their threads exit. Does not wait for them — the daemon is about to
    /// exit, and a job blocked on a slow peer must not hold up shutdown.
    pub fn shutdown(&self) {
        self.pool.stop();
    }
}

/// Runs one job; one that panics is answered `internal`.
fn work<A>(queued: Queued<A>, outbox: &Outbox<Completion<A>>) -> Result<(), pool::Closed> {
    let payload = catch_unwind(AssertUnwindSafe(queued.job)).unwrap_or_else(|_| {
        log::error!("a worker job panicked; answering `internal`");
        ErrorReply::new(
            ErrorCode::Internal,
            "the kernel failed while handling this request; see the kernel log",
        )
        .to_json()
    });
    outbox.send(Completion {
        address: queued.address,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_primitives::pool::Queue as _;
    use std::time::Duration;

    fn job(reply: &'static [u8]) -> Job {
        Box::new(move || reply.to_vec())
    }

    #[test]
    fn completions_wake_the_poll_and_carry_their_address() {
        let mut poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(7)).unwrap());
        let pool = WorkerPool::start(2, 16, waker).unwrap();
        pool.submit(1, 41u32, job(b"forty-one")).unwrap();
        pool.submit(1, 42u32, Box::new(|| panic!("boom"))).unwrap();

        let mut events = mio::Events::with_capacity(8);
        let mut got = Vec::new();
        while got.len() < 2 {
            poll.poll(&mut events, Some(Duration::from_secs(5)))
                .unwrap();
            assert!(events.iter().any(|e| e.token() == mio::Token(7)));
            got.extend(pool.completed());
        }
        got.sort_by_key(|c| c.address);
        assert_eq!(got[0].payload, b"forty-one");
        let failed: ErrorReply = serde_json::from_slice(&got[1].payload).unwrap();
        assert_eq!(failed.code, ErrorCode::Internal);
        pool.shutdown();
    }

    fn queue(capacity: usize) -> Queue<u32> {
        Queue::new(capacity)
    }

    fn queued(connection: ConnectionSerial, address: u32) -> Queued<u32> {
        Queued {
            connection,
            address,
            job: job(b""),
        }
    }

    #[test]
    fn owners_take_turns() {
        let mut q = queue(100);
        for i in 0..5 {
            q.push(queued(1, i)).unwrap();
        }
        q.push(queued(2, 100)).unwrap();
        q.push(queued(3, 200)).unwrap();
        let order: Vec<u32> = std::iter::from_fn(|| q.pop().map(|next| next.address)).collect();
        assert_eq!(order, vec![0, 100, 200, 1, 2, 3, 4]);
        assert_eq!(q.queued, 0);
    }

    #[test]
    fn a_full_queue_refuses_and_cancel_frees_room() {
        let mut q = queue(3);
        q.push(queued(1, 1)).unwrap();
        q.push(queued(1, 2)).unwrap();
        q.push(queued(2, 3)).unwrap();
        assert!(q.push(queued(2, 4)).is_err());
        assert_eq!(q.cancel(1), 2);
        assert_eq!(q.cancel(1), 0);
        q.push(queued(2, 4)).unwrap();
        let order: Vec<u32> = std::iter::from_fn(|| q.pop().map(|next| next.address)).collect();
        assert_eq!(order, vec![3, 4]);
    }
}
