//! The fleet's tasks, as rows: dispatched on any node, claimed by a node
//! with room (`FOR UPDATE SKIP LOCKED`), run there, and finished only by
//! the claim that holds the task's current **fence**. A claim takes the
//! next number of a sequence as the task's fence, so a node that comes back
//! from a partition, holding an older fence, cannot record a result for
//! work another node has taken since, nor for a task cancelled meanwhile.
//!
//! A task whose node's lease has run out (by the database's clock) is
//! queued again while its attempts allow, else ended `interrupted`.
//! Notifications (`agentos_tasks`) only wake nodes up: every decision is
//! made on the rows.

use agentos_proto::payload::{
    to_json, StoppedResult, TaskDispatch, TaskInfo, TaskKind, TaskList, TaskState,
};
use postgres::types::ToSql;
use postgres::{Client, Row};

use super::error::FleetError;
use super::nodes::Registration;

/// The channel nodes listen on; a payload is `queued`, `done:ID`,
/// `cancel:ID` or `sessions` (the hibernated sessions changed).
pub const CHANNEL: &str = "agentos_tasks";

/// Whose a fleet task is, by names every node of the fleet shares: the
/// operator's user name, and a delegate's name (empty for the operator
/// itself).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FleetOwner {
    pub user: String,
    pub delegate: String,
}

/// Whose tasks a request reaches: an operator reaches every task by its
/// id (as on one node); everyone else only its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetReach {
    Any,
    Own(FleetOwner),
}

impl FleetReach {
    /// Whether a task of `owner`'s is within reach.
    pub fn covers(&self, owner: &FleetOwner) -> bool {
        match self {
            FleetReach::Any => true,
            FleetReach::Own(own) => own == owner,
        }
    }
}

/// A task this node has claimed, to run.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub task_id: String,
    pub owner: FleetOwner,
    pub dispatch: TaskDispatch,
    pub fence: i64,
}

/// A new task's row.
#[derive(Clone, Debug)]
pub struct NewTask {
    pub owner: FleetOwner,
    pub dispatch: TaskDispatch,
    /// The node it must run on, if any.
    pub pin: Option<String>,
    /// The node it was dispatched on.
    pub from: String,
    /// The most tasks its owner may have queued in the fleet.
    pub max_queued: i64,
}

/// Inserts a task, queued, and wakes the nodes. With an idempotency key
/// the owner used before, the earlier task's id instead.
pub fn dispatch(client: &mut Client, task: &NewTask, id: &str) -> Result<String, FleetError> {
    let d = &task.dispatch;
    let request = serde_json::to_string(d).unwrap_or_default();
    let max_attempts = i32::try_from(d.max_attempts.unwrap_or(1)).unwrap_or(1);
    // One statement: the row, and the wake-up sent when it commits.
    let inserted = client.query_opt(
        "WITH queued AS (
            INSERT INTO agentos_tasks
                (task_id, owner_user, owner_delegate, kind, label, dispatch, pin, max_attempts,
                 idempotency_key, dispatched_on, state)
            SELECT $1, $2, $3, $4, $5, $6::text::json, $7, $8, $9, $10, 'queued'
            WHERE (SELECT count(*) FROM agentos_tasks
                   WHERE owner_user = $2 AND owner_delegate = $3 AND state = 'queued') < $12
            ON CONFLICT (owner_user, owner_delegate, idempotency_key)
                WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING task_id)
         SELECT task_id, pg_notify($11, 'queued')::text FROM queued",
        &[
            &id,
            &task.owner.user,
            &task.owner.delegate,
            &d.kind.as_str(),
            &d.label,
            &request,
            &task.pin,
            &max_attempts,
            &d.idempotency_key,
            &task.from,
            &CHANNEL,
            &task.max_queued,
        ],
    )?;
    if let Some(row) = inserted {
        return Ok(row.get(0));
    }
    let earlier = client.query_opt(
        "SELECT task_id FROM agentos_tasks
         WHERE owner_user = $1 AND owner_delegate = $2 AND idempotency_key = $3",
        &[&task.owner.user, &task.owner.delegate, &d.idempotency_key],
    )?;
    earlier.map(|row| row.get(0)).ok_or_else(|| {
        FleetError::Busy(format!(
            "you have {} tasks queued in the fleet, the most tasks.max_queued_per_owner \
             allows; wait for some to start",
            task.max_queued
        ))
    })
}

