//! N named threads taking jobs from one shared queue, each result sent
//! back through a channel and the event loop woken through its
//! [`mio::Waker`].
//!
//! An event loop must never block, so whatever might (an HTTP call, a name
//! lookup, a filesystem copy) goes to a pool like this one; the loop
//! learns of a result when `poll` returns with the waker's token. Written
//! once, the subtle parts stay right everywhere: a job runs with the queue
//! unlocked, a job that panics costs neither its thread nor the queue's
//! lock, a closed pool lets its threads go, and the wake follows the send
//! (so the loop never wakes to an empty channel and sleeps past a result).
//!
//! What to queue and in what order is the [`Queue`]'s: a [`Fifo`], bounded
//! or not, or a discipline of the caller's (the kernel's workers serve
//! connections in turn). What a job produces is the caller's `work`
//! function's, which sends any number of results through the [`Outbox`].
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use agentos_primitives::pool::{Fifo, Outbox, Pool};
//! use agentos_primitives::threads::Named;
//!
//! let mut poll = mio::Poll::new().unwrap();
//! let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
//! let (outbox, results) = Outbox::channel(waker);
//! let pool = Pool::start(Named::new("doubler"), 2, Fifo::bounded(16), outbox, |n: u64, out| {
//!     out.send(n * 2)
//! })
//! .unwrap();
//! pool.submit(21).unwrap();
//! let mut events = mio::Events::with_capacity(4);
//! poll.poll(&mut events, Some(Duration::from_secs(5))).unwrap();
//! assert_eq!(results.recv().unwrap(), 42);
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use mio::Waker;

use crate::threads::{panic_message, Named};

/// The order jobs wait in, and how many may.
pub trait Queue: Send + 'static {
    /// What waits.
    type Job: Send + 'static;

    /// Queues `job`, or gives it back when there is no room.
    fn push(&mut self, job: Self::Job) -> Result<(), Self::Job>;

    /// The job to run next, if any waits.
    fn pop(&mut self) -> Option<Self::Job>;

    /// How many wait.
    fn len(&self) -> usize;

    /// Whether none waits.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every waiting job unrun.
    fn clear(&mut self);
}

/// First in, first out, with room for `capacity` jobs (or without bound).
pub struct Fifo<J> {
    jobs: VecDeque<J>,
    capacity: Option<usize>,
}

impl<J> Fifo<J> {
    /// Room for `capacity` waiting jobs: past it, a job is refused rather
    /// than queued without bound.
    pub fn bounded(capacity: usize) -> Fifo<J> {
        Fifo {
            jobs: VecDeque::new(),
            capacity: Some(capacity),
        }
    }

    /// Room for any number: for callers that submit no more jobs than
    /// there are threads to take them.
    pub fn unbounded() -> Fifo<J> {
        Fifo {
            jobs: VecDeque::new(),
            capacity: None,
        }
    }
}

impl<J> fmt::Debug for Fifo<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fifo")
            .field("queued", &self.jobs.len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl<J: Send + 'static> Queue for Fifo<J> {
    type Job = J;

    fn push(&mut self, job: J) -> Result<(), J> {
        if self
            .capacity
            .is_some_and(|capacity| self.jobs.len() >= capacity)
        {
            return Err(job);
        }
        self.jobs.push_back(job);
        Ok(())
    }

    fn pop(&mut self) -> Option<J> {
        self.jobs.pop_front()
    }

    fn len(&self) -> usize {
        self.jobs.len()
    }

    fn clear(&mut self) {
        self.jobs.clear();
    }
}

/// Where a pool's results go: a channel, and the waker of the loop that
/// reads it.
pub struct Outbox<R> {
    results: Sender<R>,
    waker: Arc<Waker>,
}

/// The loop reading a pool's results is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed;

impl<R> Outbox<R> {
    /// Results into `results` (which several pools may share), each
    /// followed by a wake of `waker`.
    pub fn new(results: Sender<R>, waker: Arc<Waker>) -> Outbox<R> {
        Outbox { results, waker }
    }

    /// A channel of its own: the outbox, and where its results arrive.
    pub fn channel(waker: Arc<Waker>) -> (Outbox<R>, Receiver<R>) {
        let (results, received) = mpsc::channel();
        (Outbox::new(results, waker), received)
    }

