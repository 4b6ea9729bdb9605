//! What an exec host runs: the zygote, a Python program that never runs
//! request code itself but forks run children from its warm image, as a
//! sandbox workload; and the settings it reads first from its channel.
//!
//! The program is one `python -I -S -c` text joined from parts in
//! `zygote/`, each owning one concern and saying so at its top, in a fixed
//! order: the wire's names and sizes first, generated from `wire`
//! ([`wire::python_prelude`]) so the two sides cannot drift, then this
//! file's own names ([`WORKSPACE`]), then the parts. Each part may use
//! what an earlier one defines at its top level; functions may call any.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use super::wire::{self, Settings};
use crate::sandbox::mounts::{PROC_MASKED, PROC_READ_ONLY};
use crate::sandbox::plan::Workload;
pub use crate::sandbox::plan::{SESSION_HOME, TEMPLATE_ROOT};
use crate::sandbox::seccomp;
use crate::sandbox::spec::Bind;

/// The zygote's parts, in the order they are joined.
const PARTS: &str = concat!(
    include_str!("zygote/framing.py"),
    "\n\n",
    include_str!("zygote/isolation.py"),
    "\n\n",
    include_str!("zygote/cgroups.py"),
    "\n\n",
    include_str!("zygote/files.py"),
    "\n\n",
    include_str!("zygote/state.py"),
    "\n\n",
    include_str!("zygote/running.py"),
    "\n\n",
    include_str!("zygote/session_disk.py"),
    "\n\n",
    include_str!("zygote/child.py"),
    "\n\n",
    include_str!("zygote/steward.py"),
    "\n\n",
    include_str!("zygote/steward_files.py"),
    "\n\n",
    include_str!("zygote/site_builtins.py"),
    "\n\n",
    include_str!("zygote/main.py"),
);

/// Each run's working directory and home, a tmpfs of its own (a
/// session's, on its disk).
pub const WORKSPACE: &str = "/workspace";
/// A session's own Python environment, in its home ([`SESSION_HOME`], on
/// its disk, with pip's and npm's caches): what its code installs.
pub const SESSION_VENV: &str = "/home/user/.venv";

/// The zygote's whole program: the wire's prelude, this file's names, then
/// the parts.
static PROGRAM: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}WORKSPACE = {WORKSPACE:?}\nSESSION_VENV = {SESSION_VENV:?}\n\
         TEMPLATE_ROOT = {TEMPLATE_ROOT:?}\n\n\n{PARTS}",
        wire::python_prelude()
    )
});

/// The zygote's source, run as `python -I -S -c`.
pub fn program() -> &'static str {
    &PROGRAM
}

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

/// Why no zygote can run on this host, if none can: its isolation needs
/// namespaces, and `python` must exist.
pub fn unavailable(python: &Path, namespaces: bool) -> Option<String> {
    if !namespaces {
        return Some(
            "EXEC needs namespaces for its isolation, and this host gives the daemon none"
                .to_owned(),
        );
    }
    if !python.exists() {
        return Some(format!("exec.python ({}) does not exist", python.display()));
    }
    None
}

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
            program().into(),
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

/// What a run has beside [`run_env`] on a session's disk (`on_disk`: its
/// home, and its own Python environment first on the path, as an
/// activated one is) and from a template (its programs on the path).
pub fn disk_env(on_disk: bool, template: bool) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut path = Vec::new();
    if on_disk {
        env.insert("HOME".to_owned(), SESSION_HOME.to_owned());
        env.insert("VIRTUAL_ENV".to_owned(), SESSION_VENV.to_owned());
        env.insert("TMPDIR".to_owned(), "/tmp".to_owned());
        // Asking the index for pip's own version on every install is a
        // request the policy may refuse, and noise in the output.
        env.insert("PIP_DISABLE_PIP_VERSION_CHECK".to_owned(), "1".to_owned());
        path.push(format!("{SESSION_VENV}/bin"));
    }
    if template {
        path.push(format!("{TEMPLATE_ROOT}/bin"));
    }
    if !path.is_empty() {
        path.push("/usr/local/bin:/usr/bin:/bin".to_owned());
        env.insert("PATH".to_owned(), path.join(":"));
    }
    env
}