/// Claims up to `room` queued tasks this node may run, oldest first,
/// while its lease is current and it is not draining; never one of
/// `held`, which this node still runs under an older fence (the fleet took
/// it back while the node was cut off: another node runs it).
pub fn claim(
    client: &mut Client,
    me: &Registration,
    room: i64,
    held: &[String],
) -> Result<Vec<Claimed>, FleetError> {
    let rows = client.query(
        "UPDATE agentos_tasks SET
            state = 'running', node = $1, incarnation = $2, attempts = attempts + 1,
            fence = nextval('agentos_task_fences'), started_at = now(), finished_at = NULL
         WHERE task_id IN (
            SELECT task_id FROM agentos_tasks
            WHERE state = 'queued' AND (pin IS NULL OR pin = $1) AND NOT (task_id = ANY($4))
              AND EXISTS (SELECT 1 FROM agentos_nodes
                          WHERE name = $1 AND incarnation = $2
                            AND lease_until > now() AND NOT draining)
            ORDER BY seq LIMIT $3
            FOR UPDATE SKIP LOCKED)
         RETURNING task_id, owner_user, owner_delegate, dispatch::text, fence",
        &[&me.node, &me.incarnation, &room, &held],
    )?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        let task_id: String = row.get(0);
        let text: String = row.get(3);
        match serde_json::from_str::<TaskDispatch>(&text) {
            Ok(dispatch) => claimed.push(Claimed {
                task_id,
                owner: FleetOwner {
                    user: row.get(1),
                    delegate: row.get(2),
                },
                dispatch,
                fence: row.get(4),
            }),
            Err(err) => {
                let why = format!("the task's request cannot be read: {err}");
                let result = to_json(&StoppedResult::interrupted(&why, ""));
                finish(client, &task_id, row.get(4), TaskState::Failed, &result)?;
            }
        }
    }
    Ok(claimed)
}

/// Records a task's end, if `fence` is still the task's and it runs:
/// whether it was recorded (not, when another claim or a cancel came
/// first).
pub fn finish(
    client: &mut Client,
    task_id: &str,
    fence: i64,
    state: TaskState,
    result: &[u8],
) -> Result<bool, FleetError> {
    let result = String::from_utf8_lossy(result);
    // One statement: the end, and the wake-up sent when it commits.
    let recorded = client.query_opt(
        "WITH ended AS (
            UPDATE agentos_tasks SET state = $3, result = $4::text::json, finished_at = now()
            WHERE task_id = $1 AND fence = $2 AND state = 'running'
            RETURNING task_id)
         SELECT pg_notify($5, 'done:' || task_id)::text FROM ended",
        &[
            &task_id,
            &fence,
            &state.as_str(),
            &result.as_ref(),
            &CHANNEL,
        ],
    )?;
    Ok(recorded.is_some())
}

/// Takes back the tasks of nodes whose leases have run out (or that
/// started again since): queued again while their attempts allow, else
/// ended `interrupted`. Returns how many were queued again. A lease that
/// ran out while the database itself was down is not held against its
/// node: a node last heard from before the database started has a lease's
/// length from that start to come back.
pub fn take_over(client: &mut Client) -> Result<u64, FleetError> {
    take_back(
        client,
        "the node running it died (its lease ran out) and its attempts are spent",
        "NOT EXISTS (
            SELECT 1 FROM agentos_nodes n
            WHERE n.name = t.node AND n.incarnation = t.incarnation
              AND (n.lease_until > now()
                   OR (n.renewed_at < pg_postmaster_start_time()
                       AND pg_postmaster_start_time()
                           + n.lease_ms * interval '1 millisecond' > now())))",
        &[],
    )
}

/// Queues again the tasks the database says this node runs but the node
/// does not hold (`held`): claims whose answers were lost with the
/// connection, which never ran here, so the attempt is not counted.
pub fn release_strays(
    client: &mut Client,
    me: &Registration,
    held: &[String],
) -> Result<u64, FleetError> {
    let strays = client.execute(
        "UPDATE agentos_tasks SET state = 'queued', attempts = attempts - 1
         WHERE state = 'running' AND node = $1 AND incarnation = $2
           AND NOT (task_id = ANY($3))",
        &[&me.node, &me.incarnation, &held],
    )?;
    if strays > 0 {
        client.execute("SELECT pg_notify($1, 'queued')", &[&CHANNEL])?;
    }
    Ok(strays)
}

