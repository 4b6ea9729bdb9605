//! Worker threads for blocking work.
//!
//! The reactor thread never blocks; anything that might (HTTP to an LLM,
//! filesystem copies, a deliberately slow diagnostic) runs here. A job is a
//! closure producing a reply payload; its result travels back with the
//! address the reactor gave it, through a channel, and the reactor is woken
//! through its [`mio::Waker`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use agentos_proto::{ErrorCode, ErrorReply};

/// Blocking work: returns the reply payload.
pub type Job = Box<dyn FnOnce() -> Vec<u8> + Send>;

/// A finished job, addressed back to whoever submitted it.
#[derive(Debug)]
pub struct Completion<A> {
    /// The address given to [`WorkerPool::submit`].
    pub address: A,
    /// The reply payload.
    pub payload: Vec<u8>,
}

/// A fixed set of worker threads fed from one queue.
#[derive(Debug)]
pub struct WorkerPool<A> {
    jobs: Option<Sender<(A, Job)>>,
    completions: Receiver<Completion<A>>,
}

impl<A: Send + 'static> WorkerPool<A> {
    /// Starts `count` workers that wake `waker` after each completion.
    pub fn start(count: usize, waker: Arc<mio::Waker>) -> std::io::Result<Self> {
        let (job_tx, job_rx) = mpsc::channel::<(A, Job)>();
        let (done_tx, done_rx) = mpsc::channel();
        let job_rx = Arc::new(Mutex::new(job_rx));
        for index in 0..count {
            let job_rx = Arc::clone(&job_rx);
            let done_tx = done_tx.clone();
            let waker = Arc::clone(&waker);
            std::thread::Builder::new()
                .name(format!("agentos-worker-{index}"))
                .stack_size(256 * 1024)
                .spawn(move || work(&job_rx, &done_tx, &waker))?;
        }
        Ok(WorkerPool {
            jobs: Some(job_tx),
            completions: done_rx,
        })
    }

    /// Queues a job; its completion will carry `address`.
    pub fn submit(&self, address: A, job: Job) {
        if let Some(jobs) = &self.jobs {
            // Fails only when every worker has exited, which happens only
            // after shutdown began; the reply is then moot.
            let _ = jobs.send((address, job));
        }
    }

    /// Completions that have arrived, without blocking.
    pub fn completed(&self) -> impl Iterator<Item = Completion<A>> + '_ {
        self.completions.try_iter()
    }

    /// Stops taking jobs: workers finish what is already queued and exit. Does not wait for them — the daemon is about to
    /// exit, and a job blocked on a slow peer must not hold up shutdown.
    pub fn shutdown(&mut self) {
        self.jobs = None;
    }
}

fn work<A>(jobs: &Mutex<Receiver<(A, Job)>>, done: &Sender<Completion<A>>, waker: &mio::Waker) {
    loop {
        // Hold the lock only to take one job, never while running it.
        let next = match jobs.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        let Ok((address, job)) = next else {
            return;
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

    #[test]
    fn completions_wake_the_poll_and_carry_their_address() {
        let mut poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(7)).unwrap());
        let mut pool = WorkerPool::start(2, waker).unwrap();
        pool.submit(41u32, Box::new(|| b"forty-one".to_vec()));
        pool.submit(42u32, Box::new(|| panic!("boom")));

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
}
