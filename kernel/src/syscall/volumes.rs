//! EXEC's volume operations: `create_volume` makes one of the caller's
//! own (answered once its disk is made), `volumes` lists the caller's and
//! those it was given, `remove_volume` removes one of its own. Every
//! principal has volumes of its own; an agent's or a run's end with it.

use agentos_proto::payload::{ExecCall, VolumeRemovedReply, VolumesReply};
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{actor, reply, Outcome, Request};
use crate::kernel::Kernel;

/// Answers a volume operation.
pub fn handle(kernel: &mut Kernel, request: &Request<'_>, call: ExecCall) -> Outcome {
    let owner = request.caller.principal();
    match call {
        ExecCall::Volumes => reply(Ok(VolumesReply {
            success: true,
            volumes: kernel.exec.disks().store.volumes.list(owner),
        })),
        ExecCall::CreateVolume { volume, bytes } => {
            // Counted against the share its runs are: an agent's whole
            // tree's, or its operator's.
            let share = actor(kernel, request).map(|actor| actor.share(&kernel.agents));
            let made = share.and_then(|share| {
                let disks = kernel.exec.disks();
                disks.create_volume((owner, share), &volume, bytes, request.reply_to)
            });
            match made {
                Ok(()) => Outcome::Later,
                Err(err) => reply::<VolumesReply>(Err(err)),
            }
        }
        ExecCall::RemoveVolume { volume } => {
            let removed = kernel.exec.disks().store.remove_volume(owner, &volume);
            reply(removed.map(|()| VolumeRemovedReply {
                success: true,
                removed: true,
            }))
        }
        _ => reply::<VolumesReply>(Err(ErrorReply::new(
            ErrorCode::Internal,
            "not a volume operation",
        ))),
    }
}
