//! What an exec host runs: the zygote, with the settings it reads from its
//! environment (and removes from it before anything else runs).

use std::path::PathBuf;

use crate::sandbox::mounts::{PROC_MASKED, PROC_READ_ONLY};
use crate::sandbox::plan::Workload;
use crate::sandbox::seccomp;

use super::wire::ZYGOTE;

/// How an exec host is set up.
#[derive(Clone, Debug)]
pub struct HostSetup {
    /// The Python the zygote (and every run) uses.
    pub python: PathBuf,
    /// Run children kept prepared.
    pub ready_runs: usize,
    /// Size of each run's /tmp, in bytes.
    pub tmp_bytes: u64,
    /// Size of each run's /workspace, in bytes.
    pub workspace_bytes: u64,
}

/// The zygote as a sandbox workload.
pub fn zygote_workload(setup: &HostSetup) -> Workload {
    let filter: String = seccomp::filter()
        .to_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Workload {
        name: "exec-host".into(),
        program: setup.python.clone(),
        argv: vec![
            "python3".into(),
            "-I".into(),
            "-S".into(),
            "-c".into(),
            ZYGOTE.into(),
        ],
        env: vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("LANG".into(), "C.UTF-8".into()),
            (
                "AGENTOS_EXEC_READY_RUNS".into(),
                setup.ready_runs.to_string(),
            ),
            ("AGENTOS_EXEC_RUN_FILTER".into(), filter),
            ("AGENTOS_EXEC_TMP_BYTES".into(), setup.tmp_bytes.to_string()),
            (
                "AGENTOS_EXEC_WORKSPACE_BYTES".into(),
                setup.workspace_bytes.to_string(),
            ),
            ("AGENTOS_EXEC_PROC_MASKED".into(), PROC_MASKED.join(":")),
            (
                "AGENTOS_EXEC_PROC_READ_ONLY".into(),
                PROC_READ_ONLY.join(":"),
            ),
        ],
        cwd: None,
        script: None,
        binds: Vec::new(),
        socket: None,
    }
}
