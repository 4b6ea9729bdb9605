//! Keeps one of the kernel's own long-running children alive: the local
//! model server, and each MCP tool server.
//!
//! A [`Supervisor`] runs a thread that starts the child a [`Service`]
//! describes, lets the service make it ready, waits for it to end and
//! starts it again after a delay that grows while its incarnations keep
//! ending early
//! ([`Backoff`]). [`Supervisor::stop`] tells the child to go and keeps it
//! from coming back.
//!
//! The child is signalled by pid — with its process group, when it leads
//! one, so what it started goes with it — which is safe only while the pid
//! is still its own: the supervisor waits for the child's end without
//! reaping it, ends what is left of its group, forgets the pid, and only
//! then reaps it, so nothing ever signals a pid (or group) the system has
//! given to someone else.

use std::io;
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;

/// What to supervise: how to start one incarnation of the child and what to do
/// around it. Its methods run on the supervisor's thread.
pub trait Service: Send + 'static {
    /// Why a started child will not serve ([`Service::started`]); logged
    /// after the service's name (`mcp-fs has no pipes; stopping it`).
    type ReadyError: std::error::Error;

    /// A short name, for the supervisor's thread and log lines
    /// (`llm-local`).
    fn name(&self) -> &str;

    /// Starts incarnation number `incarnation` (1 first) of the child — in a process group
    /// of its own, if whatever it starts should end with it. The number is
    /// what [`Supervisor::restart`] takes.
    fn spawn(&mut self, incarnation: u64) -> io::Result<Child>;

    /// Makes the started child ready to serve (hands it what it needs on
    /// its pipes, waits for it to say it is up). The child may already be
    /// told to stop meanwhile, which ends it and so this wait too. An
    /// error says, for the log, why it will not serve: the supervisor then
    /// stops it, and starts it again later.
    ///
    /// Whatever is left of the child's stdin stays open until the child
    /// has ended: closing it is how some children are told to go.
    fn started(&mut self, child: &mut Child) -> Result<(), Self::ReadyError>;

    /// The incarnation has ended with `status` (`None`: the child could not
    /// be started at all, or not waited for); it is started again after the
    /// backoff delay unless the supervisor stops.
    fn ended(&mut self, status: Option<ExitStatus>);

    /// The supervisor has stopped for good: no incarnation follows.
    fn stopped(&mut self);
}

/// How long to wait before starting a child again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first incarnation that ends early.
    pub first: Duration,
    /// The longest delay: it doubles per incarnation that ends early, up to
    /// this.
    pub max: Duration,
    /// An incarnation at least this long was healthy: the delay starts over.
    pub healthy: Duration,
}

impl Backoff {
    /// The delay before the next incarnation, after one that lasted `ran`, when the
    /// delay before it was `previous` (`None`: there was none).
    pub fn delay(&self, previous: Option<Duration>, ran: Duration) -> Duration {
        match previous {
            Some(previous) if ran < self.healthy => (previous * 2).min(self.max),
            _ => self.first,
        }
    }
}

/// A supervised child: restarted when it ends, until stopped.
#[derive(Debug)]
pub struct Supervisor {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    control: Mutex<Control>,
    /// Wakes the supervisor's thread from its backoff delay.
    stopping: Condvar,
}

/// What `stop` and the supervisor's thread share, under one lock so a
/// stop can never miss a child that is just starting.
#[derive(Debug, Default)]
struct Control {
    stop: bool,
    /// The supervisor's thread is done: its child has ended and been
    /// reaped, and none follows.
    finished: bool,
    /// The running child's pid, until it is about to be reaped.
    child: Option<Pid>,
    /// The number of the incarnation started last.
    incarnation: u64,
}

impl Supervisor {
    /// Starts the supervisor's thread, which starts the service's child.
    pub fn start<S: Service>(mut service: S, backoff: Backoff) -> io::Result<Supervisor> {
        let shared = Arc::new(Shared {
            control: Mutex::new(Control::default()),
            stopping: Condvar::new(),
        });
        let supervising = shared.clone();
        let name = service.name().to_owned();
        agentos_primitives::threads::spawn(name, move || {
            supervise(&supervising, &mut service, backoff)
        })?;
        Ok(Supervisor { shared })
    }

    /// Stops the child (SIGTERM) and keeps it stopped; does not wait. The
    /// service's `stopped` follows once the child has ended.
    pub fn stop(&self) {
        let mut control = lock(&self.shared.control);
        control.stop = true;
        if let Some(pid) = control.child {
            signal_run(pid, Signal::SIGTERM);
        }
        drop(control);
        self.shared.stopping.notify_all();
    }
}

