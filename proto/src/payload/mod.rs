//! Typed JSON payloads for every opcode, with their parsing and validation.
//!
//! Parsing never panics: a payload that is not valid JSON, has a field of the
//! wrong type, or breaks a rule of the protocol becomes an [`ErrorReply`] with
//! code `bad_request` (or `limit_exceeded` for out-of-range limits) whose
//! message names the offending field. A field the protocol does not know is
//! refused the same way, in every request and every object nested in one:
//! a misspelt `restart_polcy` or `permissions.thnk` would otherwise be
//! silently dropped, and the agent would get what it did not ask for. (The
//! Clove SDK's extra EXEC fields are the one exception; see [`ExecRequest`].)

mod agent_state;
mod async_poll;
mod audit;
mod delegate;
mod delegate_name;
mod events;
mod exec;
mod exec_reply;
mod exec_run;
mod files;
mod fleet;
mod hello;
mod host_metrics;
mod http;
mod kill;
mod list;
mod logs;
mod messages;
mod metrics;
mod network;
mod parse;
mod pause;
mod permissions;
mod recording;
mod session_files;
mod session_open;
mod session_procs;
mod sessions;
mod spawn;
mod state;
mod task;
mod templates;
mod think;
mod tool;
mod volumes;

pub use crate::error::to_json;
pub use agent_state::AgentState;
pub use async_poll::{
    AsyncAsk, AsyncExecReply, AsyncPollReply, AsyncPollRequest, AsyncResult, MAX_ASYNC_RESULTS,
};
pub use audit::{
    AuditCategory, AuditConfig, AuditConfigReply, AuditEntry, AuditLogReply, AuditLogRequest,
    SetAuditConfigRequest, DEFAULT_AUDIT_ENTRIES, MAX_AUDIT_ENTRIES,
};
pub use delegate::{DelegateReply, DelegateRequest};
pub use delegate_name::{DelegateName, MAX_DELEGATE_NAME_LEN};
pub use events::{
    EmitReply, EmitRequest, EventInfo, KernelEvent, PollReply, PollRequest, SubscribeReply,
    SubscribeRequest, Topic, UnsubscribeReply, CUSTOM, DEFAULT_POLL_EVENTS, MAX_EVENT_DATA_BYTES,
    MAX_EVENT_TYPES, MAX_EVENT_TYPE_LEN, MAX_POLL_EVENTS,
};
pub use exec::ExecCall;
pub use exec_reply::{ExecReply, Truncated};
pub use exec_run::{
    ExecRequest, Language, RunPermissions, MAX_EXEC_FILES, MAX_EXEC_PATH_LEN, MAX_EXEC_TIMEOUT_MS,
};
pub use files::{ReadReply, ReadRequest, WriteMode, WriteReply, WriteRequest};
pub use fleet::{DrainReply, FleetOp, FleetRequest, NodeInfo, NodesReply};
pub use hello::{
    CgroupVersion, Features, HelloReply, HelloRequest, LlmInfo, PrincipalInfo, ProtocolLimits,
};
pub use host_metrics::{
    AgentMetrics, AgentMetricsReply, AgentMetricsRequest, AllAgentMetricsReply, CgroupCpu,
    CgroupMemory, CgroupMetrics, CgroupMetricsReply, CgroupMetricsRequest, CgroupPids, HostCpu,
    HostDisk, HostMemory, HostNetwork, KernelStats, MetricsOfAllRequest, ProcessCpu, ProcessMemory,
    ProcessMetrics, SystemMetrics, SystemMetricsReply,
};
pub use http::{
    HttpReply, HttpRequest, DEFAULT_HTTP_TIMEOUT_SECS, MAX_HTTP_HEADERS, MAX_HTTP_HEADER_BYTES,
    MAX_HTTP_TIMEOUT_SECS, MAX_HTTP_URL_LEN,
};
pub use kill::{
    AgentRef, KillAction, KillReply, KillRequest, RemoveReply, RestartReply, DEFAULT_GRACE_MS,
};
pub use list::{AgentInfo, CpuStats, ExecStats, ListRequest, LlmStats, MemoryStats, PidStats};
pub use logs::{
    LogsReply, LogsRequest, DEFAULT_FOLLOW_WAIT_MS, DEFAULT_LOG_LINES, MAX_FOLLOW_WAIT_MS,
    MAX_LOG_CHUNK, MAX_LOG_LINES,
};
pub use messages::{
    message_bytes, BroadcastReply, BroadcastRequest, ReceivedMessage, Recipient, RecvReply,
    RecvRequest, RegisterReply, RegisterRequest, SendReply, SendRequest, SenderKind, DEFAULT_RECV,
    MAX_MESSAGE_BYTES, MAX_RECV,
};
pub use metrics::{MetricsReply, MetricsRequest};
pub use network::{NetAttempt, NetOp, NetReply, NetRequest, NetTotals, Network, NetworkPolicy};
pub use parse::{
    bad_request, from_value, noting_unknown, parse_json, validate_name, UnknownField, MAX_NAME_LEN,
};
pub use pause::{PauseReply, PauseRequest, SessionPauseReply};
pub use permissions::{
    CloveSwitches, GetPermsRequest, PermissionLevel, PermissionsView, PermsReply, SetPermsRequest,
};
pub use recording::{
    RecordStartRequest, RecordStatusReply, RecordStatusRequest, RecordedCall, RecordingState,
    ReplayEntry, ReplayStartRequest, ReplayState, ReplayStatusReply, MAX_RECORDED_PAYLOAD,
    MAX_RECORDING_ENTRIES,
};
pub use session_files::{
    FileCall, FileEntry, FileEntryReply, FileEvents, FileEventsReply, FileList, FileListReply,
    FileMadeReply, FileMkdir, FileMove, FilePath, FileRead, FileReadReply, FileRemovedReply,
    FileType, FileUnwatch, FileWatch, FileWatchReply, FileWrite, WatchEvent, WatchEventType,
    MAX_EVENTS_WAIT_MS, MAX_LIST_DEPTH, MAX_LIST_ENTRIES, MAX_METADATA_BYTES, MAX_READ_BYTES,
    MAX_WRITE_BYTES,
};
pub use session_open::{LifetimeReply, SessionOpen, SessionOpenedReply, MAX_LIFETIME_MS};
pub use session_procs::{
    OutputChunk, OutputStream, ProcCall, ProcDoneReply, ProcEnd, ProcInput, ProcInputReply,
    ProcOutput, ProcOutputReply, ProcRef, ProcResize, ProcSignal, ProcSignalledReply, ProcStart,
    ProcStartedReply, ProcState, ProcessInfo, ProcessesReply, PtySize, Signal, MAX_ARGV_BYTES,
    MAX_ARGV_ITEMS, MAX_OUTPUT_WAIT_MS, MAX_PROC_CHUNK_BYTES, MAX_PROC_TIMEOUT_MS,
};
pub use sessions::{
    ClosedReply, Lifetime, LifetimeEnd, RestoredReply, SessionInfo, SessionSetup, SessionState,
    SessionUsage, SessionsReply, SnapshotInfo, SnapshotReply, SnapshotsReply,
};
pub use spawn::{
    Isolation, Limits, Permissions, PermissionsRequest, RestartPolicy, SpawnReply, SpawnRequest,
};
pub use state::{
    DeleteReply, FetchReply, KeyRequest, KeysReply, KeysRequest, Scope, StoreReply, StoreRequest,
    MAX_KEYS_LISTED, MAX_KEY_LEN, MAX_TTL_SECS, MAX_VALUE_DEPTH,
};
pub use task::{
    PromptIteration, PromptRequest, PromptResult, StoppedResult, TaskCancelReply, TaskDispatch,
    TaskDispatchReply, TaskInfo, TaskKind, TaskList, TaskListReply, TaskOwner, TaskProgress,
    TaskRef, TaskReply, TaskRequest, TaskState, TaskWait, DEFAULT_ITERATIONS, MAX_ITERATIONS,
    MAX_LIST_LIMIT, MAX_WAIT_MS,
};
pub use templates::{
    check_packages, check_requirements, requirement_lines, TemplateInfo, TemplateRemovedReply,
    TemplatesReply, MAX_REQUIREMENTS_BYTES, MAX_TEMPLATE_PACKAGES,
};
pub use think::{ChatMessage, ThinkReply, ThinkRequest, Usage};
pub use tool::{
    Detail, ServerInfo, ToolCall, ToolDescription, ToolListReply, ToolReply, ToolSearchReply,
    DEFAULT_SEARCH_LIMIT, MAX_QUERY_BYTES, MAX_SEARCH_LIMIT, MAX_TOOL_TIMEOUT_MS,
};
pub use volumes::{
    check_mounts, RemovedReply, VolumeInfo, VolumeMount, VolumeRemovedReply, VolumeReply,
    VolumesReply, MAX_VOLUMES, MAX_VOLUME_PATH_LEN, MIN_VOLUME_BYTES,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorCode, ErrorReply};

    #[test]
    fn invalid_json_is_a_bad_request_saying_so() {
        let err = parse_json::<KillRequest>("KILL", b"{not json").unwrap_err();
        assert_eq!(err.code, ErrorCode::BadRequest);
        assert!(err.error.contains("not valid JSON"), "{}", err.error);
    }

    #[test]
    fn trailing_garbage_is_refused() {
        let err = parse_json::<KillRequest>("KILL", br#"{"id":1} x"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::BadRequest);
    }

    #[test]
    fn nested_field_errors_name_the_full_path() {
        let err = parse_json::<SpawnRequest>(
            "SPAWN",
            br#"{"name":"a","command":["/bin/true"],"limits":{"memory":"lots"}}"#,
        )
        .unwrap_err();
        assert!(err.error.contains("`limits.memory`"), "{}", err.error);
    }

    #[test]
    fn every_request_refuses_a_field_it_does_not_know_naming_it() {
        type Parse = fn(&[u8]) -> Result<(), ErrorReply>;
        let exec: Parse = |p| ExecCall::parse(p).map(drop);
        let task: Parse = |p| TaskRequest::parse(p).map(drop);
        let think: Parse = |p| ThinkRequest::parse(p).map(drop);
        let net: Parse = |p| NetRequest::parse(p).map(drop);
        let refused: [(Parse, &str, &str); 20] = [
            (
                |p| HelloRequest::parse(p).map(drop),
                r#"{"client":"x"}"#,
                "client",
            ),
            (
                |p| ListRequest::parse(p).map(drop),
                r#"{"all":true}"#,
                "all",
            ),
            (
                |p| KillRequest::parse(p).map(drop),
                r#"{"id":1,"grace":5}"#,
                "grace",
            ),
            (
                |p| LogsRequest::parse(p).map(drop),
                r#"{"id":1,"folow":true}"#,
                "folow",
            ),
            (think, r#"{"prompt":"hi","temprature":1}"#, "temprature"),
            (
                think,
                r#"{"messages":[{"role":"user","content":"hi","nmae":"x"}]}"#,
                "nmae",
            ),
            (
                |p| ToolCall::parse(p).map(drop),
                r#"{"op":"list","serach":"x"}"#,
                "serach",
            ),
            (exec, r#"{"code":"1","timout_ms":5}"#, "timout_ms"),
            (
                exec,
                r#"{"code":"1","limits":{"memroy":1048576}}"#,
                "memroy",
            ),
            (exec, r#"{"code":"1","permissions":{"thnk":false}}"#, "thnk"),
            (
                exec,
                r#"{"code":"1","network":{"allow":[],"alow":["x"]}}"#,
                "alow",
            ),
            (
                net,
                r#"{"op":"set","id":1,"network":{"deny":[],"dney":["x"]}}"#,
                "dney",
            ),
            (
                task,
                r#"{"op":"dispatch","kind":"exec","request":{"code":"1","limits":{"memroy":1}}}"#,
                "memroy",
            ),
            (
                exec,
                r#"{"op":"close","session":"s","sesion":"t"}"#,
                "sesion",
            ),
            (
                task,
                r#"{"op":"dispatch","kind":"think","request":"hi","lable":"x"}"#,
                "lable",
            ),
            (
                task,
                r#"{"op":"dispatch","kind":"exec","request":{"code":"1","sesion":"s"}}"#,
                "sesion",
            ),
            (
                task,
                r#"{"op":"dispatch","kind":"prompt","request":{"prompt":"x","max_iteration":2}}"#,
                "max_iteration",
            ),
            (task, r#"{"op":"status","task_id":"t","tsak":1}"#, "tsak"),
            (task, r#"{"op":"list","sate":"running"}"#, "sate"),
            (
                |p| SpawnRequest::parse(p).map(drop),
                r#"{"name":"a","command":["x"],"permissions":{"spwn":true}}"#,
                "spwn",
            ),
        ];
        for (parse, json, misspelt) in refused {
            let err = parse(json.as_bytes()).unwrap_err();
            assert_eq!(err.code, ErrorCode::BadRequest, "{json}");
            assert!(
                err.error.contains(&format!("`{misspelt}`")),
                "{json}: {}",
                err.error
            );
        }
    }

    /// `value` with a field no kernel knows yet added to every object in it.
    fn with_newer_fields(value: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::Object(fields) => {
                let mut fields: serde_json::Map<_, _> = fields
                    .into_iter()
                    .map(|(key, value)| (key, with_newer_fields(value)))
                    .collect();
                fields.insert("added_later".into(), serde_json::json!({"n": 1}));
                Value::Object(fields)
            }
            Value::Array(items) => Value::Array(items.into_iter().map(with_newer_fields).collect()),
            other => other,
        }
    }

    fn reads_newer_fields<T>(sample: &str)
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let reply: T = serde_json::from_str(sample).unwrap();
        let newer = with_newer_fields(serde_json::to_value(&reply).unwrap());
        let read: T =
            serde_json::from_value(newer.clone()).unwrap_or_else(|err| panic!("{err}: {newer}"));
        assert_eq!(read, reply);
    }

    #[test]
    fn replies_read_fields_a_newer_kernel_adds_at_any_depth() {
        reads_newer_fields::<AgentInfo>(
            r#"{"id":3,"name":"w","pid":42,"state":"running","status":"running",
                "running":true,"exit_code":null,"signal":null,"oom_killed":false,
                "restarts":0,"started_at":"2026-01-01T00:00:00Z","uptime_ms":5,
                "limits":{"memory":1048576,"max_pids":8},
                "memory":{"current":1,"peak":2},
                "cpu":{"usage_usec":1,"nr_throttled":0,"throttled_usec":0},
                "pids":{"current":1,"max":8},"llm":{"calls":0,"tokens":0},
                "isolation":{"sandboxed":true,"namespaces":["pid"],"cgroup":"v1"},
                "network":{"allow":["pypi.org:443"],"deny":[]},
                "connections":{"allowed":1,"refused":0,"bytes_out":2,"bytes_in":3}}"#,
        );
        reads_newer_fields::<NetReply>(
            r#"{"success":true,"id":3,"name":"w","network":{"allow":["*"],"deny":["10.0.0.0/8"]},
                "totals":{"allowed":1,"refused":1,"bytes_out":0,"bytes_in":0},
                "attempts":[{"at_ms":1,"host":"h","port":443,"allowed":false,
                             "reason":"denied","bytes_out":0,"bytes_in":0,"duration_ms":0}],
                "dropped":0}"#,
        );
    }

    #[test]
    fn requests_serialise_to_the_payload_their_parser_reads() {
        fn payload(request: &impl serde::Serialize) -> Vec<u8> {
            serde_json::to_vec(request).unwrap()
        }
        for call in [
            ExecCall::Run(Box::new(ExecRequest {
                code: "print(1)".into(),
                session: Some("s".into()),
                limits: Some(Limits {
                    max_pids: Some(8),
                    ..Limits::default()
                }),
                network: Some(Network::Policy(Box::new(NetworkPolicy {
                    allow: vec!["pypi.org:443".into()],
                    deny: vec!["10.0.0.0/8".into()],
                }))),
                ..ExecRequest::default()
            })),
            ExecCall::Sessions { usage: false },
            ExecCall::Sessions { usage: true },
            ExecCall::Close {
                session: "s".into(),
            },
            ExecCall::Snapshot {
                session: "s".into(),
                name: "n".into(),
                state: true,
            },
            ExecCall::Restore {
                session: "s".into(),
                name: "n".into(),
                into: Some("b".into()),
            },
            ExecCall::RemoveSnapshot {
                session: "s".into(),
                name: "n".into(),
            },
            ExecCall::Snapshots {
                session: "s".into(),
            },
        ] {
            assert_eq!(ExecCall::parse(&payload(&call)).unwrap(), call);
        }
        let arguments = serde_json::Map::from_iter([("message".to_owned(), "hi".into())]);
        for call in [
            ToolCall::List,
            ToolCall::Search {
                query: "read file".into(),
                detail: Detail::Full,
                limit: DEFAULT_SEARCH_LIMIT,
            },
            ToolCall::Call {
                server: "everything".into(),
                tool: "echo".into(),
                arguments,
                timeout_ms: Some(5),
                trace: None,
            },
        ] {
            assert_eq!(ToolCall::parse(&payload(&call)).unwrap(), call);
        }
        let spawn = SpawnRequest {
            script: Some("/srv/agent.py".into()),
            args: vec!["-v".into()],
            sandboxed: false,
            restart_policy: RestartPolicy::OnFailure,
            max_restarts: 2,
            permissions: PermissionsRequest {
                spawn: Some(true),
                ..PermissionsRequest::default()
            },
            ..SpawnRequest::named("w")
        };
        assert_eq!(SpawnRequest::parse(&payload(&spawn)).unwrap(), spawn);
    }

    #[test]
    fn the_clove_sdks_exec_fields_stay_accepted() {
        let call = ExecCall::parse(
            br#"{"command":"ls","cwd":"/tmp","timeout":3,"async":false,"request_id":"r-1"}"#,
        )
        .unwrap();
        let ExecCall::Run(run) = call else {
            panic!("not a run: {call:?}")
        };
        assert_eq!((run.language, run.timeout_ms), (Language::Bash, Some(3000)));
        // The one op a run names is `run`.
        assert!(ExecCall::parse(br#"{"op":"run","code":"1"}"#).is_ok());
        assert!(ExecRequest::parse(br#"{"op":"close","code":"1"}"#).is_err());
    }

    #[test]
    fn names_reject_path_tricks_and_odd_characters() {
        for bad in ["", ".", "..", "a..b", "a/b", "a\0b", "ä", &"x".repeat(65)] {
            assert!(validate_name("name", bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "A-1", "w.1", "_x", &"x".repeat(64)] {
            assert!(validate_name("name", good).is_ok(), "{good:?} refused");
        }
    }
}
