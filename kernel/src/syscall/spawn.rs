//! SPAWN (0x10): start an agent. The reply is delivered later, once the
//! workload runs or has failed to start (see `agents`); refusals come at
//! once.
//!
//! An operator may spawn anything its request describes. An agent may
//! spawn only if its permissions say so, only sandboxed children, and
//! never a child with more than it has (the agents table's inheritance
//! rules), drawing on what its token budgets still allow. An EXEC run may
//! spawn only if its EXEC request gave it `permissions.spawn`, and then as
//! an agent would, within what the run was given: the child joins the tree
//! of the agent the run is of, its paths are those runs see, and it ends
//! when the run does.

use agentos_proto::payload::{AuditCategory, Permissions, SpawnRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::audit::note;
use super::request::{actor, delegate_refused, Outcome, Request};
use crate::agents::{RunSpawner, Spawner};
use crate::exec::VolumeUse;
use crate::identity::Principal;
use crate::kernel::agent_sandboxes;
use crate::kernel::Kernel;
use crate::kernel::{Actor, Permission, Root};
use crate::sandbox::attach::VolumePlace;
use crate::sandbox::plan::Shape;
use crate::sandbox::runtime::Sandboxes;
use crate::telemetry::tracer::SpanAgent;

pub fn handle(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let started = SpawnRequest::parse(request.payload).and_then(|mut spawn| {
        let (spawner, tokens_left) = spawner_for(kernel, request, &mut spawn)?;
        let disks = disks_for(kernel, request, &spawn)?;
        let name = spawn.name.clone();
        let sandboxed = spawn.sandboxed;
        let id = kernel.agents.spawn(
            &mut agent_sandboxes(&mut kernel.sandboxes),
            spawner,
            spawn,
            tokens_left,
            disks.places,
            request.reply_to,
        )?;
        let store = &mut kernel.exec.disks().store;
        // What agents that have ended for good were given goes now.
        let agents = &kernel.agents;
        store.retain_agents(|agent| agent == id || !agents.is_over(agent));
        store.volumes.give(Principal::Agent { id }, &disks.volumes);
        if let Some(template) = disks.template {
            store.template_used_by(id, template);
        }
        let spawned = Spawned {
            name: &name,
            sandboxed,
        };
        let lifecycle = AuditCategory::AgentLifecycle;
        note(
            kernel,
            request,
            lifecycle,
            "AGENT_SPAWNED",
            Some(id),
            &spawned,
        );
        kernel
            .router
            .open_spawn_span(request.reply_to, SpanAgent { id, name });
        Ok(())
    });
    match started {
        Ok(()) => Outcome::Later,
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// What the audit log says of a SPAWN.
#[derive(serde::Serialize)]
struct Spawned<'a> {
    name: &'a str,
    sandboxed: bool,
}

/// Who asks for `spawn` and may make it, with what its token budgets still
/// allow (`None`: it has no budget).
fn spawner_for(
    kernel: &Kernel,
    request: &Request<'_>,
    spawn: &mut SpawnRequest,
) -> Result<(Spawner, Option<u64>), ErrorReply> {
    let actor = actor(kernel, request)?;
    actor.require(Permission::Spawn)?;
    if let Actor::Operator { uid, lowered } = actor {
        if let Some(kept) = lowered {
            within_lowered(spawn, kept)?;
        }
        return Ok((Spawner::Operator(uid), None));
    }
    // A boot agent that is down must not find a stand-in under its name.
    if kernel
        .config()
        .agents
        .boot
        .iter()
        .any(|b| b.name == spawn.name)
    {
        return Err(ErrorReply::new(
            ErrorCode::AlreadyExists,
            format!(
                "the name {:?} is reserved for a boot agent; choose another",
                spawn.name
            ),
        ));
    }
    if !spawn.sandboxed {
        return Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            format!(
                "SPAWN field `sandboxed`: {} may only spawn sandboxed agents",
                actor.name()
            ),
        ));
    }
    let tokens_left = kernel.llm.tokens_left(actor.budgets());
    let spawner = match actor {
        Actor::Run { number, grant } => {
            let binds = kernel.exec.host_binds();
            Spawner::Run(Box::new(RunSpawner {
                number,
                parent: grant.root.agent(),
                operator: match grant.root {
                    Root::Operator(uid) => Some(uid),
                    Root::Agent(_) => None,
                    Root::Delegate(..) => return Err(delegate_refused("SPAWN")),
                },
                grant: grant.as_parent(),
                budgets: grant.budgets.clone(),
                view: kernel.sandboxes.view(Shape::EXEC_HOST, &binds),
                python: kernel.exec.pool().setup().python.clone(),
            }))
        }
        Actor::Agent { id, .. } => Spawner::Agent(id),
        Actor::Operator { uid, .. } => Spawner::Operator(uid),
        Actor::Delegate { .. } => return Err(delegate_refused("SPAWN")),
    };
    Ok((spawner, tokens_left))
}

/// The disks an agent's sandbox is given.
#[derive(Default)]
struct AgentDisks {
    /// The volumes its SPAWN names, as its caller may give them.
    volumes: Vec<VolumeUse>,
    /// Its template's key, if it starts from one.
    template: Option<String>,
    /// What its sandbox mounts: its template's environment, then those
    /// volumes.
    places: Vec<VolumePlace>,
}

/// The disks `spawn` asks for, as its caller may have them.
fn disks_for(
    kernel: &mut Kernel,
    request: &Request<'_>,
    spawn: &SpawnRequest,
) -> Result<AgentDisks, ErrorReply> {
    let store = &kernel.exec.disks().store;
    let caller = request.caller.principal();
    let mut disks = AgentDisks::default();
    if let Some(name) = &spawn.template {
        let (key, place) = store.template_place(caller, name)?;
        disks.template = Some(key);
        disks.places.push(place);
    }
    if spawn.volumes.is_empty() {
        return Ok(disks);
    }
    store.require("volumes")?;
    disks.volumes = store.volumes.resolve(caller, "SPAWN", &spawn.volumes)?;
    store.volumes_mounted(&disks.volumes)?;
    let places = disks.volumes.iter().map(|volume| volume.place.clone());
    disks.places.extend(places);
    Ok(disks)
}

/// An operator connection that lowered itself spawns no agent with more
/// than it kept: a switch it dropped is refused if asked for, and off
/// where the request leaves it out.
fn within_lowered(spawn: &mut SpawnRequest, kept: &Permissions) -> Result<(), ErrorReply> {
    if let Some(field) = spawn.permissions.beyond(kept) {
        return Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            format!(
                "SPAWN field `permissions.{field}`: this connection lowered itself without it \
                 (a child never gets more than its parent)"
            ),
        ));
    }
    spawn.permissions.cap(kept);
    Ok(())
}