impl Supervisor {
    /// Waits up to `timeout` for the supervisor to finish after [`stop`]
    /// (its child ended and reaped); returns whether it has.
    ///
    /// [`stop`]: Supervisor::stop
    pub fn wait_finished(&self, timeout: Duration) -> bool {
        let control = lock(&self.shared.control);
        let (control, _) = self
            .shared
            .stopping
            .wait_timeout_while(control, timeout, |control| !control.finished)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        control.finished
    }

    /// Kills incarnation number `incarnation` of the child (SIGKILL), if it is the one
    /// running: unless the supervisor is stopping, the child is started
    /// again after the backoff delay, as after any end. For an incarnation that is
    /// alive but of no use (it stopped answering), or that ignores being
    /// told to stop. A later incarnation is never touched.
    pub fn restart(&self, incarnation: u64) {
        let control = lock(&self.shared.control);
        if control.incarnation == incarnation {
            if let Some(pid) = control.child {
                signal_run(pid, Signal::SIGKILL);
            }
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock(mutex: &Mutex<Control>) -> MutexGuard<'_, Control> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The supervisor's thread: starts the child again and again until stopped.
fn supervise(shared: &Shared, service: &mut impl Service, backoff: Backoff) {
    let mut delay = None;
    loop {
        if lock(&shared.control).stop {
            break;
        }
        let started = Instant::now();
        let status = match run_once(shared, service) {
            Ok(status) => {
                log::warn!("{} ended ({status})", service.name());
                Some(status)
            }
            Err(err) => {
                log::error!("{} failed: {err}", service.name());
                None
            }
        };
        service.ended(status);
        let wait = backoff.delay(delay, started.elapsed());
        delay = Some(wait);
        let control = lock(&shared.control);
        if control.stop {
            break;
        }
        log::info!("restarting {} in {wait:?}", service.name());
        let (control, _) = shared
            .stopping
            .wait_timeout_while(control, wait, |control| !control.stop)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if control.stop {
            break;
        }
    }
    service.stopped();
    lock(&shared.control).finished = true;
    shared.stopping.notify_all();
}

/// Starts the child, lets the service make it ready, and waits for it to
/// end; returns how it ended.
fn run_once(shared: &Shared, service: &mut impl Service) -> io::Result<ExitStatus> {
    let incarnation = {
        let mut control = lock(&shared.control);
        control.incarnation += 1;
        control.incarnation
    };
    let mut child = service.spawn(incarnation)?;
    let pid = Pid::from_raw(child.id() as i32);
    let stopping = {
        let mut control = lock(&shared.control);
        control.child = Some(pid);
        control.stop
    };
    if stopping {
        // `stop` came before the pid was known to it.
        signal_run(pid, Signal::SIGTERM);
    } else if let Err(why) = service.started(&mut child) {
        log::warn!("{} {why}; stopping it", service.name());
        signal_run(pid, Signal::SIGTERM);
    }
    // Its stdin stays open while we wait (`Child::wait` would close it).
    let lifeline = child.stdin.take();
    // Wait without reaping first, and forget the pid before reaping it, so
    // `stop` can never signal a pid the system has given to someone else.
    let ended = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
    loop {
        match waitid(Id::Pid(pid), ended) {
            Err(Errno::EINTR) => continue,
            Err(err) => return Err(err.into()),
            Ok(_) => break,
        }
    }
    // What it started ends with it (its group's id is still reserved: the
    // leader is not reaped yet).
    let _ = kill(Pid::from_raw(-pid.as_raw()), Signal::SIGKILL);
    lock(&shared.control).child = None;
    let status = child.wait()?;
    drop(lifeline);
    Ok(status)
}

/// Signals the child and, when it leads a process group, the whole group.
/// The pid is our own unreaped child's, so neither can have been reused;
/// an error means it is already gone.
fn signal_run(pid: Pid, signal: Signal) {
    if kill(Pid::from_raw(-pid.as_raw()), signal).is_err() {
        let _ = kill(pid, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::sync::mpsc::{channel, Receiver, Sender};

    /// Long enough for any event a test waits for; tests end far sooner.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// What the scripted service reports, with when it happened.
    #[derive(Debug)]
    enum Event {
        Spawned(Instant),
        Started,
        Ended(Instant),
        Stopped,
    }

    /// Runs each shell command of `runs` in turn, the last one for ever
    /// after, and reports every step.
    struct Script {
        runs: Vec<&'static str>,
        spawned: usize,
        events: Sender<Event>,
    }

    impl Service for Script {
        type ReadyError = std::convert::Infallible;

        fn name(&self) -> &str {
            "test-script"
        }

        fn spawn(&mut self, _incarnation: u64) -> io::Result<Child> {
            let run = self.runs[self.spawned.min(self.runs.len() - 1)];
            self.spawned += 1;
            let _ = self.events.send(Event::Spawned(Instant::now()));
            Command::new("/bin/sh")
                .args(["-c", run])
                .stdin(Stdio::null())
                .spawn()
        }

        fn started(&mut self, _child: &mut Child) -> Result<(), Self::ReadyError> {
            let _ = self.events.send(Event::Started);
            Ok(())
        }

        fn ended(&mut self, _status: Option<ExitStatus>) {
            let _ = self.events.send(Event::Ended(Instant::now()));
        }

        fn stopped(&mut self) {
            let _ = self.events.send(Event::Stopped);
        }
    }

    fn supervise(runs: &[&'static str], backoff: Backoff) -> (Supervisor, Receiver<Event>) {
        let (events, received) = channel();
        let script = Script {
            runs: runs.to_vec(),
            spawned: 0,
            events,
        };
        let supervisor = Supervisor::start(script, backoff).expect("the thread starts");
        (supervisor, received)
    }

    fn next(events: &Receiver<Event>) -> Event {
        events
            .recv_timeout(PATIENCE)
            .expect("the supervisor goes on")
    }

    fn millis(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn the_delay_doubles_up_to_its_cap_and_starts_over_after_a_healthy_run() {
        let backoff = Backoff {
            first: millis(1),
            max: millis(4),
            healthy: millis(100),
        };
        let early = millis(10);
        let first = backoff.delay(None, early);
        let second = backoff.delay(Some(first), early);
        let third = backoff.delay(Some(second), early);
        let fourth = backoff.delay(Some(third), early);
        assert_eq!(
            [first, second, third, fourth],
            [millis(1), millis(2), millis(4), millis(4)]
        );
        assert_eq!(backoff.delay(Some(fourth), millis(100)), millis(1));
    }

    #[test]
    fn a_child_that_keeps_failing_is_restarted() {
        let backoff = Backoff {
            first: millis(1),
            max: millis(4),
            healthy: Duration::from_secs(3600),
        };
        let (supervisor, events) = supervise(&["exit 3"], backoff);
        let mut spawned = 0;
        while spawned < 4 {
            if let Event::Spawned(_) = next(&events) {
                spawned += 1;
            }
        }
        supervisor.stop();
        while !matches!(next(&events), Event::Stopped) {}
    }

    #[test]
    fn stop_ends_a_running_child_and_no_restart_follows() {
        let backoff = Backoff {
            first: millis(1),
            max: millis(1),
            healthy: millis(1),
        };
        let (supervisor, events) = supervise(&["exec sleep 30"], backoff);
        assert!(matches!(next(&events), Event::Spawned(_)));
        assert!(matches!(next(&events), Event::Started));
        let stopped_at = Instant::now();
        supervisor.stop();
        assert!(matches!(next(&events), Event::Ended(_)));
        assert!(matches!(next(&events), Event::Stopped));
        assert!(supervisor.wait_finished(PATIENCE));
        assert!(stopped_at.elapsed() < Duration::from_secs(5));
        // The thread has finished: nothing else will ever be reported.
        assert!(events.recv().is_err());
    }

    #[test]
    fn a_healthy_run_resets_the_delay() {
        // Four early ends make the next delay 160 ms; the healthy incarnation after
        // them brings it back to 10 ms.
        let backoff = Backoff {
            first: millis(10),
            max: Duration::from_secs(10),
            healthy: millis(50),
        };
        let runs = [
            "exit 3",
            "exit 3",
            "exit 3",
            "exit 3",
            "sleep 0.1",
            "exit 3",
        ];
        let (supervisor, events) = supervise(&runs, backoff);
        let mut spawns = Vec::new();
        let mut ends = Vec::new();
        while spawns.len() < runs.len() {
            match next(&events) {
                Event::Spawned(at) => spawns.push(at),
                Event::Ended(at) => ends.push(at),
                _ => {}
            }
        }
        supervisor.stop();
        let after_healthy = spawns[5].duration_since(ends[4]);
        assert!(
            after_healthy < millis(160),
            "restarted {after_healthy:?} after a healthy run"
        );
    }
}
