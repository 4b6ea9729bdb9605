//! What an exec host runs: the zygote, a Python program that never runs
//! request code itself but forks run children from its warm image, as a
//! sandbox workload; and the settings it reads first from its channel.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::wire::Settings;
use crate::sandbox::mounts::{PROC_MASKED, PROC_READ_ONLY};
use crate::sandbox::plan::Workload;
use crate::sandbox::seccomp;
use crate::sandbox::spec::Bind;

/// The zygote's source, run as `python -I -S -c`.
pub const ZYGOTE: &str = include_str!("zygote.py");

/// How an exec host is set up.
#[derive(Clone, Debug)]
pub struct ExecHostSetup {
    /// The Python the zygote (and every run) uses.
    pub python: PathBuf,
    /// Run children kept prepared.
    pub ready_runs: usize,
    /// Size of each run's /tmp, in bytes.
    pub tmp_bytes: u64,
    /// Size of each run's /workspace, in bytes.
    pub workspace_bytes: u64,
    /// The `tools` package's directory, seen by runs as [`TOOLS_PATH`].
    pub tools_dir: Option<PathBuf>,
}

/// Where runs find the `tools` package (on their `sys.path`).
pub const TOOLS_PATH: &str = "/tools";

/// The zygote as a sandbox workload. Its environment holds nothing but
/// what any program needs: every run's `/proc/1/environ` shows it.
pub fn workload(setup: &ExecHostSetup) -> Workload {
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
        ],
        cwd: None,
        script: None,
        binds: binds(setup),
        socket: None,
    }
}

/// What an exec host's workload binds into its sandbox, beside the shape's
/// own: the `tools` package.
pub fn binds(setup: &ExecHostSetup) -> Vec<Bind> {
    setup
        .tools_dir
        .iter()
        .map(|dir| Bind {
            source: dir.clone(),
            target: PathBuf::from(TOOLS_PATH),
            writable: false,
        })
        .collect()
}

/// The zygote's settings: the first datagram on its channel.
pub fn settings(setup: &ExecHostSetup) -> Vec<u8> {
    let run_filter: String = seccomp::filter()
        .to_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Settings {
        run_filter,
        tmp_bytes: setup.tmp_bytes,
        workspace_bytes: setup.workspace_bytes,
        proc_masked: &PROC_MASKED,
        proc_read_only: &PROC_READ_ONLY,
        run_env: run_env(),
        tools_path: setup.tools_dir.as_ref().map(|_| TOOLS_PATH),
    }
    .encode()
}

/// The environment every run starts with; a request's `env` adds to it.
pub fn run_env() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("HOME".to_owned(), "/workspace".to_owned()),
    ])
}