    /// Sends `result`, then wakes the loop. A wake that fails is logged:
    /// the result waits in the channel for the loop's next wake.
    pub fn send(&self, result: R) -> Result<(), Closed> {
        self.results.send(result).map_err(|_| Closed)?;
        if let Err(err) = self.waker.wake() {
            let thread = std::thread::current();
            log::error!(
                "{}: cannot wake the loop after a result: {err}",
                thread.name().unwrap_or("a pool thread")
            );
        }
        Ok(())
    }
}

impl<R> Clone for Outbox<R> {
    fn clone(&self) -> Self {
        Outbox {
            results: self.results.clone(),
            waker: Arc::clone(&self.waker),
        }
    }
}

impl<R> fmt::Debug for Outbox<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox").finish_non_exhaustive()
    }
}

/// Why a job was not queued; it comes back unrun.
pub enum Refused<J> {
    /// The queue has no room.
    Full(J),
    /// The pool was closed (or the loop reading its results is gone).
    Closed(J),
}

impl<J> Refused<J> {
    /// The job, unrun.
    pub fn into_job(self) -> J {
        match self {
            Refused::Full(job) | Refused::Closed(job) => job,
        }
    }
}

impl<J> fmt::Debug for Refused<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refused::Full(_) => "Full",
            Refused::Closed(_) => "Closed",
        })
    }
}

struct State<Q> {
    queue: Q,
    /// No more jobs are taken; the threads end once the queue is empty.
    closed: bool,
}

struct Shared<Q> {
    state: Mutex<State<Q>>,
    available: Condvar,
}

impl<Q> Shared<Q> {
    fn lock(&self) -> MutexGuard<'_, State<Q>> {
        // Jobs run unlocked and under catch_unwind, so only a queue's own
        // method can have panicked while holding the lock: the pool goes on
        // with the queue as that left it rather than stop every thread.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn close(&self) {
        self.lock().closed = true;
        self.available.notify_all();
    }
}

impl<Q: Queue> Shared<Q> {
    fn stop(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.queue.clear();
        drop(state);
        self.available.notify_all();
    }
}

/// Threads fed from one [`Queue`]. Dropping the pool closes it (see
/// [`Pool::close`]); no one waits for its threads, so a job blocked on a
/// slow peer never holds up whoever drops it.
pub struct Pool<Q> {
    shared: Arc<Shared<Q>>,
}

impl<Q: Queue> Pool<Q> {
    /// Starts `count` threads named `{threads' name}-{index}` (with its
    /// stack size), taking jobs from `queue` and running each through
    /// `work`, which sends what it produces through the outbox. A `work`
    /// that finds the outbox closed ends its thread, and the pool takes no
    /// more jobs.
    pub fn start<R, W>(
        threads: Named,
        count: usize,
        queue: Q,
        outbox: Outbox<R>,
        work: W,
    ) -> io::Result<Pool<Q>>
    where
        R: Send + 'static,
        W: Fn(Q::Job, &Outbox<R>) -> Result<(), Closed> + Send + Sync + 'static,
    {
        let pool = Pool {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    queue,
                    closed: false,
                }),
                available: Condvar::new(),
            }),
        };
        let work = Arc::new(work);
        for index in 0..count {
            let (shared, outbox, work) =
                (Arc::clone(&pool.shared), outbox.clone(), Arc::clone(&work));
            // On failure the pool is dropped, which lets the threads
            // already started go.
            threads
                .numbered(index)
                .spawn(move || serve(&shared, &outbox, work.as_ref()))?;
        }
        Ok(pool)
    }

    /// Queues `job` for the next free thread; gives it back if the queue
    /// is full or the pool closed.
    pub fn submit(&self, job: Q::Job) -> Result<(), Refused<Q::Job>> {
        let mut state = self.shared.lock();
        if state.closed {
            return Err(Refused::Closed(job));
        }
        state.queue.push(job).map_err(Refused::Full)?;
        drop(state);
        self.shared.available.notify_one();
        Ok(())
    }

    /// Jobs waiting for a thread.
    pub fn queued(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// Takes no more jobs and drops the queued ones unrun; the threads end
    /// once their current jobs have.
    pub fn stop(&self) {
        self.shared.stop();
    }
}

impl<Q> Pool<Q> {
    /// `look` at the queue, under its lock: to read it or to take jobs
    /// out (a queue's own cancel). Jobs go in through [`Pool::submit`].
    pub fn with_queue<T>(&self, look: impl FnOnce(&mut Q) -> T) -> T {
        look(&mut self.shared.lock().queue)
    }