/// The environment every run starts with; a request's `env` adds to it.
pub fn run_env() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("HOME".to_owned(), WORKSPACE.to_owned()),
    ])
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::io::Write;
    use std::process::{Command, Stdio};

    use agentos_proto::payload::Language;

    use super::*;
    use crate::exec::wire::{
        OrderOp, PrepareOrder, ReadyMessage, Report, RunEnd, RunOrder, StewardOrder, LANGUAGES,
    };

    /// The keys of `value` as serde writes it (a struct: its fields).
    fn fields<T: serde::Serialize>(value: &T) -> BTreeSet<String> {
        match serde_json::to_value(value).unwrap() {
            serde_json::Value::Object(map) => map.keys().cloned().collect(),
            other => panic!("not a struct: {other}"),
        }
    }

    fn is_ident(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '_'
    }

    /// A string literal in Python code: its text, where it starts (its
    /// prefix or opening quote) and where what follows it starts.
    struct Literal {
        text: String,
        start: usize,
        end: usize,
    }

    /// The plain string literals of Python `code` (bytes aside); comments
    /// skipped.
    fn python_strings(code: &str) -> Vec<Literal> {
        let bytes = code.as_bytes();
        let mut found = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'#' => {
                    while i < bytes.len() && bytes[i] != b'\n' {
                        i += 1;
                    }
                }
                quote @ (b'"' | b'\'') => {
                    let mut start = i;
                    while start > 0 && bytes[start - 1].is_ascii_alphabetic() {
                        start -= 1;
                    }
                    let prefix = code[start..i].to_ascii_lowercase();
                    let triple = bytes[i..].starts_with(&[quote; 3]);
                    let delimiter = if triple { 3 } else { 1 };
                    let mut j = i + delimiter;
                    while j < bytes.len() && !bytes[j..].starts_with(&vec![quote; delimiter]) {
                        j += if bytes[j] == b'\\' { 2 } else { 1 };
                    }
                    let end = (j + delimiter).min(bytes.len());
                    if !prefix.contains('b') {
                        found.push(Literal {
                            text: code[i + delimiter..j.min(bytes.len())].to_owned(),
                            start,
                            end,
                        });
                    }
                    i = end;
                }
                _ => i += 1,
            }
        }
        found
    }

    /// The names `receiver` is read at: `receiver["name"]` and
    /// `receiver.get("name"`.
    fn keys_read(code: &str, receiver: &str) -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        for opening in [format!("{receiver}[\""), format!("{receiver}.get(\"")] {
            for (at, _) in code.match_indices(&opening) {
                if code[..at].chars().next_back().is_some_and(is_ident) {
                    continue;
                }
                let rest = &code[at + opening.len()..];
                keys.insert(rest.chars().take_while(|c| is_ident(*c)).collect());
            }
        }
        keys
    }

    /// The keys of the dict literals in `code`: `{"name": ` and `, "name": `.
    fn dict_keys(code: &str) -> BTreeSet<String> {
        python_strings(code)
            .into_iter()
            .filter(|literal| {
                let before = code[..literal.start].trim_end();
                code[literal.end..].starts_with(':')
                    && (before.ends_with('{') || before.ends_with(','))
            })
            .map(|literal| literal.text)
            .collect()
    }

    fn a_run_order() -> RunOrder {
        RunOrder {
            op: OrderOp::Run,
            code: String::new(),
            language: Language::Python,
            env: BTreeMap::new(),
            cwd: None,
            files: BTreeMap::new(),
            collect: Vec::new(),
            max_file_bytes: 0,
            max_collect_bytes: 0,
            keep: false,
            on_disk: true,
            template: true,
            join: 0,
            trace: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            print_last_expression: true,
            skip_if_not_code: true,
            load_state: true,
        }
    }

    #[test]
    fn the_program_is_the_prelude_then_every_part_in_order() {
        let program = program();
        assert!(program.starts_with(&wire::python_prelude()));
        assert!(program.contains("\nWORKSPACE = \"/workspace\"\n"));
        let parts = [
            include_str!("zygote/framing.py"),
            include_str!("zygote/isolation.py"),
            include_str!("zygote/cgroups.py"),
            include_str!("zygote/files.py"),
            include_str!("zygote/state.py"),
            include_str!("zygote/running.py"),
            include_str!("zygote/session_disk.py"),
            include_str!("zygote/child.py"),
            include_str!("zygote/site_builtins.py"),
            include_str!("zygote/main.py"),
        ];
        let mut from = 0;
        for part in parts {
            // Each says what it owns before anything else.
            assert!(part.starts_with("# "), "{}", &part[..40]);
            let at = program[from..].find(part).expect("every part, in order");
            from += at + part.len();
        }
        assert!(program.ends_with("if __name__ == \"__main__\":\n    main()\n"));
    }

    #[test]
    fn python_strings_are_found_outside_comments_and_bytes() {
        let code = "a = \"x\"  # \"y\"\nb = b\"z\" + 'w' + \"\"\"t\"q\"\"\" + f\"{a}\\\"\"";
        let found: Vec<String> = python_strings(code).into_iter().map(|l| l.text).collect();
        assert_eq!(found, ["x", "w", "t\"q", "{a}\\\""]);
        assert_eq!(
            keys_read("request.get(\"op\", 1) + xrequest[\"no\"]", "request").len(),
            1
        );
        assert_eq!(
            dict_keys("{\"a\": 1, \"b\": f(\"c\"), 'd':\"e\"}"),
            BTreeSet::from(["a".to_owned(), "b".to_owned(), "d".to_owned()])
        );
    }

    #[test]
    fn the_program_compiles_as_python() {
        let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists());
        let Some(python) = python else {
            eprintln!("!!! NOT TESTED: no python3 to compile the zygote with");
            return;
        };
        let mut child = Command::new(python)
            .args(["-I", "-S", "-c"])
            .arg("import sys; compile(sys.stdin.read(), '<zygote>', 'exec')")
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(program().as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    #[test]
    fn the_parts_take_the_wires_names_from_the_prelude() {
        let mut names: Vec<String> = OrderOp::ALL
            .iter()
            .map(|op| serde_json::to_value(op).unwrap())
            .chain(LANGUAGES.iter().map(|l| serde_json::to_value(l).unwrap()))
            .map(|name| name.as_str().unwrap().to_owned())
            .collect();
        names.push("cgroup".into());
        names.push("reload_tools".into());
        for literal in python_strings(PARTS) {
            // A program's name in an argv (["bash", ...]) is not the wire's,
            // nor is a dict's key (a message's field, checked below).
            let argv0 = PARTS[..literal.start].trim_end().ends_with('[');
            let is_key = PARTS[literal.end..].starts_with(':');
            assert!(
                !names.contains(&literal.text) || argv0 || is_key,
                "a part spells the wire's {:?} itself, before: {}",
                literal.text,
                PARTS[..literal.start].lines().last().unwrap_or_default()
            );
        }
    }

    #[test]
    fn the_parts_read_and_write_only_fields_the_wire_has() {
        let orders: BTreeSet<String> = fields(&a_run_order())
            .into_iter()
            .chain(fields(&PrepareOrder::new(false)))
            .collect();
        let read = keys_read(PARTS, "request");
        assert!(!read.is_empty());
        assert!(read.is_subset(&orders), "{read:?} not all in {orders:?}");

        let settings = fields(&crate::exec::wire::Settings {
            run_filter: String::new(),
            tmp_bytes: 0,
            workspace_bytes: 0,
            proc_masked: &[],
            proc_read_only: &[],
            run_env: BTreeMap::new(),
            tools_path: None,
        });
        let read = keys_read(PARTS, "SETTINGS");
        assert!(
            read.is_subset(&settings),
            "{read:?} not all in {settings:?}"
        );
        assert_eq!(read, settings, "every setting is read");

        let end = RunEnd {
            exit_code: 0,
            error: None,
            files: BTreeMap::new(),
            uncollected: Vec::new(),
            workspace_bytes: None,
            left_out: Vec::new(),
            not_code: None,
        };
        let ends = fields(&end);
        let ready = fields(&ReadyMessage {
            ready: 0,
            cgroup: 0,
        });
        let written = keys_read(PARTS, "end");
        assert!(written.is_subset(&ends), "{written:?} not all in {ends:?}");
        let (steward_orders, reports) = steward_fields();
        let read = keys_read(PARTS, "order");
        assert!(
            read.contains("argv") && read.is_subset(&steward_orders),
            "{read:?}"
        );
        let (file_calls, file_replies) = file_fields();
        let read = keys_read(PARTS, "call");
        assert!(
            read.contains("path") && read.is_subset(&file_calls),
            "{read:?} not all in {file_calls:?}"
        );
        let scope = BTreeSet::from(["__name__".to_owned(), "__builtins__".to_owned()]);
        let keys = dict_keys(PARTS);
        assert!(keys.contains("exit_code") && keys.contains("ready") && keys.contains("started"));
        for key in keys {
            assert!(
                [&ends, &ready, &scope, &reports, &file_replies]
                    .iter()
                    .any(|known| known.contains(&key)),
                "a part writes {key:?}, which no message of the wire has"
            );
        }
    }

    /// The fields of the file ops a steward is given, and of its replies
    /// to them.
    fn file_fields() -> (BTreeSet<String>, BTreeSet<String>) {
        use agentos_proto::payload::{
            ExecCall, FileEntry, FileEntryReply, FileListReply, FileMadeReply, FileReadReply,
            FileRemovedReply, FileType, FileWatchReply, WatchEvent, WatchEventType,
        };
        let calls = [
            r#"{"op": "list", "session": "s", "path": "/", "depth": 2}"#,
            r#"{"op": "mkdir", "session": "s", "path": "/a", "parents": true}"#,
            r#"{"op": "move", "session": "s", "from": "/a", "to": "/b"}"#,
            r#"{"op": "read", "session": "s", "path": "/a", "length": 2}"#,
            r#"{"op": "write", "session": "s", "path": "/a", "parents": true, "metadata": {}}"#,
            r#"{"op": "watch", "session": "s", "path": "/a", "recursive": true}"#,
        ];
        let mut call_fields = BTreeSet::new();
        for call in calls {
            let ExecCall::Files(call) = ExecCall::parse(call.as_bytes()).unwrap() else {
                panic!("not a file op: {call}");
            };
            call_fields.extend(fields(&call));
        }
        let entry = FileEntry {
            name: String::new(),
            path: String::new(),
            kind: FileType::File,
            size: 0,
            mode: 0,
            permissions: String::new(),
            owner: String::new(),
            group: String::new(),
            modified_at: String::new(),
            symlink_target: Some(String::new()),
            metadata: BTreeMap::from([(String::new(), String::new())]),
        };
        let replies = [
            fields(&entry),
            fields(&FileEntryReply {
                success: true,
                entry: entry.clone(),
            }),
            fields(&FileListReply {
                success: true,
                entries: Vec::new(),
                truncated: false,
            }),
            fields(&FileMadeReply {
                success: true,
                created: true,
                entry,
            }),
            fields(&FileRemovedReply {
                success: true,
                removed: true,
            }),
            fields(&FileReadReply {
                success: true,
                data: String::new(),
                offset: 0,
                size: 0,
                eof: true,
            }),
            fields(&FileWatchReply {
                success: true,
                watch: String::new(),
            }),
            fields(&WatchEvent {
                kind: WatchEventType::Create,
                path: String::new(),
                name: String::new(),
            }),
        ];
        (call_fields, replies.into_iter().flatten().collect())
    }

    /// The fields of the steward's orders, and of its reports.
    fn steward_fields() -> (BTreeSet<String>, BTreeSet<String>) {
        let (argv, env) = (Vec::new(), BTreeMap::new());
        let call = agentos_proto::payload::FileCall::Stat(Default::default());
        let orders = [
            StewardOrder::Start {
                reference: 1,
                argv: &argv,
                env: &env,
                cwd: None,
                stdin: false,
                pty: false,
            },
            StewardOrder::Signal {
                reference: 1,
                pid: 2,
                signal: 9,
            },
            StewardOrder::File {
                reference: 1,
                call: &call,
            },
            StewardOrder::Unwatch { reference: 1 },
        ];
        let reports = [
            Report::Hello { hello: 1 },
            Report::Started {
                started: 1,
                pid: 2,
                cwd: String::new(),
            },
            Report::Failed {
                failed: 1,
                errno: 2,
                error: String::new(),
            },
            Report::Signalled {
                signalled: 1,
                sent: true,
            },
            Report::Done {
                done: 1,
                reply: String::new(),
            },
            Report::Events {
                events: 1,
                list: Vec::new(),
            },
            Report::Ended {
                ended: 2,
                exit_code: None,
                signal: None,
            },
        ];
        (
            orders.iter().flat_map(fields).collect(),
            reports.iter().flat_map(fields).collect(),
        )
    }

    #[test]
    fn no_two_parts_define_the_same_name() {
        // One program: a later part's `def reap` would silently replace
        // an earlier one's.
        let mut seen = BTreeSet::new();
        for line in PARTS.lines() {
            let name = ["def ", "class "]
                .iter()
                .find_map(|keyword| line.strip_prefix(keyword))
                .map(|rest| {
                    rest.chars()
                        .take_while(|c| is_ident(*c))
                        .collect::<String>()
                });
            if let Some(name) = name {
                assert!(seen.insert(name.clone()), "two parts define {name:?}");
            }
        }
        assert!(seen.contains("serve_run") && seen.contains("reap_processes"));
    }
}
