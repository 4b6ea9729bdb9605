//! Owners across kernels: an operator's tasks are theirs in every kernel;
//! an agent's or a run's end with it, and what is left of an earlier
//! kernel's is reached by operators, who see its owner by number alone.

use crate::tasks::tool_menu::ToolMenu;
use std::time::Instant;

use agentos_proto::payload::{PrincipalInfo, StoppedResult, TaskList, TaskState};
use agentos_proto::ErrorCode;

use super::fake::FakeStore;
use super::{dispatch, save, started, state, tasks, AGENT, BOOT, OPERATOR};
use crate::config::tasks::TasksConfig;
use crate::identity::Principal;
use crate::tasks::owner::OwnerKey;
use crate::tasks::store::seam::Write;
use crate::tasks::store::{Loaded, RowError, StoredTask};
use crate::tasks::{CancelledWork, Reach, Tasks, WorkRequest};

/// An earlier kernel's boot number.
const EARLIER: u64 = 0xea71;

fn record(id: &str, seq: u64, owner: Principal, boot: u64, state: &str) -> StoredTask {
    StoredTask {
        owner: OwnerKey::new(owner, boot),
        request: r#"{"code":"print(1)"}"#.into(),
        ..StoredTask::for_tests(id, seq, state)
    }
}

fn reopened(loaded: Loaded) -> Tasks<FakeStore> {
    Tasks::new(
        FakeStore::default(),
        loaded,
        &TasksConfig::default(),
        BOOT,
        Instant::now(),
    )
}

#[test]
fn an_operators_queued_task_runs_again_and_an_earlier_agents_ends_interrupted() {
    let mut tasks = reopened(Loaded {
        records: vec![
            record("t-op", 1, OPERATOR, EARLIER, "queued"),
            record("t-agent", 2, AGENT, EARLIER, "queued"),
        ],
        unreadable: Vec::new(),
    });
    assert_eq!(state(&tasks, "t-agent"), TaskState::Interrupted);
    let Some(Write::Finished { id, result, .. }) = tasks.store().writes.first() else {
        panic!("{:?}", tasks.store().changes());
    };
    assert_eq!(id, "t-agent");
    let interrupted = StoppedResult::interrupted("its agent ended with the kernel", "");
    assert_eq!(result.as_slice(), serde_json::to_vec(&interrupted).unwrap());
    let starts = tasks.startable(&ToolMenu::empty());
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0].owner, OPERATOR);
    assert!(matches!(starts[0].work, Ok(WorkRequest::Exec(_))));
    assert_eq!(state(&tasks, "t-op"), TaskState::Running);
}

#[test]
fn an_earlier_kernels_agent_task_is_an_operators_to_reach_and_named_by_number_alone() {
    let mut tasks = reopened(Loaded {
        records: vec![record("t-old", 1, AGENT, EARLIER, "completed")],
        unreadable: Vec::new(),
    });
    let (new, _) = started(&mut tasks, AGENT, "print(2)");
    // This kernel's agent 7 is another agent: the old task is not its.
    let own = tasks.status(Reach::Own(AGENT), "t-old").unwrap_err();
    assert_eq!(own.code, ErrorCode::NotFound);
    let mine = tasks
        .list(Reach::Own(AGENT), &TaskList::default(), None)
        .unwrap();
    let ids: Vec<&str> = mine.tasks.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(ids, [new.as_str()]);
    // An operator reaches it, and sees whose it was by number only.
    assert_eq!(state(&tasks, "t-old"), TaskState::Completed);
    let describe = |principal| match principal {
        Principal::Agent { id } => PrincipalInfo::Agent {
            id,
            name: Some("worker1".into()),
        },
        Principal::Run { .. } => PrincipalInfo::Run { of: None },
        Principal::Operator { uid } | Principal::Delegate { uid, .. } => {
            PrincipalInfo::Operator { uid }
        }
    };
    let everyone = tasks
        .list(Reach::Any, &TaskList::default(), Some(&describe))
        .unwrap();
    let owners: Vec<(&str, Option<PrincipalInfo>)> = everyone
        .tasks
        .iter()
        .map(|t| (t.task_id.as_str(), t.owner.clone()))
        .collect();
    assert_eq!(
        owners,
        [
            (
                new.as_str(),
                Some(PrincipalInfo::Agent {
                    id: 7,
                    name: Some("worker1".into())
                })
            ),
            ("t-old", Some(PrincipalInfo::Agent { id: 7, name: None })),
        ]
    );
    let mut replies = Vec::new();
    assert_eq!(
        tasks.cancel(Reach::Any, "t-old", &mut replies),
        Ok((false, None))
    );
}

#[test]
fn a_row_that_cannot_be_read_keeps_its_place_in_creation_order() {
    let mut tasks = reopened(Loaded {
        records: vec![record("t-a", 1, OPERATOR, EARLIER, "completed")],
        unreadable: vec![RowError::Kind {
            id: "t-b".into(),
            seq: 9,
            kind: "nap".into(),
        }],
    });
    tasks.dispatch(OPERATOR, super::exec("print(1)")).unwrap();
    let Some(Write::Insert(record)) = tasks.store().writes.last() else {
        panic!("{:?}", tasks.store().changes());
    };
    assert_eq!(record.seq, 10);
}

#[test]
fn an_agents_end_cancels_its_tasks_and_a_runs_end_forgets_them_too() {
    let mut tasks = tasks(TasksConfig::default());
    let run = Principal::Run { number: 3 };
    let (agents, agent_start) = started(&mut tasks, AGENT, "while True: pass");
    let (runs, run_start) = started(&mut tasks, run, "while True: pass");
    let operators = dispatch(&mut tasks, OPERATOR, super::exec("print(1)"));
    save(&mut tasks);
    let mut replies = Vec::new();
    let why = "the agent that asked for it has ended";
    assert_eq!(
        tasks.end_owner(AGENT, why, &mut replies),
        [CancelledWork {
            number: agent_start.number
        }]
    );
    assert_eq!(state(&tasks, &agents), TaskState::Cancelled);
    let stop = tasks.end_owner(
        run,
        "the EXEC run that asked for it has ended",
        &mut replies,
    );
    assert_eq!(
        stop,
        [CancelledWork {
            number: run_start.number
        }]
    );
    tasks.forget_owner(run);
    assert_eq!(
        tasks.status(Reach::Any, &runs).unwrap_err().code,
        ErrorCode::NotFound
    );
    assert_eq!(
        tasks.store().changes().last().unwrap(),
        &format!("delete {runs}")
    );
    // Nobody else's work ends with them.
    assert_eq!(state(&tasks, &operators), TaskState::Queued);
}