/// Queues again the running tasks `which` picks while their attempts
/// allow, and ends the others `interrupted` because `why`. `which` reads
/// `params` from `$2` on. Returns how many were queued again.
fn take_back(
    client: &mut Client,
    why: &str,
    which: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, FleetError> {
    let result =
        String::from_utf8_lossy(&to_json(&StoppedResult::interrupted(why, ""))).into_owned();
    let mut all: Vec<&(dyn ToSql + Sync)> = vec![&result];
    all.extend_from_slice(params);
    let rows = client.query(
        &format!(
            "UPDATE agentos_tasks t SET
                state = CASE WHEN t.attempts < t.max_attempts THEN 'queued' ELSE 'interrupted' END,
                result = CASE WHEN t.attempts < t.max_attempts THEN NULL ELSE $1::text::json END,
                finished_at = CASE WHEN t.attempts < t.max_attempts THEN NULL ELSE now() END
             WHERE t.state = 'running' AND {which}
             RETURNING t.task_id, t.state"
        ),
        &all,
    )?;
    let requeued = rows
        .iter()
        .filter(|row| row.get::<_, &str>(1) == "queued")
        .count();
    // Wake-ups only: sent after the change, as anyone's may be.
    for row in rows.iter().filter(|row| row.get::<_, &str>(1) != "queued") {
        let done = format!("done:{}", row.get::<_, &str>(0));
        client.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &done])?;
    }
    if requeued > 0 {
        client.execute("SELECT pg_notify($1, 'queued')", &[&CHANNEL])?;
    }
    Ok(requeued as u64)
}