    /// Takes no more jobs; the threads run what is queued, then end.
    pub fn close(&self) {
        self.shared.close();
    }
}

impl<Q> Drop for Pool<Q> {
    fn drop(&mut self) {
        self.close();
    }
}

impl<Q: Queue> fmt::Debug for Pool<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Pool")
            .field("queued", &state.queue.len())
            .field("closed", &state.closed)
            .finish()
    }
}

/// One thread's life: take a job, run it unlocked, until the pool closes
/// and its queue is empty.
fn serve<Q, R, W>(shared: &Shared<Q>, outbox: &Outbox<R>, work: &W)
where
    Q: Queue,
    W: Fn(Q::Job, &Outbox<R>) -> Result<(), Closed>,
{
    loop {
        let job = {
            let mut state = shared.lock();
            loop {
                if let Some(job) = state.queue.pop() {
                    break job;
                }
                if state.closed {
                    return;
                }
                state = shared
                    .available
                    .wait(state)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        };
        match panic::catch_unwind(AssertUnwindSafe(|| work(job, outbox))) {
            Ok(Ok(())) => {}
            Ok(Err(Closed)) => {
                // No one reads the results: take no more jobs to run.
                shared.stop();
                return;
            }
            Err(payload) => {
                let thread = std::thread::current();
                log::error!(
                    "{}: a job panicked: {}",
                    thread.name().unwrap_or("a pool thread"),
                    panic_message(payload.as_ref())
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const PATIENCE: Duration = Duration::from_secs(5);

    type Job = Box<dyn FnOnce() -> u32 + Send>;

    fn waker() -> (mio::Poll, Arc<Waker>) {
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), mio::Token(7)).unwrap());
        (poll, waker)
    }

    /// A pool of `count` threads running closures, each result sent back.
    fn closures<Q: Queue<Job = Job>>(
        count: usize,
        queue: Q,
    ) -> (Pool<Q>, Receiver<u32>, mio::Poll) {
        let (poll, waker) = waker();
        let (outbox, results) = Outbox::channel(waker);
        let pool = Pool::start(
            Named::new("pool-test"),
            count,
            queue,
            outbox,
            |job: Job, out| out.send(job()),
        )
        .unwrap();
        (pool, results, poll)
    }

    /// A job that waits until `gate` says go, then answers `n`.
    fn gated(n: u32) -> (Job, Sender<()>) {
        let (go, gate) = mpsc::channel::<()>();
        let job: Job = Box::new(move || {
            let _ = gate.recv();
            n
        });
        (job, go)
    }

    fn answer(n: u32) -> Job {
        Box::new(move || n)
    }

    #[test]
    fn each_result_wakes_the_loop_from_a_named_thread() {
        let (poll, waker) = waker();
        let mut poll = poll;
        let (outbox, results) = Outbox::channel(waker);
        let pool = Pool::start(
            Named::new("pool-named").stack_size(128 * 1024),
            3,
            Fifo::unbounded(),
            outbox,
            |n: u32, out| {
                let name = std::thread::current().name().map(str::to_owned);
                out.send((n, name))
            },
        )
        .unwrap();
        for n in 0..6 {
            pool.submit(n).unwrap();
        }
        let mut events = mio::Events::with_capacity(8);
        let mut got = Vec::new();
        while got.len() < 6 {
            poll.poll(&mut events, Some(PATIENCE)).unwrap();
            assert!(events.iter().any(|e| e.token() == mio::Token(7)));
            got.extend(results.try_iter());
        }
        got.sort();
        assert_eq!(
            got.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            (0..6).collect::<Vec<_>>()
        );
        for (_, name) in got {
            let name = name.unwrap();
            assert!(
                ["pool-named-0", "pool-named-1", "pool-named-2"].contains(&name.as_str()),
                "{name}"
            );
        }
    }

    #[test]
    fn a_full_queue_and_a_closed_pool_give_the_job_back() {
        let (pool, _results, _poll) = closures(0, Fifo::bounded(2));
        pool.submit(answer(1)).unwrap();
        pool.submit(answer(2)).unwrap();
        match pool.submit(answer(3)) {
            Err(Refused::Full(job)) => assert_eq!(job(), 3),
            other => panic!("{other:?}"),
        }
        assert_eq!(pool.queued(), 2);
        pool.close();
        match pool.submit(answer(4)) {
            Err(Refused::Closed(job)) => assert_eq!(job(), 4),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_job_that_panics_costs_no_thread() {
        let (pool, results, _poll) = closures(1, Fifo::unbounded());
        pool.submit(Box::new(|| panic!("on purpose"))).unwrap();
        pool.submit(answer(2)).unwrap();
        assert_eq!(results.recv_timeout(PATIENCE), Ok(2));
    }

    #[test]
    fn close_runs_what_is_queued_then_lets_the_threads_go() {
        let (pool, results, _poll) = closures(1, Fifo::unbounded());
        let (first, go) = gated(1);
        pool.submit(first).unwrap();
        pool.submit(answer(2)).unwrap();
        pool.submit(answer(3)).unwrap();
        pool.close();
        go.send(()).unwrap();
        let got: Vec<u32> = results.iter().collect();
        // The iterator ends when the last thread has dropped its outbox.
        assert_eq!(got, vec![1, 2, 3]);
    }

    #[test]
    fn stop_drops_what_is_queued_and_lets_the_threads_go() {
        let (pool, results, _poll) = closures(1, Fifo::unbounded());
        let (first, go) = gated(1);
        pool.submit(first).unwrap();
        pool.submit(answer(2)).unwrap();
        // Wait until the thread holds the first job, so only the second waits.
        while pool.queued() > 1 {
            std::thread::yield_now();
        }
        pool.stop();
        assert_eq!(pool.queued(), 0);
        go.send(()).unwrap();
        let got: Vec<u32> = results.iter().collect();
        assert_eq!(got, vec![1]);
    }

    #[test]
    fn dropping_the_pool_closes_it() {
        let (pool, results, _poll) = closures(2, Fifo::unbounded());
        pool.submit(answer(5)).unwrap();
        drop(pool);
        let got: Vec<u32> = results.iter().collect();
        assert_eq!(got, vec![5]);
    }

    #[test]
    fn a_job_sends_as_many_results_as_it_has_into_a_shared_channel() {
        let (_poll, waker) = waker();
        let (shared, results) = mpsc::channel();
        let start = |name: &str| {
            Pool::start(
                Named::new(name),
                1,
                Fifo::unbounded(),
                Outbox::new(shared.clone(), Arc::clone(&waker)),
                |n: u32, out| (0..n).try_for_each(|i| out.send((n, i))),
            )
            .unwrap()
        };
        let (one, other) = (start("pool-one"), start("pool-other"));
        one.submit(2).unwrap();
        other.submit(0).unwrap();
        other.submit(1).unwrap();
        drop((one, other));
        drop(shared);
        let mut got: Vec<(u32, u32)> = results.iter().collect();
        got.sort();
        assert_eq!(got, vec![(1, 0), (2, 0), (2, 1)]);
    }

    #[test]
    fn when_no_one_reads_the_results_the_pool_takes_no_more_jobs() {
        let (pool, results, _poll) = closures(1, Fifo::unbounded());
        drop(results);
        pool.submit(answer(1)).unwrap();
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            match pool.submit(answer(2)) {
                Err(Refused::Closed(_)) => break,
                _ => assert!(std::time::Instant::now() < deadline, "still taking jobs"),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Last in, first out: a discipline of the caller's.
    struct Lifo(Vec<Job>);

    impl Queue for Lifo {
        type Job = Job;
        fn push(&mut self, job: Job) -> Result<(), Job> {
            self.0.push(job);
            Ok(())
        }
        fn pop(&mut self) -> Option<Job> {
            self.0.pop()
        }
        fn len(&self) -> usize {
            self.0.len()
        }
        fn clear(&mut self) {
            self.0.clear();
        }
    }

    #[test]
    fn jobs_are_taken_in_the_queue_s_order_and_it_can_be_pruned() {
        let (pool, results, _poll) = closures(1, Lifo(Vec::new()));
        let (first, go) = gated(0);
        pool.submit(first).unwrap();
        while pool.queued() > 0 {
            std::thread::yield_now();
        }
        for n in 1..=4 {
            pool.submit(answer(n)).unwrap();
        }
        let pruned = pool.with_queue(|queue| queue.0.remove(0)());
        assert_eq!(pruned, 1);
        pool.close();
        go.send(()).unwrap();
        let got: Vec<u32> = results.iter().collect();
        assert_eq!(got, vec![0, 4, 3, 2]);
    }
}
