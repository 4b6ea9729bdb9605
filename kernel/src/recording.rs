//! Recordings (RECORD_START, RECORD_STOP, RECORD_STATUS): a principal
//! records the calls it makes and those of the agents it may see (or only
//! the ones it names among them), in memory, bounded, each payload cut at
//! 4 KiB with what looks like a secret redacted. The last replay's figures
//! are kept beside them.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use agentos_proto::payload::{
    RecordStartRequest, RecordStatusReply, RecordedCall, RecordingState, ReplayStatusReply,
    MAX_RECORDED_PAYLOAD,
};
use agentos_proto::Opcode;
use serde_json::Value;

use crate::agents::Viewer;
use crate::identity::Principal;

/// Object fields whose values are secrets wherever they appear.
const SECRET_FIELDS: [&str; 9] = [
    "api_key",
    "apikey",
    "token",
    "access_token",
    "password",
    "secret",
    "authorization",
    "cookie",
    "x-api-key",
];
/// Object fields every value of which is redacted: headers and
/// environments carry keys by name.
const SECRET_MAPS: [&str; 2] = ["headers", "env"];
/// What a redacted value reads.
const REDACTED: &str = "[redacted]";

/// One principal's recording.
#[derive(Debug)]
struct Recording {
    viewer: Viewer,
    asked: RecordStartRequest,
    state: RecordingState,
    calls: Vec<RecordedCall>,
    dropped: u64,
}

impl Recording {
    /// Whether a call of `caller` with `opcode` goes into it.
    fn wants(
        &self,
        recorder: Principal,
        caller: Principal,
        opcode: Opcode,
        sees: &dyn Fn(Viewer, u32) -> bool,
    ) -> bool {
        let kind_wanted = match opcode {
            Opcode::THINK => self.asked.include_think,
            Opcode::HTTP => self.asked.include_http,
            Opcode::EXEC => self.asked.include_exec,
            _ => true,
        };
        let agent = match caller {
            Principal::Agent { id } => Some(id),
            Principal::Operator { .. } | Principal::Delegate { .. } | Principal::Run { .. } => None,
        };
        let caller_wanted = match (&self.asked.filter_agents, agent) {
            (None, _) if caller == recorder => true,
            (None, Some(id)) => sees(self.viewer, id),
            (Some(only), Some(id)) => only.contains(&id) && sees(self.viewer, id),
            (_, None) => false,
        };
        kind_wanted && caller_wanted
    }

    fn reply(&self, export: bool) -> RecordStatusReply {
        RecordStatusReply {
            success: true,
            state: self.state,
            entry_count: self.calls.len(),
            max_entries: self.asked.limit(),
            dropped: self.dropped,
            recording: export.then(|| serde_json::to_string(&self.calls).unwrap_or_default()),
        }
    }
}

/// Every principal's recording, and its last replay.
#[derive(Debug, Default)]
pub struct Recordings {
    by: HashMap<Principal, Recording>,
    replays: HashMap<Principal, ReplayStatusReply>,
    /// How many are recording now: the dispatcher asks on every call.
    active: usize,
}

impl Recordings {
    /// Whether anyone records (cheap: asked for every request).
    pub fn any(&self) -> bool {
        self.active > 0
    }

    /// RECORD_START: a new recording of `recorder`'s, replacing its last.
    pub fn start(
        &mut self,
        recorder: Principal,
        viewer: Viewer,
        asked: RecordStartRequest,
    ) -> RecordStatusReply {
        let recording = Recording {
            viewer,
            asked,
            state: RecordingState::Recording,
            calls: Vec::new(),
            dropped: 0,
        };
        let reply = recording.reply(false);
        self.by.insert(recorder, recording);
        self.count_active();
        reply
    }

    /// RECORD_STOP: the recording stays, for export.
    pub fn stop(&mut self, recorder: Principal) -> RecordStatusReply {
        let reply = match self.by.get_mut(&recorder) {
            Some(recording) => {
                recording.state = RecordingState::Idle;
                recording.reply(false)
            }
            None => idle(),
        };
        self.count_active();
        reply
    }

    /// RECORD_STATUS.
    pub fn status(&self, recorder: Principal, export: bool) -> RecordStatusReply {
        self.by
            .get(&recorder)
            .map_or_else(idle, |recording| recording.reply(export))
    }

    /// Records a call of `caller` in every recording that wants it.
    /// `sees` is LIST's rule.
    pub fn record(
        &mut self,
        caller: Principal,
        opcode: Opcode,
        payload: &[u8],
        sees: &dyn Fn(Viewer, u32) -> bool,
    ) {
        if is_recording_call(opcode) {
            return;
        }
        let mut call = None;
        for (recorder, recording) in &mut self.by {
            if recording.state != RecordingState::Recording
                || !recording.wants(*recorder, caller, opcode, sees)
            {
                continue;
            }
            if recording.calls.len() >= recording.asked.limit() {
                recording.dropped += 1;
                continue;
            }
            let mut call = call
                .get_or_insert_with(|| recorded(caller, opcode, payload))
                .clone();
            call.seq = recording.calls.len() as u64 + 1;
            recording.calls.push(call);
        }
    }

    /// A principal has ended: its recording and replay go.
    pub fn forget(&mut self, principal: Principal) {
        self.by.remove(&principal);
        self.replays.remove(&principal);
        self.count_active();
    }

    /// Keeps how `principal`'s last replay went.
    pub fn replayed(&mut self, principal: Principal, status: ReplayStatusReply) {
        self.replays.insert(principal, status);
    }

