//! From a SPAWN request to the program to run: which executable, which
//! arguments, which directories it needs — checked up front so that a
//! missing script or interpreter is a clear SPAWN error, not a mysterious
//! exit.
//!
//! Paths are looked up where the caller lives ([`Lookup`]): on the host
//! for an operator, with every symlink and `..` resolved before anything
//! is bound; in the calling agent's own view for an agent, so that what
//! the agent cannot see, its child cannot get — and a path it cannot see
//! is refused with the very words a missing one is.

use std::path::{Path, PathBuf};

use agentos_proto::payload::{bad_request, SpawnRequest};
use agentos_proto::{ErrorCode, ErrorReply};

pub use crate::sandbox::lookup::Lookup;
use crate::sandbox::lookup::{executable, interpreter_dirs, Dirs, Found};
use crate::sandbox::plan::TEMPLATE_ROOT;
use crate::sandbox::spec::Bind;

/// The resolved program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// The executable.
    pub program: PathBuf,
    /// argv, argv[0] first.
    pub argv: Vec<String>,
    /// The script, when the request gave one.
    pub script: Option<PathBuf>,
    /// The interpreter, when the request gave a script (its own name, not
    /// its symlinks' target: a virtual environment's `bin/python`).
    pub interpreter: Option<PathBuf>,
    /// The same interpreter on the host, for what the kernel checks of it
    /// itself (see `interpreter`).
    pub interpreter_on_host: Option<PathBuf>,
    /// The working directory, when the request gave one.
    pub cwd: Option<PathBuf>,
    /// Directories outside the system ones the workload needs, read-only:
    /// its script's, its program's, its interpreter's installation.
    pub binds: Vec<Bind>,
}

/// A boot agent is started by the kernel, before any volume is mounted:
/// it has none.
pub fn check_no_volumes(request: &SpawnRequest) -> Result<(), ErrorReply> {
    if request.volumes.is_empty() {
        return Ok(());
    }
    Err(ErrorReply::new(
        ErrorCode::BadRequest,
        "`volumes`: a boot agent has no volumes; SPAWN an agent with them once the kernel runs",
    ))
}

/// Environment variables the kernel sets and a request may not override.
pub const RESERVED_ENV: [&str; 3] = ["AGENTOS_SOCKET", "AGENTOS_AGENT_ID", "AGENTOS_AGENT_NAME"];

/// Resolves and checks the program of a SPAWN request. `default_python`
/// runs scripts whose request names no interpreter.
pub fn resolve(
    request: &SpawnRequest,
    default_python: &Path,
    lookup: Lookup<'_>,
) -> Result<Program, ErrorReply> {
    let cwd = match &request.cwd {
        Some(cwd) if !Path::new(cwd).is_absolute() => {
            return Err(bad_request(format!(
                "SPAWN field `cwd` must be an absolute path (got {cwd:?})"
            )))
        }
        // Entered by the workload's own chdir, inside its sandbox. An agent's
        // child may only be sent where the agent itself may go: a directory
        // it cannot enter is answered as one that does not exist, here,
        // rather than by a chdir that would tell the two apart.
        Some(cwd) if matches!(lookup, Lookup::View(_)) && !lookup.enterable(Path::new(cwd)) => {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("directory {cwd} does not exist{}", lookup.context()),
            ))
        }
        cwd => cwd.as_ref().map(PathBuf::from),
    };
    let mut dirs = Dirs::default();
    if let Some(script) = &request.script {
        if !Path::new(script).is_absolute() {
            return Err(bad_request(format!(
                "SPAWN field `script` must be an absolute path (got {script:?}); the SDK makes \
                 relative paths absolute for you"
            )));
        }
        let script = lookup.readable(Path::new(script)).ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::NotFound,
                format!("script {script} does not exist{}", lookup.context()),
            )
        })?;
        if !script.meta.is_file() {
            return Err(bad_request(format!(
                "script {} is not a regular file",
                script.inside.display()
            )));
        }
        if request.template.is_some() && request.python.is_none() {
            return Ok(from_template(request, &script, cwd, dirs));
        }
        let python = request
            .python
            .as_ref()
            .map_or_else(|| default_python.to_path_buf(), PathBuf::from);
        if !python.is_absolute() {
            return Err(bad_request(format!(
                "SPAWN field `python` must be an absolute path (got {})",
                python.display()
            )));
        }
        let interpreter = executable(&python, lookup).ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::NotFound,
                format!(
                    "interpreter {} does not exist or is not executable{}; name another with \
                     `python`, or set agents.python in the kernel config",
                    python.display(),
                    lookup.context()
                ),
            )
        })?;
        dirs.add_parent_of(&script);
        interpreter_dirs(&interpreter, lookup, &mut dirs);
        let mut argv = vec![
            interpreter.inside.display().to_string(),
            script.inside.display().to_string(),
        ];
        argv.extend(request.args.iter().cloned());
        return Ok(Program {
            program: interpreter.inside.clone(),
            argv,
            script: Some(script.inside),
            interpreter_on_host: Some(interpreter.host),
            interpreter: Some(interpreter.inside),
            cwd,
            binds: dirs.binds(),
        });
    }
    let command = request.command.as_deref().unwrap_or_default();
    let Some(first) = command.first() else {
        return Err(bad_request(
            "SPAWN needs a `script` path or a `command` argv",
        ));
    };
    let mut program = PathBuf::from(first);
    if first.contains('/') {
        if !program.is_absolute() {
            return Err(bad_request(format!(
                "SPAWN `command[0]` must be an absolute path or a bare program name (got {first:?})"
            )));
        }
        let found = executable(&program, lookup).ok_or_else(|| {
            ErrorReply::new(
                ErrorCode::NotFound,
                format!(
                    "program {first} does not exist or is not executable{}",
                    lookup.context()
                ),
            )
        })?;
        dirs.add_parent_of(&found);
        program = found.inside;
    }
    let mut argv: Vec<String> = command.to_vec();
    argv.extend(request.args.iter().cloned());
    Ok(Program {
        program,
        argv,
        script: None,
        interpreter: None,
        interpreter_on_host: None,
        cwd,
        binds: dirs.binds(),
    })
}

