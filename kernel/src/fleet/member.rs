//! The fleet thread: where this node does its talking to the fleet's
//! database, but for notifications ([`super::listener`]) and sessions'
//! moves ([`super::transfers`]), which have connections of their own. It
//! keeps the node's lease, reconnects when the database comes back, claims
//! fleet tasks while the node has room, records their ends, answers
//! `wait`s, lists the hibernated sessions the fleet keeps, and runs the
//! orders the rest of the kernel sends it, one at a time. The reactor never waits on it: what it has for the
//! kernel goes out as [`FleetEvent`]s, with a wake.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use agentos_primitives::pool::Outbox;
use agentos_proto::payload::{TaskInfo, TaskReply, TaskState};
use agentos_proto::ErrorReply;
use postgres::Client;

use super::allowances;
use super::database;
use super::error::FleetError;
use super::nodes::{self, Figures, Registration};
use super::notes::Notes;
use super::owners;
use super::schema;
use super::sessions::{self, SessionNews};
use super::tasks::{self, Claimed};
use super::waits::{Wait, Waits};
use crate::address::{Answer, ReplyTo};
use crate::config::fleet::FleetConfig;
use crate::identity::Principal;
use crate::permissions::allowance::{Grant, LeaseAsk, LedgerUnreachable};

/// Work for the fleet thread, answered to whoever asked.
pub type Work = Box<dyn FnOnce(&mut Client) -> Result<Answer, FleetError> + Send>;

/// What the kernel asks of the fleet thread.
pub enum Order {
    /// Work whose answer goes to `reply_to`, through the kernel.
    Ask(ReplyTo, Work),
    /// Answer once the task ends or the wait's time is up.
    Wait(Wait),
    /// Lease more of a principal's THINK quota.
    Lease(LeaseAsk),
    /// Notifications came: the rows are looked at ([`Notes`]).
    Woken,
    /// The kernel is stopping: give the lease up, say so, and end.
    Leave(SyncSender<()>),
}

/// A task this node ran has ended.
#[derive(Debug)]
pub struct End {
    pub task_id: String,
    pub state: TaskState,
    pub result: Arc<Vec<u8>>,
}

/// What the fleet thread has for the kernel.
#[derive(Debug)]
pub enum FleetEvent {
    /// A task claimed here, to run as `owner` (looked up on this thread:
    /// a user name may take a directory service to find), or why it
    /// cannot.
    Claimed {
        task: Box<Claimed>,
        owner: Result<Principal, ErrorReply>,
    },
    /// A task run here is no longer this node's (cancelled, or taken by
    /// another): its work should stop.
    Stop(String),
    /// The answer to a request.
    Reply(ReplyTo, Answer),
    /// What the ledger granted of a quota, or why it granted nothing.
    Leased(LeaseAsk, Result<Grant, LedgerUnreachable>),
    /// A [`sessions::SessionJob`]'s answer (from the transfers' thread),
    /// or the fleet's listing of its hibernated sessions.
    Session(SessionNews),
}

/// What the fleet thread shares with the rest of the kernel.
#[derive(Debug, Default)]
pub struct Status {
    /// When the lease was last renewed (or taken): the node is in the
    /// fleet until a lease's length after it.
    pub renewed: Option<Instant>,
    /// Whether the fleet told this node to take no new work.
    pub draining: bool,
    /// The figures the next renewal reports.
    pub figures: Figures,
    /// Why the node is not in the fleet now, if it is not.
    pub trouble: Option<String>,
    /// The fleet's nodes at the last renewal: live, and dead.
    pub nodes: (i64, i64),
    /// The fleet's tasks this node runs.
    pub held: usize,
}

impl Status {
    /// Whether the node is in the fleet now: its last renewal is younger
    /// than `lease` by this node's clock (the database's may already have
    /// ended it: a lease is renewed a third of the way).
    pub fn in_fleet(&self, lease: Duration) -> bool {
        self.trouble.is_none() && self.renewed.is_some_and(|at| at.elapsed() < lease)
    }
}

/// The fleet thread's own state.
pub struct Member {
    config: FleetConfig,
    me: Registration,
    client: Option<Client>,
    status: Arc<Mutex<Status>>,
    events: Outbox<FleetEvent>,
    notes: Arc<Notes>,
    /// When connecting was last tried: at most once a second.
    last_attempt: Option<Instant>,
    /// The tasks this node runs, with their fences.
    held: HashMap<String, i64>,
    /// Ends of held tasks the database could not take yet.
    unrecorded: Vec<End>,
    waits: Waits,
    /// A notification said a task was queued: claim at once.
    claim_now: bool,
    /// A notification named a task this node holds: look at the rows.
    check_held: bool,
    /// A notification named a task waited for.
    check_waits: bool,
    /// The tick came: dead nodes' tasks are looked for.
    look_back: bool,
    /// When the quotas' old windows were last forgotten.
    forgot_allowances: Option<Instant>,
    /// When the hibernated sessions were last listed.
    listed_sessions: Option<Instant>,
}