    /// REPLAY_STATUS.
    pub fn replay_status(&self, principal: Principal) -> ReplayStatusReply {
        self.replays
            .get(&principal)
            .copied()
            .unwrap_or(ReplayStatusReply {
                success: true,
                ..ReplayStatusReply::default()
            })
    }

    fn count_active(&mut self) {
        self.active = self
            .by
            .values()
            .filter(|r| r.state == RecordingState::Recording)
            .count();
    }
}

fn idle() -> RecordStatusReply {
    RecordStatusReply {
        success: true,
        ..RecordStatusReply::default()
    }
}

/// The recording calls themselves are never recorded.
fn is_recording_call(opcode: Opcode) -> bool {
    (0x70..=0x74).contains(&opcode.0)
}

/// A call as a recording keeps it.
fn recorded(caller: Principal, opcode: Opcode, payload: &[u8]) -> RecordedCall {
    let truncated = payload.len() > MAX_RECORDED_PAYLOAD;
    let payload = if truncated {
        Value::String(String::from_utf8_lossy(&payload[..MAX_RECORDED_PAYLOAD]).into_owned())
    } else {
        match serde_json::from_slice::<Value>(payload) {
            Ok(mut json) => {
                redact(&mut json);
                json
            }
            Err(_) => Value::String(String::from_utf8_lossy(payload).into_owned()),
        }
    };
    let (principal, agent_id) = match caller {
        Principal::Operator { uid } => (format!("operator:{uid}"), None),
        Principal::Delegate { uid, name } => (format!("delegate:{uid}:{name}"), None),
        Principal::Agent { id } => (format!("agent:{id}"), Some(id)),
        Principal::Run { number } => (format!("run:{number}"), None),
    };
    RecordedCall {
        seq: 0,
        timestamp_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |t| t.as_millis() as u64),
        principal,
        agent_id,
        opcode: opcode.0,
        opcode_name: opcode.name().unwrap_or("UNKNOWN").to_owned(),
        payload,
        truncated,
    }
}

/// Replaces what looks like a secret, at any depth (iteratively: a
/// payload is the caller's, and may nest deep).
fn redact(json: &mut Value) {
    let mut stack = vec![json];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(fields) => {
                for (name, field) in fields.iter_mut() {
                    let name = name.to_ascii_lowercase();
                    if SECRET_FIELDS.contains(&name.as_str()) {
                        *field = Value::String(REDACTED.to_owned());
                    } else if SECRET_MAPS.contains(&name.as_str()) && field.is_object() {
                        if let Value::Object(map) = field {
                            for value in map.values_mut() {
                                *value = Value::String(REDACTED.to_owned());
                            }
                        }
                    } else {
                        stack.push(field);
                    }
                }
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn everyone(_: Viewer, _: u32) -> bool {
        true
    }

    #[test]
    fn secrets_are_redacted_at_any_depth_and_long_payloads_cut() {
        let call = recorded(
            Principal::Operator { uid: 0 },
            Opcode::HTTP,
            br#"{"url":"https://x/","headers":{"Authorization":"Bearer sk-1"},"nested":[{"api_key":"k"}]}"#,
        );
        let text = call.payload.to_string();
        assert!(!text.contains("sk-1") && !text.contains("\"k\""), "{text}");
        assert!(text.contains("https://x/"), "{text}");
        let long = vec![b'x'; MAX_RECORDED_PAYLOAD + 1];
        assert!(recorded(Principal::Agent { id: 1 }, Opcode::NOOP, &long).truncated);
    }

    #[test]
    fn a_filter_records_only_the_agents_it_names_that_the_recorder_sees() {
        let mut recordings = Recordings::default();
        let me = Principal::Operator { uid: 0 };
        let asked = RecordStartRequest {
            filter_agents: Some(vec![999]),
            ..RecordStartRequest::default()
        };
        recordings.start(me, Viewer::Operator, asked);
        recordings.record(me, Opcode::STORE, b"{}", &everyone);
        recordings.record(Principal::Agent { id: 5 }, Opcode::STORE, b"{}", &everyone);
        assert_eq!(recordings.status(me, false).entry_count, 0);
        recordings.record(
            Principal::Agent { id: 999 },
            Opcode::STORE,
            b"{}",
            &|_, _| false,
        );
        assert_eq!(
            recordings.status(me, false).entry_count,
            0,
            "one it cannot see"
        );
        recordings.record(
            Principal::Agent { id: 999 },
            Opcode::STORE,
            b"{}",
            &everyone,
        );
        assert_eq!(recordings.status(me, false).entry_count, 1);
    }

    #[test]
    fn a_recording_is_bounded_and_skips_think_unless_asked() {
        let mut recordings = Recordings::default();
        let me = Principal::Agent { id: 3 };
        let asked = RecordStartRequest {
            max_entries: Some(2),
            ..RecordStartRequest::default()
        };
        recordings.start(me, Viewer::Agent(3), asked);
        recordings.record(me, Opcode::THINK, b"hi", &everyone);
        recordings.record(me, Opcode::RECORD_STATUS, b"{}", &everyone);
        for _ in 0..3 {
            recordings.record(me, Opcode::NOOP, b"x", &everyone);
        }
        let status = recordings.status(me, true);
        assert_eq!((status.entry_count, status.dropped), (2, 1));
        let exported: Vec<RecordedCall> = serde_json::from_str(&status.recording.unwrap()).unwrap();
        assert_eq!(exported[1].seq, 2);
        assert!(recordings.any());
        recordings.stop(me);
        assert!(!recordings.any());
    }
}