/// A script run by its template's interpreter, which lies in the
/// template's environment, mounted in the sandbox alone.
fn from_template(
    request: &SpawnRequest,
    script: &Found,
    cwd: Option<PathBuf>,
    mut dirs: Dirs,
) -> Program {
    dirs.add_parent_of(script);
    let python = Path::new(TEMPLATE_ROOT).join("bin").join("python");
    let mut argv = vec![
        python.display().to_string(),
        script.inside.display().to_string(),
    ];
    argv.extend(request.args.iter().cloned());
    Program {
        program: python.clone(),
        argv,
        script: Some(script.inside.clone()),
        interpreter_on_host: None,
        interpreter: Some(python),
        cwd,
        binds: dirs.binds(),
    }
}

/// Refuses a request that tries to set the kernel's own variables.
pub fn check_env(request: &SpawnRequest) -> Result<(), ErrorReply> {
    match request
        .env
        .keys()
        .find(|k| RESERVED_ENV.contains(&k.as_str()))
    {
        Some(key) => Err(bad_request(format!(
            "SPAWN field `env`: {key} is set by the kernel and cannot be overridden"
        ))),
        None => Ok(()),
    }
}

/// The workload's environment: the kernel's base, then the request's
/// (which [`check_env`] has vetted).
pub fn environment(
    request: &SpawnRequest,
    id: u32,
    socket: &Path,
    home: &Path,
) -> Vec<(String, String)> {
    let system_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    let path = match &request.template {
        Some(_) => format!("{TEMPLATE_ROOT}/bin:{system_path}"),
        None => system_path.to_owned(),
    };
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), path),
        ("HOME".into(), home.display().to_string()),
        ("TMPDIR".into(), "/tmp".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("PYTHONUNBUFFERED".into(), "1".into()),
        ("AGENTOS_SOCKET".into(), socket.display().to_string()),
        ("AGENTOS_AGENT_ID".into(), id.to_string()),
        ("AGENTOS_AGENT_NAME".into(), request.name.clone()),
    ];
    if request.template.is_some() {
        env.push(("VIRTUAL_ENV".into(), TEMPLATE_ROOT.into()));
    }
    for (key, value) in &request.env {
        env.retain(|(k, _)| k != key);
        env.push((key.clone(), value.clone()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::spec::RootFs;
    use crate::sandbox::view::{View, ViewUser};
    use std::os::unix::fs::PermissionsExt;

    fn request(json: &str) -> SpawnRequest {
        SpawnRequest::parse(json.as_bytes()).unwrap()
    }

    /// `path` with its directory resolved on the host.
    fn entry(path: &str) -> PathBuf {
        let path = Path::new(path);
        std::fs::canonicalize(path.parent().unwrap())
            .unwrap()
            .join(path.file_name().unwrap())
    }

    #[test]
    fn scripts_run_with_the_default_interpreter() {
        let dir = tempfile::tempdir().unwrap();
        let script = std::fs::canonicalize(dir.path()).unwrap().join("a.py");
        std::fs::write(&script, "print(1)").unwrap();
        let req = request(&format!(
            r#"{{"name":"w","script":"{}","args":["--x"]}}"#,
            script.display()
        ));
        let program = resolve(&req, Path::new("/bin/sh"), Lookup::Host).unwrap();
        assert_eq!(program.program, entry("/bin/sh"));
        assert_eq!(
            program.argv,
            vec![
                entry("/bin/sh").display().to_string(),
                script.display().to_string(),
                "--x".into()
            ]
        );
        assert_eq!(program.script.as_deref(), Some(script.as_path()));
        assert_eq!(program.binds.len(), 1);
        assert_eq!(program.binds[0].target, script.parent().unwrap());
    }

    #[test]
    fn dot_dot_and_symlinks_are_resolved_before_anything_is_bound() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(real.join("scripts")).unwrap();
        std::fs::write(real.join("scripts/a.py"), "").unwrap();
        std::os::unix::fs::symlink(real.join("scripts"), real.join("link")).unwrap();
        for given in [
            format!("{}/link/a.py", real.display()),
            format!("{}/scripts/../scripts/./a.py", real.display()),
            format!("/tmp/../{}/link/a.py", real.display()),
        ] {
            let req = request(&format!(r#"{{"name":"w","script":"{given}"}}"#));
            let program = resolve(&req, Path::new("/bin/sh"), Lookup::Host).unwrap();
            assert_eq!(program.script, Some(real.join("scripts/a.py")), "{given}");
            assert_eq!(program.binds[0].source, real.join("scripts"), "{given}");
            assert_eq!(program.binds[0].target, real.join("scripts"), "{given}");
        }
        // `/tmp/../etc/passwd` is /etc/passwd: a system file, nothing to bind.
        let req = request(r#"{"name":"w","script":"/tmp/../etc/passwd","python":"/bin/cat"}"#);
        let program = resolve(&req, Path::new("/bin/sh"), Lookup::Host).unwrap();
        assert_eq!(program.script.as_deref(), Some(Path::new("/etc/passwd")));
        assert!(program.binds.is_empty(), "{:?}", program.binds);
    }

    #[test]
    fn missing_scripts_and_interpreters_are_named() {
        let err = resolve(
            &request(r#"{"name":"w","script":"/nope/a.py"}"#),
            Path::new("/bin/sh"),
            Lookup::Host,
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        assert!(err.error.contains("/nope/a.py"), "{}", err.error);
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("a.py");
        std::fs::write(&script, "").unwrap();
        let err = resolve(
            &request(&format!(
                r#"{{"name":"w","script":"{}","python":"/no/python"}}"#,
                script.display()
            )),
            Path::new("/bin/sh"),
            Lookup::Host,
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        assert!(err.error.contains("/no/python"), "{}", err.error);
    }

    #[test]
    fn relative_paths_are_refused() {
        let err = resolve(
            &request(r#"{"name":"w","script":"a.py"}"#),
            Path::new("/bin/sh"),
            Lookup::Host,
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::BadRequest);
        let err = resolve(
            &request(r#"{"name":"w","command":["./x"]}"#),
            Path::new("/bin/sh"),
            Lookup::Host,
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::BadRequest);
    }

    #[test]
    fn bare_commands_are_looked_up_inside() {
        let program = resolve(
            &request(r#"{"name":"w","command":["sleep","1"]}"#),
            Path::new("/bin/sh"),
            Lookup::Host,
        )
        .unwrap();
        assert_eq!(program.program, Path::new("sleep"));
        assert_eq!(program.argv, vec!["sleep".to_owned(), "1".into()]);
        assert!(program.binds.is_empty());
    }

    #[test]
    fn a_virtual_environment_brings_its_base_installation() {
        let base = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(base.path()).unwrap();
        let install = base.join("versions/3.11");
        std::fs::create_dir_all(install.join("bin")).unwrap();
        std::fs::write(install.join("bin/python3.11"), "").unwrap();
        std::fs::set_permissions(
            install.join("bin/python3.11"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let venv = base.join("project/.venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::os::unix::fs::symlink(install.join("bin/python3.11"), venv.join("bin/python"))
            .unwrap();
        std::fs::write(
            venv.join("pyvenv.cfg"),
            format!(
                "home = {}\ninclude-system-site-packages = false\n",
                install.join("bin").display()
            ),
        )
        .unwrap();
        std::fs::write(base.join("a.py"), "").unwrap();
        let req = request(&format!(
            r#"{{"name":"w","script":"{}","python":"{}"}}"#,
            base.join("a.py").display(),
            venv.join("bin/python").display()
        ));
        let program = resolve(&req, Path::new("/bin/sh"), Lookup::Host).unwrap();
        // The environment's own name runs, so Python finds its pyvenv.cfg.
        assert_eq!(program.program, venv.join("bin/python"));
        let targets: Vec<&Path> = program.binds.iter().map(|b| b.target.as_path()).collect();
        // The script's directory holds both the venv and the installation.
        assert_eq!(targets, [base.as_path()], "{targets:?}");
        let req = request(&format!(
            r#"{{"name":"w","command":["{}"]}}"#,
            venv.join("bin/python").display()
        ));
        let program = resolve(&req, Path::new("/bin/sh"), Lookup::Host).unwrap();
        let targets: Vec<&Path> = program.binds.iter().map(|b| b.target.as_path()).collect();
        assert_eq!(targets, [venv.join("bin").as_path()], "{targets:?}");
    }

    #[test]
    fn system_interpreters_need_nothing_extra() {
        let mut dirs = Dirs::default();
        let python = Lookup::Host.entry(Path::new("/bin/sh")).unwrap();
        interpreter_dirs(&python, Lookup::Host, &mut dirs);
        assert!(dirs.binds().is_empty());
    }

    /// An agent's SPAWN: only what the agent sees, and hidden paths are
    /// refused with the words a missing one gets.
    #[test]
    fn an_agents_paths_are_looked_up_in_its_view() {
        use std::os::unix::fs::PermissionsExt;
        let host = tempfile::tempdir().unwrap();
        let host = std::fs::canonicalize(host.path()).unwrap();
        for dir in ["agent", "elsewhere"] {
            std::fs::create_dir(host.join(dir)).unwrap();
            std::fs::set_permissions(host.join(dir), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        for file in ["agent/child.py", "elsewhere/secret.py"] {
            std::fs::write(host.join(file), "").unwrap();
            std::fs::set_permissions(host.join(file), std::fs::Permissions::from_mode(0o644))
                .unwrap();
        }
        let root = RootFs {
            staging: "/stage".into(),
            binds: vec![Bind {
                source: "/usr".into(),
                target: "/usr".into(),
                writable: false,
            }],
            symlinks: std::fs::read_link("/bin")
                .map(|target| crate::sandbox::spec::Symlink {
                    path: "/bin".into(),
                    target,
                })
                .into_iter()
                .collect(),
            ..RootFs::default()
        };
        let claimed = [Bind {
            source: host.join("agent"),
            target: "/srv/agent".into(),
            writable: false,
        }];
        let viewer = ViewUser {
            uid: 65534,
            gid: 65534,
        };
        let view = View::of(&root, &claimed, viewer);
        let spawn = |json: String| {
            resolve(
                &request(&json),
                Path::new("/usr/bin/python3"),
                Lookup::View(&view),
            )
        };
        let child = spawn(r#"{"name":"c","script":"/srv/agent/child.py"}"#.into()).unwrap();
        assert_eq!(
            child.script.as_deref(),
            Some(Path::new("/srv/agent/child.py"))
        );
        assert_eq!(child.binds.len(), 1);
        assert_eq!(child.binds[0].source, host.join("agent"));
        assert_eq!(child.binds[0].target, Path::new("/srv/agent"));
        let hidden = host.join("elsewhere/secret.py");
        let refusal = |path: &str| {
            let err = spawn(format!(r#"{{"name":"c","script":"{path}"}}"#)).unwrap_err();
            assert_eq!(err.code, ErrorCode::NotFound, "{path}");
            err.error.replace(path, "PATH")
        };
        assert_eq!(
            refusal(hidden.to_str().unwrap()),
            refusal("/srv/agent/missing.py")
        );
        assert_eq!(refusal("/srv/agent/../../.."), refusal("/srv/nothing"));
    }

    #[test]
    fn kernel_variables_cannot_be_overridden() {
        let req = request(r#"{"name":"w","command":["true"],"env":{"AGENTOS_SOCKET":"/x"}}"#);
        assert!(check_env(&req).is_err());
        let req = request(r#"{"name":"w","command":["true"],"env":{"PATH":"/opt/bin"}}"#);
        assert!(check_env(&req).is_ok());
        let env = environment(&req, 7, Path::new("/s"), Path::new("/h"));
        assert!(env.contains(&("PATH".into(), "/opt/bin".into())));
        assert!(env.contains(&("AGENTOS_AGENT_ID".into(), "7".into())));
        assert_eq!(env.iter().filter(|(k, _)| k == "PATH").count(), 1);
    }
}