/// Reconnection is tried at most this often.
const RETRY: Duration = Duration::from_secs(1);
/// Without notifications, queued tasks, held tasks and waits are looked at
/// this often.
const TICK: Duration = Duration::from_secs(1);
/// Without notifications, the hibernated sessions are listed this often.
const LIST_SESSIONS_EVERY: Duration = Duration::from_secs(5);
/// The quotas' windows long over are forgotten at most this often.
const FORGET_ALLOWANCES_EVERY: Duration = Duration::from_secs(60);

impl Member {
    /// A member for `config`, not yet connected.
    pub fn new(
        config: FleetConfig,
        me: Registration,
        status: Arc<Mutex<Status>>,
        events: Outbox<FleetEvent>,
        notes: Arc<Notes>,
    ) -> Member {
        Member {
            config,
            me,
            client: None,
            status,
            events,
            notes,
            last_attempt: None,
            held: HashMap::new(),
            unrecorded: Vec::new(),
            waits: Waits::default(),
            claim_now: false,
            check_held: false,
            check_waits: false,
            look_back: false,
            forgot_allowances: None,
            listed_sessions: None,
        }
    }

    /// Connects, migrates and registers: the node's first join, whose
    /// outcome decides whether the kernel starts.
    pub fn join(&mut self) -> Result<(), FleetError> {
        self.last_attempt = Some(Instant::now());
        self.client = Some(self.register()?);
        self.renewed(false);
        self.list_sessions();
        Ok(())
    }

    /// A connection to the database, its schema this node's, and this
    /// incarnation's name taken (again, after a cut, if no other node took
    /// it meanwhile).
    fn register(&self) -> Result<Client, FleetError> {
        let mut client = database::connect(&self.config, &self.me.node)?;
        schema::migrate(&mut client)?;
        nodes::register(&mut client, &self.me)?;
        Ok(client)
    }

