//! RECORD_START (0x70), RECORD_STOP (0x71), RECORD_STATUS (0x72),
//! REPLAY_START (0x73) and REPLAY_STATUS (0x74): a principal's recording
//! of its own calls and its visible agents' (see `recording`), and the
//! replay of one.
//!
//! A recording is JSON the client hands back, so nothing in it is
//! trusted: a replay runs as its caller, never as an id inside it, and
//! re-issues only NOOP and the state store's calls — through their own
//! handlers, with every check they make — skipping the rest.

use agentos_proto::payload::{
    to_json, RecordStartRequest, RecordStatusRequest, ReplayStartRequest, ReplayState,
    ReplayStatusReply,
};
use agentos_proto::{ErrorReply, Opcode};

use super::request::{actor, Outcome, Request};
use super::state;
use crate::address::Answer;
use crate::kernel::Kernel;
use crate::workers::Job;

/// RECORD_START.
pub fn start(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    answer(
        RecordStartRequest::parse(request.payload).and_then(|asked| {
            let actor = actor(kernel, request)?;
            let (recorder, viewer) = (actor.principal(), actor.viewer());
            Ok(Answer::json(
                &kernel.services.recordings.start(recorder, viewer, asked),
            ))
        }),
    )
}

/// RECORD_STOP.
pub fn stop(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    answer(
        actor(kernel, request)
            .map(|actor| actor.principal())
            .map(|recorder| Answer::json(&kernel.services.recordings.stop(recorder))),
    )
}

/// RECORD_STATUS.
pub fn status(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    answer(
        RecordStatusRequest::parse(request.payload).and_then(|asked| {
            let recorder = actor(kernel, request)?.principal();
            Ok(Answer::json(
                &kernel.services.recordings.status(recorder, asked.export),
            ))
        }),
    )
}

/// REPLAY_STATUS.
pub fn replay_status(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    answer(
        actor(kernel, request).map(|actor| {
            Answer::json(&kernel.services.recordings.replay_status(actor.principal()))
        }),
    )
}

/// REPLAY_START: the re-issued calls run in order on a worker; the reply
/// comes once they are done.
pub fn replay(kernel: &mut Kernel, request: &Request<'_>) -> Outcome {
    let entries = match ReplayStartRequest::parse(request.payload)
        .and_then(|entries| Ok((entries, actor(kernel, request)?.principal())))
    {
        Ok(found) => found,
        Err(err) => return Outcome::Reply(err.into()),
    };
    let (entries, principal) = entries;
    let mut jobs: Vec<Job> = Vec::new();
    let mut status = ReplayStatusReply {
        success: true,
        state: ReplayState::Completed,
        total_entries: entries.len(),
        current_entry: entries.len(),
        ..ReplayStatusReply::default()
    };
    for entry in entries {
        let opcode = Opcode(entry.opcode);
        let handler = match opcode {
            Opcode::STORE => state::store,
            Opcode::FETCH => state::fetch,
            Opcode::DELETE => state::delete,
            Opcode::KEYS => state::keys,
            Opcode::NOOP if !entry.truncated => {
                status.entries_replayed += 1;
                continue;
            }
            _ => {
                status.entries_skipped += 1;
                continue;
            }
        };
        if entry.truncated {
            status.entries_skipped += 1;
            continue;
        }
        let payload = serde_json::to_vec(&entry.payload).unwrap_or_default();
        // As the caller, whoever the recording says made the call.
        let again = Request {
            caller: request.caller,
            peer: request.peer,
            groups: request.groups,
            reply_to: request.reply_to,
            opcode,
            payload: &payload,
        };
        if let Outcome::Deferred(job) = handler(kernel, &again) {
            jobs.push(job);
        }
        status.entries_replayed += 1;
    }
    kernel.services.recordings.replayed(principal, status);
    Outcome::Deferred(Box::new(move || {
        for job in jobs {
            job();
        }
        to_json(&status)
    }))
}

fn answer(answer: Result<Answer, ErrorReply>) -> Outcome {
    Outcome::Reply(answer.unwrap_or_else(Answer::from))
}