/// Of the tasks this node runs under `fences`, those no longer its own
/// (cancelled, or taken by another node): their work should stop.
pub fn no_longer_held(
    client: &mut Client,
    held: &[(String, i64)],
) -> Result<Vec<String>, FleetError> {
    let ids: Vec<&str> = held.iter().map(|(id, _)| id.as_str()).collect();
    let fences: Vec<i64> = held.iter().map(|(_, fence)| *fence).collect();
    let rows = client.query(
        "SELECT h.id FROM unnest($1::text[], $2::bigint[]) AS h(id, fence)
         LEFT JOIN agentos_tasks t ON t.task_id = h.id
         WHERE t.task_id IS NULL OR t.fence <> h.fence OR t.state <> 'running'",
        &[&ids, &fences],
    )?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// Cancels a queued or running task within `reach`: `None` when there is
/// none, else whether it was still going.
pub fn cancel(
    client: &mut Client,
    reach: &FleetReach,
    task_id: &str,
    why: &str,
) -> Result<Option<bool>, FleetError> {
    let result = String::from_utf8_lossy(&to_json(&StoppedResult::cancelled(why))).into_owned();
    let (user, delegate) = reach_params(reach);
    let mut tx = client.transaction()?;
    let found = tx.query_opt(
        "SELECT state FROM agentos_tasks WHERE task_id = $1
            AND ($2::text IS NULL OR (owner_user = $2 AND owner_delegate = $3))
         FOR UPDATE",
        &[&task_id, &user, &delegate],
    )?;
    let Some(row) = found else {
        return Ok(None);
    };
    let state: &str = row.get(0);
    if !matches!(state, "queued" | "running") {
        return Ok(Some(false));
    }
    tx.execute(
        "UPDATE agentos_tasks SET state = 'cancelled', result = $2::text::json,
            finished_at = now() WHERE task_id = $1",
        &[&task_id, &result],
    )?;
    tx.execute(
        "SELECT pg_notify($1, $2)",
        &[&CHANNEL, &format!("cancel:{task_id}")],
    )?;
    tx.execute(
        "SELECT pg_notify($1, $2)",
        &[&CHANNEL, &format!("done:{task_id}")],
    )?;
    tx.commit()?;
    Ok(Some(true))
}

/// A task within `reach`, with its result when it has finished and
/// `with_result` asks.
pub fn status(
    client: &mut Client,
    reach: &FleetReach,
    task_id: &str,
    with_result: bool,
) -> Result<Option<TaskInfo>, FleetError> {
    let (user, delegate) = reach_params(reach);
    let row = client.query_opt(
        &format!(
            "{INFO_COLUMNS} WHERE task_id = $1
                AND ($2::text IS NULL OR (owner_user = $2 AND owner_delegate = $3))"
        ),
        &[&task_id, &user, &delegate],
    )?;
    Ok(row.map(|row| info(&row, with_result)))
}

/// The tasks `ids` (the finished ones only, with `finished_only`), with
/// their results and owners, in one statement.
pub fn tasks_of(
    client: &mut Client,
    ids: &[String],
    finished_only: bool,
) -> Result<Vec<(TaskInfo, FleetOwner)>, FleetError> {
    let rows = client.query(
        &format!(
            "{INFO_COLUMNS} WHERE task_id = ANY($1)
                AND NOT ($2 AND state IN ('queued', 'running'))"
        ),
        &[&ids, &finished_only],
    )?;
    Ok(rows
        .iter()
        .map(|row| {
            let owner = FleetOwner {
                user: row.get(12),
                delegate: row.get(13),
            };
            (info(row, true), owner)
        })
        .collect())
}

/// `owner`'s tasks in the fleet, newest first, filtered and paged: the
/// page, and the id to ask `before` for the next.
pub fn list(
    client: &mut Client,
    owner: &FleetOwner,
    filter: &TaskList,
) -> Result<(Vec<TaskInfo>, Option<String>), FleetError> {
    let limit = i64::try_from(filter.limit.unwrap_or(50).clamp(1, 1000)).unwrap_or(50);
    let state = filter.state.map(TaskState::as_str);
    let kind = filter.kind.map(TaskKind::as_str);
    let params: [&(dyn ToSql + Sync); 6] = [
        &owner.user,
        &owner.delegate,
        &state,
        &kind,
        &filter.before,
        &(limit + 1),
    ];
    let rows = client.query(
        &format!(
            "{INFO_COLUMNS} WHERE owner_user = $1 AND owner_delegate = $2
                AND ($3::text IS NULL OR state = $3)
                AND ($4::text IS NULL OR kind = $4)
                AND ($5::text IS NULL OR seq < (
                    SELECT seq FROM agentos_tasks
                    WHERE task_id = $5 AND owner_user = $1 AND owner_delegate = $2))
             ORDER BY seq DESC LIMIT $6"
        ),
        &params,
    )?;
    let mut tasks: Vec<TaskInfo> = rows.iter().map(|row| info(row, false)).collect();
    let next = (tasks.len() as i64 > limit).then(|| {
        tasks.truncate(limit as usize);
        tasks.last().map(|task| task.task_id.clone())
    });
    Ok((tasks, next.flatten()))
}

/// The columns [`info`] reads, in its order.
const INFO_COLUMNS: &str = "SELECT task_id, kind, label, state,
        to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
        to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
        to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
        COALESCE(node, pin), attempts, result::text, pin,
        (pin IS NOT NULL AND state = 'queued' AND NOT EXISTS (
            SELECT 1 FROM agentos_nodes n
            WHERE n.name = pin AND n.lease_until > now() AND NOT n.draining)),
        owner_user, owner_delegate
    FROM agentos_tasks";

fn info(row: &Row, with_result: bool) -> TaskInfo {
    let kind: &str = row.get(1);
    let state: &str = row.get(3);
    let result: Option<String> = if with_result { row.get(9) } else { None };
    let pin: Option<String> = row.get(10);
    let pinned_to_dead: bool = row.get(11);
    TaskInfo {
        task_id: row.get(0),
        kind: TaskKind::from_name(kind).unwrap_or(TaskKind::Exec),
        label: row.get(2),
        state: TaskState::from_name(state).unwrap_or(TaskState::Failed),
        created_at: row.get(4),
        started_at: row.get(5),
        finished_at: row.get(6),
        progress: None,
        result: result.and_then(|text| serde_json::from_str(&text).ok()),
        owner: None,
        node: row.get(7),
        attempts: u32::try_from(row.get::<_, i32>(8)).ok(),
        waiting_for: pinned_to_dead.then(|| {
            format!(
                "node {:?} is not live, or is draining: the task waits for it, or for its \
                 owner to cancel it",
                pin.unwrap_or_default()
            )
        }),
    }
}

fn reach_params(reach: &FleetReach) -> (Option<&str>, &str) {
    match reach {
        FleetReach::Any => (None, ""),
        FleetReach::Own(owner) => (Some(&owner.user), &owner.delegate),
    }
}