    /// Serves orders, renews the lease and claims tasks until the kernel
    /// drops its end of `orders`; then gives the lease up.
    pub fn run(mut self, orders: Receiver<Order>, ends: Receiver<End>) {
        let mut next_renewal = Instant::now() + self.me.lease / 3;
        let mut next_tick = Instant::now();
        loop {
            let now = Instant::now();
            let wait = [next_renewal, next_tick]
                .into_iter()
                .map(|at| at.saturating_duration_since(now))
                .chain(self.waits.time_to_next(now))
                .min()
                .unwrap_or(TICK);
            match orders.recv_timeout(wait) {
                Ok(Order::Leave(left)) => {
                    self.release();
                    let _ = left.send(());
                    return;
                }
                Ok(order) => self.serve(order),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            for end in ends.try_iter() {
                self.record_end(end);
            }
            let now = Instant::now();
            if now >= next_renewal {
                let renewed = self.renew();
                next_renewal = now + if renewed { self.me.lease / 3 } else { RETRY };
            }
            if now >= next_tick {
                (self.claim_now, self.check_held, self.check_waits) = (true, true, true);
                self.look_back = true;
                next_tick = now + TICK;
            }
            self.look_at_tasks();
            let timed_out = self.waits.timed_out(now);
            if !timed_out.is_empty() {
                self.answer_as_they_are(timed_out);
            }
            if self.client.as_ref().is_some_and(Client::is_closed) {
                self.lost("the connection to the fleet's database closed".into());
            }
        }
        self.release();
    }

    /// Gives the lease up: the fleet takes this node's tasks back now.
    fn release(&mut self) {
        if let Some(client) = self.client.as_mut() {
            match nodes::release(client, &self.me) {
                Ok(()) => log::info!("fleet: node {:?} left the fleet", self.me.node),
                Err(err) => {
                    log::warn!(
                        "fleet: could not give up node {:?}'s lease: {err}",
                        self.me.node
                    )
                }
            }
        }
    }

    fn serve(&mut self, order: Order) {
        match order {
            Order::Ask(reply_to, work) => {
                let answer = self.client().and_then(work);
                let answer = answer.unwrap_or_else(|err| Answer::from(err.into_reply()));
                self.send(FleetEvent::Reply(reply_to, answer));
            }
            Order::Wait(wait) => self.start_wait(wait),
            Order::Lease(ask) => {
                let grant = self.lease(&ask);
                self.send(FleetEvent::Leased(ask, grant));
            }
            Order::Leave(_) => {}
            Order::Woken => {
                let looks = self.notes.take();
                if looks.sessions {
                    self.list_sessions();
                }
                self.claim_now |= looks.queued;
                self.check_held |= looks.cancelled && !self.held.is_empty();
                self.check_waits |= looks.done && !self.waits.is_empty();
            }
        }
    }

    /// Tells the kernel which hibernated sessions the fleet keeps.
    fn list_sessions(&mut self) {
        self.listed_sessions = Some(Instant::now());
        let listed = self.client().and_then(sessions::list);
        self.send(FleetEvent::Session(SessionNews::Listed(listed)));
    }

    /// Leases what `ask` wants of the quotas' ledger; now and then, first
    /// forgets the windows long over.
    fn lease(&mut self, ask: &LeaseAsk) -> Result<Grant, LedgerUnreachable> {
        let forget =
            (self.forgot_allowances).is_none_or(|at| at.elapsed() >= FORGET_ALLOWANCES_EVERY);
        if forget {
            self.forgot_allowances = Some(Instant::now());
            if let Err(err) = self.client().and_then(allowances::forget_old) {
                log::warn!("fleet: could not forget the THINK quotas' old windows: {err}");
            }
        }
        match self
            .client()
            .and_then(|client| allowances::lease(client, ask))
        {
            Ok(grant) => Ok(grant),
            Err(err) => {
                let why = LedgerUnreachable(err.reason());
                self.failed("lease a THINK quota", err);
                Err(why)
            }
        }
    }

    /// Does what notifications or the tick asked for, while in the fleet.
    fn look_at_tasks(&mut self) {
        if !(self.claim_now || self.check_held || self.check_waits) || !self.in_fleet() {
            return;
        }
        if self.client().is_err() {
            return;
        }
        if !self.unrecorded.is_empty() {
            self.record_kept_ends();
        }
        if std::mem::take(&mut self.check_held) && !self.held.is_empty() {
            self.let_go_of_lost_tasks();
        }
        // Tasks of dead nodes, and claims whose answers were lost, are
        // looked for once a tick; a notification only claims.
        if std::mem::take(&mut self.look_back) {
            self.take_back_tasks();
        }
        if std::mem::take(&mut self.claim_now) {
            self.claim();
        }
        if std::mem::take(&mut self.check_waits) && !self.waits.is_empty() {
            self.answer_finished_waits();
        }
    }

    fn claim(&mut self) {
        let room = self.config.max_tasks.saturating_sub(self.held.len());
        if room == 0 || self.status().draining {
            return;
        }
        let me = self.me.clone();
        let held: Vec<String> = self.held.keys().cloned().collect();
        let claimed = self
            .client()
            .and_then(|client| tasks::claim(client, &me, room as i64, &held));
        match claimed {
            Ok(claimed) => {
                for task in claimed {
                    log::info!(
                        "fleet: claimed task {} (fence {})",
                        task.task_id,
                        task.fence
                    );
                    self.held.insert(task.task_id.clone(), task.fence);
                    let owner = owners::local_principal(&task.owner);
                    let task = Box::new(task);
                    self.send(FleetEvent::Claimed { task, owner });
                }
            }
            Err(err) => self.failed("claim tasks", err),
        }
    }

    /// This node's name was taken by another node while it was away: the
    /// tasks it ran are no longer its own, and their work stops.
    fn give_up_held(&mut self) {
        self.unrecorded.clear();
        for task_id in std::mem::take(&mut self.held).into_keys() {
            log::warn!("fleet: task {task_id} is no longer this node's: stopping it");
            self.send(FleetEvent::Stop(task_id));
        }
    }

    /// Takes back the tasks of dead nodes, and this node's own that it
    /// does not hold.
    fn take_back_tasks(&mut self) {
        let me = self.me.clone();
        let held: Vec<String> = self.held.keys().cloned().collect();
        let taken = self.client().and_then(|client| {
            tasks::take_over(client)?;
            tasks::release_strays(client, &me, &held)
        });
        if let Err(err) = taken {
            self.failed("take back tasks", err);
        }
    }

    /// Tasks this node runs that are no longer its own: their work stops.
    fn let_go_of_lost_tasks(&mut self) {
        let held: Vec<(String, i64)> = self.held.iter().map(|(id, f)| (id.clone(), *f)).collect();
        match self
            .client()
            .and_then(|client| tasks::no_longer_held(client, &held))
        {
            Ok(lost) => {
                for task_id in lost {
                    log::info!("fleet: task {task_id} is no longer this node's: stopping it");
                    self.held.remove(&task_id);
                    self.send(FleetEvent::Stop(task_id));
                }
            }
            Err(err) => self.failed("look at its tasks", err),
        }
    }

    /// Records a held task's end; one the database cannot take now is
    /// kept, and recorded once it answers again (if its fence still holds).
    fn record_end(&mut self, end: End) {
        let Some(&fence) = self.held.get(&end.task_id) else {
            return;
        };
        let (task_id, state) = (&end.task_id, end.state);
        match self
            .client()
            .and_then(|client| tasks::finish(client, task_id, fence, state, &end.result))
        {
            Ok(recorded) => {
                if !recorded {
                    log::info!(
                        "fleet: task {task_id}'s end ({}) was not recorded: it is no longer \
                         this node's (fence {fence})",
                        state.as_str()
                    );
                }
                self.held.remove(&end.task_id);
                self.claim_now = true;
            }
            Err(err) if self.client.as_ref().is_none_or(Client::is_closed) => {
                log::warn!("fleet: task {task_id}'s end is kept until the database answers: {err}");
                self.unrecorded.push(end);
                self.lost(err.reason());
            }
            Err(err) => {
                // The database answered, and refused it: trying again would
                // refuse again. The lease decides the task's end.
                log::error!("fleet: task {task_id}'s end cannot be recorded: {err}");
                self.held.remove(&end.task_id);
            }
        }
    }

    /// Ends the database could not take before: recorded now.
    fn record_kept_ends(&mut self) {
        for end in std::mem::take(&mut self.unrecorded) {
            self.record_end(end);
        }
    }

    fn answer_finished_waits(&mut self) {
        let asked = self.waits.asked();
        match self
            .client()
            .and_then(|client| tasks::tasks_of(client, &asked, true))
        {
            Ok(finished) => {
                for (task, owner) in finished {
                    let task_id = task.task_id.clone();
                    let answer = task_answer(Ok(task));
                    for wait in self.waits.take(&task_id, |reach| reach.covers(&owner)) {
                        self.send(FleetEvent::Reply(wait.reply_to, answer.clone()));
                    }
                }
            }
            Err(err) => self.failed("answer waits", err),
        }
    }

    /// A wait for a task that has ended, or whose time is up, is answered
    /// at once; any other is held.
    fn start_wait(&mut self, wait: Wait) {
        let found = self
            .client()
            .and_then(|client| tasks::status(client, &wait.reach, &wait.task_id, true));
        let answer = match found {
            Ok(Some(task)) if !task.state.is_finished() && wait.deadline > Instant::now() => {
                match self.waits.add(wait) {
                    Ok(()) => return,
                    Err(wait) => {
                        let busy = FleetError::Busy(
                            "too many waits for the fleet's tasks; try again later".into(),
                        );
                        self.send(FleetEvent::Reply(
                            wait.reply_to,
                            Answer::from(busy.into_reply()),
                        ));
                        return;
                    }
                }
            }
            Ok(Some(task)) => Ok(task),
            Ok(None) => Err(FleetError::NotFound(wait.task_id.clone())),
            Err(err) => Err(err),
        };
        self.send(FleetEvent::Reply(wait.reply_to, task_answer(answer)));
    }

    /// Waits whose time is up get their tasks as they are now, all read
    /// in one statement: however many time out together, the lease is
    /// renewed in time.
    fn answer_as_they_are(&mut self, waits: Vec<Wait>) {
        let mut ids: Vec<String> = waits.iter().map(|wait| wait.task_id.clone()).collect();
        ids.sort_unstable();
        ids.dedup();
        let found = self
            .client()
            .and_then(|client| tasks::tasks_of(client, &ids, false));
        for wait in waits {
            let task = match &found {
                Ok(found) => found
                    .iter()
                    .find(|(task, owner)| task.task_id == wait.task_id && wait.reach.covers(owner))
                    .map(|(task, _)| task.clone())
                    .ok_or_else(|| FleetError::NotFound(wait.task_id.clone())),
                Err(err) => Err(FleetError::Unavailable(err.reason())),
            };
            self.send(FleetEvent::Reply(wait.reply_to, task_answer(task)));
        }
    }

    /// The database, connecting again if the last try was long enough ago.
    fn client(&mut self) -> Result<&mut Client, FleetError> {
        if self.client.is_none() {
            self.reconnect()?;
        }
        self.client
            .as_mut()
            .ok_or_else(|| FleetError::Unavailable("not connected".into()))
    }

    fn reconnect(&mut self) -> Result<(), FleetError> {
        if self.last_attempt.is_some_and(|at| at.elapsed() < RETRY) {
            return Err(self.trouble());
        }
        self.last_attempt = Some(Instant::now());
        match self.register() {
            Ok(client) => {
                log::info!(
                    "fleet: node {:?} is in the fleet at {}",
                    self.me.node,
                    self.url()
                );
                self.client = Some(client);
                self.renewed(false);
                self.list_sessions();
                // Whatever was said while away is looked at now.
                (self.claim_now, self.check_held, self.check_waits) = (true, true, true);
                Ok(())
            }
            Err(err) => {
                if matches!(err, FleetError::NameTaken { .. }) {
                    self.give_up_held();
                }
                self.lost(err.reason());
                Err(err)
            }
        }
    }

    /// Renews the lease; whether it was.
    fn renew(&mut self) -> bool {
        let figures = Figures {
            load: host_load(),
            ..self.status().figures
        };
        let me = self.me.clone();
        let renewed = self
            .client()
            .and_then(|client| nodes::renew(client, &me, figures));
        match renewed {
            Ok((draining, nodes)) => {
                self.renewed(draining);
                // The hibernated sessions, in case a notification was missed.
                if (self.listed_sessions).is_none_or(|at| at.elapsed() >= LIST_SESSIONS_EVERY) {
                    self.list_sessions();
                }
                let mut status = self.status();
                status.nodes = nodes;
                status.held = self.held.len();
                true
            }
            Err(err) => {
                log::warn!(
                    "fleet: node {:?} could not renew its lease: {err}",
                    self.me.node
                );
                if matches!(err, FleetError::Superseded(_)) {
                    self.give_up_held();
                }
                self.lost(err.reason());
                false
            }
        }
    }

    /// Whether this node's lease is current by its own clock.
    fn in_fleet(&self) -> bool {
        self.status().in_fleet(self.me.lease)
    }

    fn renewed(&self, draining: bool) {
        let mut status = self.status();
        status.renewed = Some(Instant::now());
        status.draining = draining;
        status.trouble = None;
    }

    fn failed(&mut self, what: &str, err: FleetError) {
        log::warn!("fleet: node {:?} could not {what}: {err}", self.me.node);
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.lost(err.reason());
        }
    }

