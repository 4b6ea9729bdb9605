//! The fleet's work on this node: a task the fleet thread claimed runs
//! here as a task of its owner, under the fleet's id; its end goes back to
//! the fleet; one that is no longer this node's (cancelled, or taken by
//! another node) stops. THINK's quotas are leased from the fleet's
//! ledger.

use agentos_proto::payload::TaskState;
use agentos_proto::ErrorReply;

use crate::address::Reply;
use crate::fleet::sessions::SessionNews;
use crate::fleet::tasks::Claimed;
use crate::fleet::{Fleet, FleetEvent};
use crate::identity::Principal;
use crate::llm::Llm;
use crate::permissions::allowance::LedgerUnreachable;
use crate::tasks::{CancelledWork, Reach, Tasks};

/// What the kernel does after the fleet's events.
#[derive(Debug, Default)]
pub struct Woken {
    /// The work of tasks that stopped.
    pub stops: Vec<CancelledWork>,
    /// Tasks were queued here: start what has room.
    pub adopted: bool,
    /// What the fleet answered about hibernated sessions.
    pub sessions: Vec<SessionNews>,
}

/// Sends THINK's asks for more of its quotas to the ledger, and takes the
/// fleet thread's events.
pub fn on_wake(fleet: &Fleet, tasks: &mut Tasks, llm: &mut Llm, replies: &mut Vec<Reply>) -> Woken {
    let mut woken = Woken::default();
    if let Ok(link) = fleet.link() {
        for ask in llm.take_lease_asks() {
            if let Err(err) = link.lease(ask.clone()) {
                llm.leased(&ask, Err(LedgerUnreachable(err.reason())), replies);
            }
        }
    }
    for event in fleet.take_events() {
        match event {
            FleetEvent::Reply(reply_to, answer) => replies.push((reply_to, answer)),
            FleetEvent::Leased(ask, grant) => llm.leased(&ask, grant, replies),
            FleetEvent::Session(news) => woken.sessions.push(news),
            FleetEvent::Claimed { task, owner } => {
                woken.adopted |= adopt(fleet, tasks, *task, owner)
            }
            FleetEvent::Stop(task_id) => {
                if !tasks.fleet.holds(&task_id) {
                    continue;
                }
                if let Ok((_, Some(stop))) = tasks.cancel(Reach::Any, &task_id, replies) {
                    woken.stops.push(stop);
                }
            }
        }
    }
    woken
}

/// Queues a claimed task as its owner's here; one that cannot be (its
/// owner unknown on this node, no room) fails in the fleet at once.
fn adopt(
    fleet: &Fleet,
    tasks: &mut Tasks,
    claimed: Claimed,
    owner: Result<Principal, ErrorReply>,
) -> bool {
    let Claimed {
        task_id, dispatch, ..
    } = claimed;
    let adopted = owner.and_then(|principal| tasks.adopt(task_id.clone(), principal, dispatch));
    match adopted {
        Ok(()) => true,
        Err(refusal) => {
            log::warn!("fleet: task {task_id} cannot run here: {}", refusal.error);
            if let Ok(link) = fleet.link() {
                link.finished(task_id, TaskState::Failed, refusal.to_json().into());
            }
            false
        }
    }
}

/// Hands the ends of the fleet's tasks that ran here back to the fleet.
/// A task this kernel interrupted as it stops is left to its lease: the
/// fleet queues it again while its attempts allow.
pub fn report(fleet: &Fleet, tasks: &mut Tasks) {
    let Ok(link) = fleet.link() else {
        return;
    };
    for end in tasks.fleet.take_ended() {
        if end.state != TaskState::Interrupted {
            link.finished(end.task_id, end.state, end.result);
        }
    }
}
