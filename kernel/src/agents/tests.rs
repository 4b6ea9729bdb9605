//! The agent state machine, driven through the [`Sandboxes`] seam by a fake
//! runtime: no processes, no root, no sleeps — time is whatever `now` the
//! test passes.

use std::cell::RefCell;
use std::path::Path;
use std::time::{Duration, Instant};

use agentos_proto::payload::{AgentState, KillRequest, SpawnRequest};
use agentos_proto::ErrorCode;
use serde_json::Value;

use super::{Agents, Incarnation, Spawner, Viewer};
use crate::address::{Reply, ReplyTo};
use crate::cgroup::{CgroupStats, Freezer};
use crate::config::Config;
use crate::identity::Identity;
use crate::process::ProcessEnd;
use crate::sandbox::plan::Shape;
use crate::sandbox::runtime::machine::Machine;
use crate::sandbox::runtime::{
    ClaimOrder, Claimed, DoorKey, LaunchError, SandboxEvent, SandboxKey, Sandboxes,
};
use crate::sandbox::spec::Bind;
use crate::sandbox::view::View;
use crate::sandbox::Status;

const PID: i32 = 4242;

/// A runtime that records what it is asked and hands out keys.
#[derive(Debug, Default)]
struct FakeSandboxes {
    host: Machine,
    /// Warm sandboxes left in the pool.
    warm: usize,
    next_key: usize,
    /// Runs waiting for a default sandbox.
    waiting: Vec<Incarnation>,
    /// Runs a sandbox is being prepared for (not the pool's shape).
    preparing: Vec<Incarnation>,
    claims: Vec<(SandboxKey, Incarnation, String)>,
    discarded: Vec<SandboxKey>,
    signals: RefCell<Vec<(SandboxKey, i32)>>,
    closed_doors: Vec<DoorKey>,
    next_door: usize,
    fail_claims: bool,
}

impl FakeSandboxes {
    fn key(&mut self) -> SandboxKey {
        self.next_key += 1;
        SandboxKey::for_tests(self.next_key)
    }

    fn signals(&self) -> Vec<i32> {
        self.signals.borrow().iter().map(|(_, s)| *s).collect()
    }
}

impl Sandboxes<Incarnation> for FakeSandboxes {
    fn machine(&self) -> &Machine {
        &self.host
    }

    fn view(&self, _shape: Shape, _binds: &[Bind]) -> Option<View> {
        None
    }

    fn acquire(&mut self, owner: Incarnation, shape: Shape, _now: Instant) -> Option<SandboxKey> {
        if shape != Shape::DEFAULT {
            self.preparing.push(owner);
            return None;
        }
        if self.warm > 0 {
            self.warm -= 1;
            return Some(self.key());
        }
        self.waiting.push(owner);
        None
    }

    fn withdraw(&mut self, owner: Incarnation) -> bool {
        let before = self.waiting.len();
        self.waiting.retain(|w| *w != owner);
        self.waiting.len() < before
    }

    fn claim(
        &mut self,
        sandbox: SandboxKey,
        owner: Incarnation,
        order: ClaimOrder<'_>,
    ) -> Result<Claimed, LaunchError> {
        self.claims.push((sandbox, owner, order.cgroup_name));
        if self.fail_claims {
            return Err(LaunchError::Gone);
        }
        Ok(Claimed { pid: PID })
    }

    fn discard(&mut self, sandbox: SandboxKey) {
        self.discarded.push(sandbox);
    }

    fn signal(&self, sandbox: SandboxKey, signal: i32) {
        self.signals.borrow_mut().push((sandbox, signal));
    }

    fn usage(&self, _sandbox: SandboxKey) -> Option<CgroupStats> {
        None
    }

    fn freezer(&self, _sandbox: SandboxKey) -> Option<Freezer> {
        None
    }

    fn open_root(&self, _sandbox: SandboxKey) -> std::io::Result<std::os::fd::OwnedFd> {
        Err(std::io::ErrorKind::Unsupported.into())
    }