    /// The connection is gone (or the name is): dropped, so the next use
    /// connects again.
    fn lost(&mut self, why: String) {
        if self.client.take().is_some() {
            log::warn!(
                "fleet: node {:?} lost the fleet's database at {}: {why}",
                self.me.node,
                self.url()
            );
        }
        self.status().trouble = Some(why);
    }

    /// The database's URL, its password hidden.
    fn url(&self) -> String {
        self.config
            .database
            .as_ref()
            .map_or_else(String::new, ToString::to_string)
    }

    fn trouble(&self) -> FleetError {
        let why = self.status().trouble.clone();
        FleetError::Unavailable(why.unwrap_or_else(|| "not connected".into()))
    }

    fn send(&self, event: FleetEvent) {
        // The kernel is stopping when no one reads events any more.
        let _ = self.events.send(event);
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Notes a notification's `payload` and wakes the fleet thread unless a
/// wake-up already waits; false once the fleet thread is gone. A full queue
/// drops the wake-up: the fleet thread is busy, and looks again within a
/// second.
pub fn wake(notes: &Notes, orders: &SyncSender<Order>, payload: &str) -> bool {
    if !notes.note(payload) {
        return true;
    }
    match orders.try_send(Order::Woken) {
        Err(TrySendError::Disconnected(_)) => false,
        Err(TrySendError::Full(_)) => {
            notes.unwake();
            true
        }
        Ok(()) => true,
    }
}

/// Sends `order` to the fleet thread without waiting: a full queue (a
/// database that answers slowly) refuses more.
pub fn send(orders: &SyncSender<Order>, order: Order) -> Result<(), FleetError> {
    orders.try_send(order).map_err(|_| {
        FleetError::Unavailable("the fleet's database is not keeping up (its queue is full)".into())
    })
}

/// `wait`'s answer: the task, or why there is none.
fn task_answer(task: Result<TaskInfo, FleetError>) -> Answer {
    match task {
        Ok(task) => Answer::json(&TaskReply {
            success: true,
            task,
        }),
        Err(err) => Answer::from(err.into_reply()),
    }
}

/// The host's one-minute load average, 0 when it cannot be read.
fn host_load() -> f32 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}
