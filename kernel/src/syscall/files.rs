//! READ (0x03) and WRITE (0x04): a file in the caller's own view, with the
//! caller's own rights (see `files`). An operator's view is the host's;
//! a sandboxed agent's, its sandbox's. An EXEC run reads and writes its
//! files itself, in its own sandbox: it is refused here.

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;

use agentos_proto::payload::{ReadReply, ReadRequest, WriteMode, WriteReply, WriteRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use super::request::{actor, delegate_refused, Outcome, Request};
use crate::address::Answer;
use crate::as_caller::AsCaller;
use crate::files;
use crate::kernel::{agent_sandboxes, Actor, Kernel, Permission};
use crate::sandbox::runtime::Sandboxes;

/// READ.
pub fn read(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let max_bytes = kernel
        .config()
        .exec
        .max_file_bytes
        .min(kernel.config().max_request_bytes);
    let prepared = ReadRequest::parse(request.payload).and_then(|asked| {
        let (root, who) = view_of(kernel, request, Permission::Read)?;
        Ok((asked, root, who))
    });
    match prepared {
        Ok((asked, root, who)) => Outcome::Deferred(Box::new(move || {
            let answer = match files::read(root, asked.path, who, max_bytes) {
                Ok(read) => Answer::json(&ReadReply {
                    success: true,
                    content: read.content,
                    size: read.size,
                }),
                Err(err) => err.into(),
            };
            answer.into_json()
        })),
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// WRITE.
pub fn write(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let prepared = WriteRequest::parse(request.payload).and_then(|asked| {
        let (root, who) = view_of(kernel, request, Permission::Write)?;
        Ok((asked, root, who))
    });
    match prepared {
        Ok((asked, root, who)) => Outcome::Deferred(Box::new(move || {
            let append = asked.mode == WriteMode::Append;
            let answer = match files::write(root, asked.path, asked.content, append, who) {
                Ok(bytes_written) => Answer::json(&WriteReply {
                    success: true,
                    bytes_written,
                }),
                Err(err) => err.into(),
            };
            answer.into_json()
        })),
        Err(err) => Outcome::Reply(err.into()),
    }
}

/// The root of the caller's view, and whom to act as, if it may `need`.
fn view_of(
    kernel: &mut Kernel,
    request: &Request<'_>,
    need: Permission,
) -> Result<(OwnedFd, AsCaller), ErrorReply> {
    let actor = actor(kernel, request)?;
    actor.require(need)?;
    let root = match actor {
        Actor::Operator { .. } => open_host_root(),
        Actor::Agent { id, .. } => {
            let sandbox = kernel.agents.sandbox_of(id).ok_or_else(|| {
                ErrorReply::new(
                    ErrorCode::Busy,
                    format!("agent {id} is between restarts; try again once it runs"),
                )
            })?;
            agent_sandboxes(&mut kernel.sandboxes).open_root(sandbox)
        }
        Actor::Delegate { .. } => return Err(delegate_refused("READ and WRITE")),
        Actor::Run { .. } => {
            return Err(ErrorReply::new(
                ErrorCode::PermissionDenied,
                "an EXEC run reads and writes its files itself, in its own sandbox; READ \
                 and WRITE are for operators and agents",
            ))
        }
    }
    .map_err(|err| {
        ErrorReply::new(
            ErrorCode::Internal,
            format!("cannot open the caller's view of the filesystem: {err}"),
        )
    })?;
    Ok((
        root,
        AsCaller {
            uid: request.peer.uid,
            gid: request.peer.gid,
            groups: request.groups.to_vec(),
        },
    ))
}

fn open_host_root() -> std::io::Result<OwnedFd> {
    Ok(OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open("/")?
        .into())
}