    fn mount_volumes(
        &self,
        _sandbox: SandboxKey,
        _volumes: &[crate::sandbox::attach::VolumePlace],
    ) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }

    fn listen_inside(&self, _sandbox: SandboxKey) -> std::io::Result<std::net::TcpListener> {
        Err(std::io::ErrorKind::Unsupported.into())
    }

    fn open_door(&mut self, _name: &str, _identity: Identity) -> std::io::Result<DoorKey> {
        self.next_door += 1;
        Ok(DoorKey::for_tests(self.next_door))
    }

    fn door_path(&self, _door: DoorKey) -> Option<&Path> {
        Some(Path::new("/run/agentos-test/door.sock"))
    }

    fn close_door(&mut self, door: DoorKey) {
        self.closed_doors.push(door);
    }
}

/// Agents, a fake runtime, and the replies so far.
struct Bench {
    agents: Agents,
    sandboxes: FakeSandboxes,
    replies: Vec<Reply>,
    start: Instant,
    _logs: tempfile::TempDir,
}

impl Bench {
    fn new(warm: usize) -> Bench {
        let logs = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.agents.log_dir = Some(logs.path().to_path_buf());
        config.agents.retention_secs = 60;
        Bench {
            agents: Agents::new(
                &config,
                std::sync::Arc::new(agentos_egress::Gateway::without_proxy()),
            )
            .unwrap(),
            sandboxes: FakeSandboxes {
                warm,
                ..FakeSandboxes::default()
            },
            replies: Vec::new(),
            start: Instant::now(),
            _logs: logs,
        }
    }

    fn at(&self, secs: u64) -> Instant {
        self.start + Duration::from_secs(secs)
    }

    /// SPAWNs `json` as an operator; returns the new agent's id.
    fn spawn(&mut self, json: &str) -> u32 {
        let request = SpawnRequest::parse(json.as_bytes()).unwrap();
        let id = self.agents.table.next_id();
        self.agents
            .spawn(
                &mut self.sandboxes,
                Spawner::Operator(0),
                request,
                None,
                Vec::new(),
                ReplyTo::Task(1),
            )
            .unwrap();
        id
    }

    fn event(&mut self, event: SandboxEvent<Incarnation>, secs: u64) {
        let now = self.at(secs);
        self.agents
            .on_sandbox(&mut self.sandboxes, &mut self.replies, event, now);
    }

    fn status(&mut self, incarnation: Incarnation, status: Status, secs: u64) {
        self.event(
            SandboxEvent::Status {
                owner: incarnation,
                status,
            },
            secs,
        );
    }

    /// The incarnation's sandbox ended; the init reports the workload's `end`.
    fn ended(&mut self, incarnation: Incarnation, end: Status, oom_killed: bool, secs: u64) {
        let init = match end {
            Status::Signaled(signal) => ProcessEnd::Signaled(signal),
            _ => ProcessEnd::Exited(0),
        };
        self.status(incarnation, end, secs);
        self.event(
            SandboxEvent::Ended {
                owner: incarnation,
                init: Some(init),
                oom_killed,
                usage: CgroupStats::default(),
            },
            secs,
        );
    }

    fn deadlines(&mut self, secs: u64) {
        let now = self.at(secs);
        self.agents.on_deadlines(&mut self.sandboxes, now);
    }

