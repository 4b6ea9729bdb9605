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

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use agentos_proto::{ErrorCode, ErrorReply};

/// Blocking work: returns the reply payload.
pub type Job = Box<dyn FnOnce() -> Vec<u8> + Send>;

/// The serial of the connection a job is for: a connection's jobs are
/// served in turn with others' and cancelled together when it closes.
pub type ConnectionSerial = u64;

/// A finished job, addressed back to whoever submitted it.
#[derive(Debug)]
pub struct Completion<A> {
    /// The address given to [`WorkerPool::submit`].
    pub address: A,
    /// The reply payload.
    pub payload: Vec<u8>,
}

/// The queue was full; the job comes back unrun.
pub struct QueueFull(pub Job);

impl std::fmt::Debug for QueueFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueueFull")
    }
}

struct Queue<A> {
    per_connection: HashMap<ConnectionSerial, VecDeque<(A, Job)>>,
    /// Owners with queued jobs, in the order they get their next turn.
    turns: VecDeque<ConnectionSerial>,
    queued: usize,
    capacity: usize,
    closed: bool,
}

impl<A> Queue<A> {
    fn push(
        &mut self,
        connection: ConnectionSerial,
        address: A,
        job: Job,
    ) -> Result<(), QueueFull> {
        if self.queued >= self.capacity {
            return Err(QueueFull(job));
        }
        let jobs = self.per_connection.entry(connection).or_default();
        if jobs.is_empty() {
            self.turns.push_back(connection);
        }
        jobs.push_back((address, job));
        self.queued += 1;
        Ok(())
    }

    /// The next job, round-robin across connections.
    fn pop(&mut self) -> Option<(A, Job)> {
        let connection = self.turns.pop_front()?;
        let jobs = self.per_connection.get_mut(&connection)?;
        let next = jobs.pop_front();
        if jobs.is_empty() {
            self.per_connection.remove(&connection);
        } else {
            self.turns.push_back(connection);
        }
        self.queued -= usize::from(next.is_some());
        next
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

struct Shared<A> {
    queue: Mutex<Queue<A>>,
    available: Condvar,
}

impl<A> Shared<A> {
    fn lock(&self) -> MutexGuard<'_, Queue<A>> {
        // A worker that panicked did so outside the lock (jobs run
        // unlocked and under catch_unwind), so the queue is consistent.
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A fixed set of worker threads fed from one bounded, fair queue.
pub struct WorkerPool<A> {
    shared: Arc<Shared<A>>,
    completions: Receiver<Completion<A>>,
}

impl<A> std::fmt::Debug for WorkerPool<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queue = self.shared.lock();
        f.debug_struct("WorkerPool")
            .field("queued", &queue.queued)
            .field("capacity", &queue.capacity)
            .finish()
    }
}

impl<A: Send + 'static> WorkerPool<A> {
    /// Starts `count` workers sharing a queue of `capacity` jobs; each
    /// completion wakes `waker`.
    pub fn start(count: usize, capacity: usize, waker: Arc<mio::Waker>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                per_connection: HashMap::new(),
                turns: VecDeque::new(),
                queued: 0,
                capacity,
                closed: false,
            }),
            available: Condvar::new(),
        });
        let (done_tx, done_rx) = mpsc::channel();
        for index in 0..count {
            let shared = Arc::clone(&shared);
            let done_tx = done_tx.clone();
            let waker = Arc::clone(&waker);
            std::thread::Builder::new()
                .name(format!("agentos-worker-{index}"))
                .stack_size(256 * 1024)
                .spawn(move || work(&shared, &done_tx, &waker))?;
        }
        Ok(WorkerPool {
            shared,
            completions: done_rx,
        })
    }

    /// Queues a job for `connection`; its completion will carry `address`.
    pub fn submit(
        &self,
        connection: ConnectionSerial,
        address: A,
        job: Job,
    ) -> Result<(), QueueFull> {
        self.shared.lock().push(connection, address, job)?;
        self.shared.available.notify_one();
        Ok(())
    }

    /// Jobs waiting for a thread.
    pub fn queued(&self) -> usize {
        self.shared.lock().queued
    }

    /// Drops `connection`'s queued jobs (a job already running still completes).
    /// Returns how many were dropped.
    pub fn cancel(&self, connection: ConnectionSerial) -> usize {
        self.shared.lock().cancel(connection)
    }

    /// Completions that have arrived, without blocking.
    pub fn completed(&self) -> impl Iterator<Item = Completion<A>> + '_ {
        self.completions.try_iter()
    }

    /// Stops the workers: queued jobs are dropped, running ones finish and
    /// their threads exit. Does not wait for them — the daemon is about to
    /// exit, and a job blocked on a slow peer must not hold up shutdown.
    pub fn shutdown(&self) {
        let mut queue = self.shared.lock();
        queue.closed = true;
        queue.per_connection.clear();
        queue.turns.clear();
        queue.queued = 0;
        drop(queue);
        self.shared.available.notify_all();
    }
}

fn work<A>(shared: &Shared<A>, done: &Sender<Completion<A>>, waker: &mio::Waker) {
    loop {
        // Hold the lock only to take one job, never while running it.
        let (address, job) = {
            let mut queue = shared.lock();
            loop {
                if queue.closed {
                    return;
                }
                if let Some(next) = queue.pop() {
                    break next;
                }
                queue = shared
                    .available
                    .wait(queue)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        };
        let payload = catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|_| {
            log::error!("a worker job panicked; answering `internal`");
            ErrorReply::new(
                ErrorCode::Internal,
                "the kernel failed while handling this request; see the kernel log",
            )
            .to_json()
        });
        if done.send(Completion { address, payload }).is_err() {
            return;
        }
        if let Err(err) = waker.wake() {
            log::error!("worker cannot wake the reactor: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        Queue {
            per_connection: HashMap::new(),
            turns: VecDeque::new(),
            queued: 0,
            capacity,
            closed: false,
        }
    }

    #[test]
    fn owners_take_turns() {
        let mut q = queue(100);
        for i in 0..5 {
            q.push(1, i, job(b"")).unwrap();
        }
        q.push(2, 100, job(b"")).unwrap();
        q.push(3, 200, job(b"")).unwrap();
        let order: Vec<u32> = std::iter::from_fn(|| q.pop().map(|(a, _)| a)).collect();
        assert_eq!(order, vec![0, 100, 200, 1, 2, 3, 4]);
        assert_eq!(q.queued, 0);
    }

    #[test]
    fn a_full_queue_refuses_and_cancel_frees_room() {
        let mut q = queue(3);
        q.push(1, 1, job(b"")).unwrap();
        q.push(1, 2, job(b"")).unwrap();
        q.push(2, 3, job(b"")).unwrap();
        assert!(q.push(2, 4, job(b"")).is_err());
        assert_eq!(q.cancel(1), 2);
        assert_eq!(q.cancel(1), 0);
        q.push(2, 4, job(b"")).unwrap();
        let order: Vec<u32> = std::iter::from_fn(|| q.pop().map(|(a, _)| a)).collect();
        assert_eq!(order, vec![3, 4]);
    }
}
