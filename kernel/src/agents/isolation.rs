//! How isolated an agent is on this host: the sandbox shape it gets, what
//! it then sees of the filesystem, the isolation LIST reports (and why it
//! is less than asked, when the host gives less), and the cgroup limits
//! its sandbox gets.

use agentos_egress::Egress;
use agentos_proto::payload::{Isolation, Limits, SpawnRequest};

use crate::cgroup::CgroupLimits;
use crate::sandbox::plan::{Shape, SOCKET_INSIDE};
use crate::sandbox::runtime::{DoorKey, Sandboxes};
use crate::sandbox::spec::Bind;
use crate::sandbox::view::View;
use crate::sandbox::Namespaces;

/// The sandbox shape an agent needs on this host: sandboxed if it asked
/// to be (and can be), sharing the host's network if its egress is that.
pub fn shape_of<O>(sandboxes: &impl Sandboxes<O>, sandboxed: bool, egress: &Egress) -> Shape {
    let sandboxed = sandboxed && sandboxes.machine().has_namespaces();
    Shape {
        sandboxed,
        // Outside a sandbox there is only the host's network.
        network: *egress == Egress::Host && sandboxed,
        nested: false,
    }
}

/// What a sandboxed agent of sandbox `shape` sees of the filesystem: its
/// program's `binds` and its own socket, `door` (`None`: it is not
/// sandboxed, so it sees the host).
pub fn view_of<O>(
    sandboxes: &impl Sandboxes<O>,
    shape: Shape,
    binds: &[Bind],
    door: Option<DoorKey>,
) -> Option<View> {
    let mut binds = binds.to_vec();
    if let Some(door) = door.and_then(|door| sandboxes.door_path(door)) {
        binds.push(Bind {
            source: door.to_path_buf(),
            target: SOCKET_INSIDE.into(),
            writable: true,
        });
    }
    sandboxes.view(shape, &binds)
}

/// The isolation a request gets on this host, and why it is less than
/// asked, if it is.
pub fn isolation_of<O>(
    sandboxes: &impl Sandboxes<O>,
    request: &SpawnRequest,
    egress: &Egress,
) -> Isolation {
    let machine = sandboxes.machine();
    let shape = shape_of(sandboxes, request.sandboxed, egress);
    let mut missing = Vec::new();
    if request.sandboxed {
        if let Some(reason) = &machine.no_namespaces {
            missing.push(format!("no namespaces: {reason}"));
        }
        if let Some(reason) = &machine.no_cgroups {
            missing.push(format!("no cgroup limits: {reason}"));
        }
    }
    let namespaces = Namespaces {
        pid: shape.sandboxed,
        net: shape.sandboxed && !shape.network,
        mount: shape.sandboxed,
        uts: shape.sandboxed,
        ipc: shape.sandboxed,
        user: shape.sandboxed && machine.map_to.is_some(),
    };
    Isolation {
        sandboxed: shape.sandboxed,
        namespaces: namespaces.names(),
        cgroup: if shape.sandboxed {
            machine.cgroup_version()
        } else {
            None
        },
        degraded_reason: (!missing.is_empty()).then(|| missing.join("; ")),
    }
}

/// The cgroup limits for an agent's limits.
pub fn cgroup_limits(limits: &Limits) -> CgroupLimits {
    CgroupLimits {
        memory: limits.memory.unwrap_or(u64::MAX),
        cpu_quota: limits.cpu_quota,
        cpu_period: limits.cpu_period.unwrap_or(100_000),
        max_pids: limits.max_pids.unwrap_or(u64::MAX),
    }
}