    fn kill(&mut self, id: u32, grace_ms: u64, secs: u64) {
        let json = format!(r#"{{"id":{id},"grace_ms":{grace_ms}}}"#);
        let request = KillRequest::parse(json.as_bytes()).unwrap();
        self.agents
            .kill(
                &mut self.sandboxes,
                &mut self.replies,
                Viewer::Operator,
                &request,
            )
            .unwrap();
        self.deadlines(secs);
    }

    fn state(&self, id: u32) -> Option<AgentState> {
        self.agents.table.get(id).map(|a| a.state)
    }

    fn incarnation(&self, id: u32) -> Incarnation {
        Incarnation {
            agent: id,
            number: self.agents.table.get(id).unwrap().incarnation,
        }
    }

    /// The one reply so far, parsed.
    fn only_reply(&self) -> Value {
        assert_eq!(self.replies.len(), 1, "{:?}", self.replies);
        serde_json::from_slice(&self.replies[0].1.clone().into_json()).unwrap()
    }

    /// Brings a freshly spawned agent's incarnation to `running`.
    fn running(&mut self, id: u32, secs: u64) -> Incarnation {
        let incarnation = self.incarnation(id);
        self.status(incarnation, Status::Ready { pid: 1 }, secs);
        assert_eq!(self.state(id), Some(AgentState::Running));
        incarnation
    }
}

const TRUE: &str = r#"{"name":"w","command":["/bin/true"]}"#;

#[test]
fn a_warm_sandbox_is_claimed_at_once_and_the_spawn_answered_once_the_workload_runs() {
    let mut bench = Bench::new(1);
    let id = bench.spawn(TRUE);
    assert_eq!(bench.state(id), Some(AgentState::Starting));
    let (_, incarnation, cgroup) = &bench.sandboxes.claims[0];
    assert_eq!(
        *incarnation,
        Incarnation {
            agent: id,
            number: 1
        }
    );
    assert_eq!(cgroup, &format!("agent-{id}-1"));
    assert!(
        bench.replies.is_empty(),
        "no reply before the workload runs"
    );
    bench.running(id, 0);
    let reply = bench.only_reply();
    assert_eq!(reply["success"], true);
    assert_eq!(reply["id"], id);
    assert_eq!(reply["pid"], PID);
    assert_eq!(reply["status"], "running");
}

#[test]
fn a_run_waits_for_the_next_sandbox_and_claims_it_when_it_arrives() {
    let mut bench = Bench::new(0);
    let id = bench.spawn(TRUE);
    let incarnation = bench.incarnation(id);
    assert_eq!(bench.sandboxes.waiting, vec![incarnation]);
    assert!(bench.sandboxes.claims.is_empty());
    let sandbox = SandboxKey::for_tests(99);
    bench.event(
        SandboxEvent::Ready {
            owner: incarnation,
            sandbox,
        },
        0,
    );
    assert_eq!(bench.sandboxes.claims[0].0, sandbox);
    bench.running(id, 0);
}

#[test]
fn a_clean_exit_ends_the_agent_which_is_forgotten_after_retention() {
    let mut bench = Bench::new(1);
    let id = bench.spawn(TRUE);
    let incarnation = bench.running(id, 0);
    bench.ended(incarnation, Status::Exited(0), false, 1);
    assert_eq!(bench.state(id), Some(AgentState::Exited));
    let info = bench
        .agents
        .list(&bench.sandboxes, Viewer::Operator, bench.at(1));
    assert_eq!(info[0].exit_code, Some(0));
    assert_eq!(info[0].pid, None);
    assert_eq!(bench.sandboxes.closed_doors.len(), 1, "its socket closes");
    bench.deadlines(30);
    assert_eq!(
        bench.state(id),
        Some(AgentState::Exited),
        "kept for retention"
    );
    bench.deadlines(62);
    assert_eq!(bench.state(id), None, "forgotten after retention");
}

#[test]
fn kill_sends_sigterm_then_sigkill_after_the_grace_and_ends_killed() {
    let mut bench = Bench::new(1);
    let id = bench.spawn(TRUE);
    let incarnation = bench.running(id, 0);
    bench.kill(id, 2000, 0);
    assert_eq!(bench.sandboxes.signals(), vec![libc::SIGTERM]);
    bench.deadlines(1);
    assert_eq!(
        bench.sandboxes.signals(),
        vec![libc::SIGTERM],
        "grace not over"
    );
    bench.deadlines(3);
    assert_eq!(
        bench.sandboxes.signals(),
        vec![libc::SIGTERM, libc::SIGKILL]
    );
    bench.ended(incarnation, Status::Signaled(libc::SIGKILL), false, 3);
    assert_eq!(bench.state(id), Some(AgentState::Killed));
}

#[test]
fn a_kill_with_no_grace_is_sigkill_at_once_and_a_stopped_run_never_restarts() {
    let mut bench = Bench::new(1);
    let id = bench.spawn(r#"{"name":"w","command":["/bin/true"],"restart_policy":"always"}"#);
    let incarnation = bench.running(id, 0);
    bench.kill(id, 0, 0);
    assert_eq!(bench.sandboxes.signals(), vec![libc::SIGKILL]);
    bench.ended(incarnation, Status::Signaled(libc::SIGKILL), false, 0);
    assert_eq!(bench.state(id), Some(AgentState::Killed));
    bench.deadlines(3600);
    assert_eq!(bench.sandboxes.claims.len(), 1, "no second run");
}

#[test]
fn a_memory_kill_is_oom_killed_whether_the_watch_or_the_end_reports_it() {
    let mut bench = Bench::new(2);
    let watched = bench.spawn(r#"{"name":"a","command":["/bin/true"]}"#);
    let incarnation = bench.running(watched, 0);
    bench.event(SandboxEvent::OomKill { owner: incarnation }, 1);
    bench.ended(incarnation, Status::Signaled(libc::SIGKILL), true, 1);
    // The workload died before the watch was read: the end says it all.
    let unwatched = bench.spawn(r#"{"name":"b","command":["/bin/true"]}"#);
    let incarnation = bench.running(unwatched, 1);
    bench.ended(incarnation, Status::Signaled(libc::SIGKILL), true, 2);
    let info = bench
        .agents
        .list(&bench.sandboxes, Viewer::Operator, bench.at(2));
    for (id, agent) in [watched, unwatched].into_iter().zip(&info) {
        assert_eq!(bench.state(id), Some(AgentState::OomKilled));
        assert!(agent.oom_killed);
        assert_eq!(agent.signal, Some(libc::SIGKILL));
    }
}

#[test]
fn a_kill_signal_without_an_oom_kill_is_a_plain_exit() {
    let mut bench = Bench::new(1);
    let id = bench.spawn(TRUE);
    let incarnation = bench.running(id, 0);
    bench.ended(incarnation, Status::Signaled(libc::SIGKILL), false, 1);
    assert_eq!(bench.state(id), Some(AgentState::Exited));
}

#[test]
fn a_failing_agent_restarts_with_backoff_until_its_restarts_are_used_up() {
    let mut bench = Bench::new(3);
    let id = bench.spawn(
        r#"{"name":"w","command":["/bin/true"],"restart_policy":"on-failure","max_restarts":2}"#,
    );
    let first = bench.running(id, 0);
    bench.ended(first, Status::Exited(1), false, 1);
    assert_eq!(bench.state(id), Some(AgentState::Restarting));
    assert_eq!(bench.sandboxes.claims.len(), 1, "waits out its backoff");
    bench.deadlines(3);
    let second = bench.incarnation(id);
    assert_eq!(second.number, 2);
    assert_eq!(bench.sandboxes.claims[1].2, format!("agent-{id}-2"));
    // What the first incarnation's sandbox still says is stale.
    bench.status(first, Status::Exited(7), 3);
    bench.running(id, 3);
    bench.ended(second, Status::Exited(1), false, 4);
    bench.deadlines(10);
    let third = bench.running(id, 10);
    bench.ended(third, Status::Exited(1), false, 11);
    assert_eq!(
        bench.state(id),
        Some(AgentState::Failed),
        "two restarts, then failed"
    );
    let info = bench
        .agents
        .list(&bench.sandboxes, Viewer::Operator, bench.at(11));
    assert_eq!(info[0].restarts, 2);
    assert_eq!(info[0].exit_code, Some(1));
}

#[test]
fn restarts_outside_the_window_do_not_count() {
    let mut bench = Bench::new(3);
    let id = bench.spawn(
        r#"{"name":"w","command":["/bin/true"],"restart_policy":"always","max_restarts":1,"restart_window":10}"#,
    );
    let first = bench.running(id, 0);
    bench.ended(first, Status::Exited(0), false, 0);
    bench.deadlines(2);
    let second = bench.running(id, 2);
    // Twenty seconds on, the first restart is out of the window.
    bench.ended(second, Status::Exited(0), false, 20);
    assert_eq!(bench.state(id), Some(AgentState::Restarting));
    bench.deadlines(22);
    let third = bench.running(id, 22);
    bench.ended(third, Status::Exited(0), false, 23);
    assert_eq!(bench.state(id), Some(AgentState::Failed));
}

#[test]
fn a_sandbox_that_cannot_be_prepared_fails_the_spawn() {
    let mut bench = Bench::new(0);
    let id = bench.spawn(TRUE);
    let incarnation = bench.incarnation(id);
    let error = LaunchError::Start(std::io::Error::other("no room"));
    bench.event(
        SandboxEvent::Failed {
            owner: incarnation,
            error,
        },
        0,
    );
    let reply = bench.only_reply();
    assert_eq!(reply["code"], "internal");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("cannot start the sandbox: no room"),
        "{reply}"
    );
    assert_eq!(bench.state(id), Some(AgentState::Failed));
}

#[test]
fn a_claim_that_fails_fails_the_spawn_once_the_sandbox_is_gone() {
    let mut bench = Bench::new(1);
    bench.sandboxes.fail_claims = true;
    let id = bench.spawn(TRUE);
    let incarnation = bench.incarnation(id);
    assert!(bench.replies.is_empty());
    bench.event(
        SandboxEvent::Ended {
            owner: incarnation,
            init: Some(ProcessEnd::Signaled(libc::SIGKILL)),
            oom_killed: false,
            usage: CgroupStats::default(),
        },
        0,
    );
    let reply = bench.only_reply();
    assert_eq!(reply["code"], "internal");
    assert_eq!(bench.state(id), Some(AgentState::Failed));
}

#[test]
fn an_agent_killed_while_waiting_for_a_sandbox_never_gets_one() {
    let mut bench = Bench::new(0);
    let id = bench.spawn(TRUE);
    bench.kill(id, 1000, 0);
    assert!(
        bench.sandboxes.waiting.is_empty(),
        "withdrawn from the queue"
    );
    let reply = bench.only_reply();
    assert_eq!(
        reply["code"],
        serde_json::to_value(ErrorCode::NotFound).unwrap()
    );
    assert!(reply["error"]
        .as_str()
        .unwrap()
        .contains("killed before it started"));
    assert_eq!(bench.state(id), Some(AgentState::Killed));
    assert!(bench.sandboxes.signals().is_empty());
}

#[test]
fn a_sandbox_arriving_for_a_killed_run_is_discarded() {
    let mut bench = Bench::new(0);
    // With a network, the sandbox is not the pool's shape: one is prepared.
    let id = bench.spawn(r#"{"name":"w","command":["/bin/true"],"network":true}"#);
    let incarnation = bench.incarnation(id);
    assert_eq!(bench.sandboxes.preparing, vec![incarnation]);
    bench.kill(id, 1000, 0);
    assert!(bench.replies.is_empty(), "its sandbox is still on its way");
    let sandbox = SandboxKey::for_tests(5);
    bench.event(
        SandboxEvent::Ready {
            owner: incarnation,
            sandbox,
        },
        0,
    );
    assert_eq!(bench.sandboxes.discarded, vec![sandbox]);
    assert!(bench.sandboxes.claims.is_empty());
    assert!(bench.only_reply()["error"]
        .as_str()
        .unwrap()
        .contains("killed before it started"));
    assert_eq!(bench.state(id), Some(AgentState::Killed));
}

#[test]
fn shutdown_stops_every_live_agent_and_restarts_none() {
    let mut bench = Bench::new(2);
    let a = bench.spawn(r#"{"name":"a","command":["/bin/true"],"restart_policy":"always"}"#);
    let b = bench.spawn(r#"{"name":"b","command":["/bin/true"]}"#);
    let (run_a, run_b) = (bench.running(a, 0), bench.running(b, 0));
    bench.agents.begin_shutdown(
        &mut bench.sandboxes,
        &mut bench.replies,
        Duration::from_secs(1),
    );
    assert_eq!(
        bench.sandboxes.signals(),
        vec![libc::SIGTERM, libc::SIGTERM]
    );
    bench.ended(run_a, Status::Exited(0), false, 0);
    bench.ended(run_b, Status::Exited(0), false, 0);
    assert_eq!(bench.state(a), Some(AgentState::Killed));
    assert_eq!(bench.state(b), Some(AgentState::Killed));
    let spawn = SpawnRequest::parse(TRUE.as_bytes()).unwrap();
    let refused = bench
        .agents
        .spawn(
            &mut bench.sandboxes,
            Spawner::Operator(0),
            spawn,
            None,
            Vec::new(),
            ReplyTo::Task(2),
        )
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::Unavailable);
}

#[test]
fn a_live_name_is_taken_until_its_agent_ends() {
    let mut bench = Bench::new(2);
    let id = bench.spawn(TRUE);
    let incarnation = bench.running(id, 0);
    let again = SpawnRequest::parse(TRUE.as_bytes()).unwrap();
    let refused = bench
        .agents
        .spawn(
            &mut bench.sandboxes,
            Spawner::Operator(0),
            again,
            None,
            Vec::new(),
            ReplyTo::Task(2),
        )
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::AlreadyExists);
    bench.ended(incarnation, Status::Exited(0), false, 1);
    bench.spawn(TRUE);
}

/// A KILL request with `extra` fields for agent `id`.
fn kill_request(id: u32, extra: &str) -> KillRequest {
    KillRequest::parse(format!(r#"{{"id":{id},"grace_ms":0{extra}}}"#).as_bytes()).unwrap()
}

/// An operator's KILL `restart` of agent `id`: how it went.
fn restart(bench: &mut Bench, id: u32) -> super::Restarted {
    let request = kill_request(id, r#","restart":true"#);
    let (restarted, how) = bench
        .agents
        .restart(
            &mut bench.sandboxes,
            &mut bench.replies,
            Viewer::Operator,
            &request,
        )
        .unwrap();
    assert_eq!(restarted, id);
    how
}

#[test]
fn restart_stops_the_live_incarnation_then_starts_the_next_under_the_same_id() {
    let mut bench = Bench::new(2);
    let id = bench.spawn(TRUE);
    let first = bench.running(id, 0);
    assert_eq!(restart(&mut bench, id), super::Restarted::AfterStop);
    assert_eq!(bench.sandboxes.signals(), vec![libc::SIGKILL]);
    bench.ended(first, Status::Signaled(libc::SIGKILL), false, 1);
    assert_eq!(bench.incarnation(id).number, 2, "the next incarnation");
    bench.running(id, 1);
    assert_eq!(bench.agents.table.get(id).unwrap().restarts.total, 1);
    assert!(bench.sandboxes.closed_doors.is_empty(), "its socket stays");
}

#[test]
fn an_ended_agent_is_restarted_or_removed_but_a_live_one_is_not_removed() {
    let mut bench = Bench::new(2);
    let id = bench.spawn(TRUE);
    let incarnation = bench.running(id, 0);
    let remove = kill_request(id, r#","remove":true"#);
    let refused = bench.agents.remove(Viewer::Operator, &remove).unwrap_err();
    assert_eq!(refused.code, ErrorCode::BadRequest);
    assert!(refused.error.contains("still running"), "{}", refused.error);
    bench.ended(incarnation, Status::Exited(0), false, 1);
    assert_eq!(restart(&mut bench, id), super::Restarted::FromEnded);
    let second = bench.running(id, 2);
    bench.ended(second, Status::Exited(0), false, 3);
    bench.deadlines(62);
    assert_eq!(
        bench.state(id),
        Some(AgentState::Exited),
        "the first end's retention no longer counts"
    );
    assert_eq!(bench.agents.remove(Viewer::Operator, &remove).unwrap(), id);
    assert_eq!(bench.state(id), None);
    let gone = bench.agents.remove(Viewer::Operator, &remove).unwrap_err();
    assert_eq!(gone.code, ErrorCode::NotFound);
}

#[test]
fn a_restart_before_the_first_start_leaves_the_spawn_waiting_for_the_next() {
    let mut bench = Bench::new(0);
    let id = bench.spawn(TRUE);
    assert_eq!(restart(&mut bench, id), super::Restarted::AfterStop);
    assert!(bench.replies.is_empty(), "the SPAWN still waits");
    let next = bench.incarnation(id);
    assert_eq!(
        (next.number, bench.sandboxes.waiting.clone()),
        (2, vec![next])
    );
    let sandbox = SandboxKey::for_tests(7);
    bench.event(
        SandboxEvent::Ready {
            owner: next,
            sandbox,
        },
        0,
    );
    bench.running(id, 0);
    assert_eq!(bench.only_reply()["success"], true);
}
