//! From a SPAWN request to the program to run: which executable, which
//! arguments, which environment — checked up front so that a missing
//! script or interpreter is a clear SPAWN error, not a mysterious exit.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use agentos_proto::payload::{bad_request, SpawnRequest};
use agentos_proto::{ErrorCode, ErrorReply};

/// The resolved program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// The executable.
    pub program: PathBuf,
    /// argv, argv[0] first.
    pub argv: Vec<String>,
    /// The script, when the request gave one.
    pub script: Option<PathBuf>,
    /// The interpreter, when the request gave a script.
    pub interpreter: Option<PathBuf>,
    /// The working directory, when the request gave one.
    pub cwd: Option<PathBuf>,
}

/// Environment variables the kernel sets and a request may not override.
pub const RESERVED_ENV: [&str; 3] = ["AGENTOS_SOCKET", "AGENTOS_AGENT_ID", "AGENTOS_AGENT_NAME"];

/// Resolves and checks the program of a SPAWN request.
pub fn resolve(request: &SpawnRequest, default_python: &Path) -> Result<Program, ErrorReply> {
    let cwd = match &request.cwd {
        Some(cwd) if !Path::new(cwd).is_absolute() => {
            return Err(bad_request(format!(
                "SPAWN field `cwd` must be an absolute path (got {cwd:?})"
            )))
        }
        cwd => cwd.as_ref().map(PathBuf::from),
    };
    if let Some(script) = &request.script {
        let script = PathBuf::from(script);
        if !script.is_absolute() {
            return Err(bad_request(format!(
                "SPAWN field `script` must be an absolute path (got {:?}); the SDK makes \
                 relative paths absolute for you",
                script
            )));
        }
        match std::fs::metadata(&script) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => {
                return Err(ErrorReply::new(
                    ErrorCode::BadRequest,
                    format!("script {} is not a regular file", script.display()),
                ))
            }
            Err(_) => {
                return Err(ErrorReply::new(
                    ErrorCode::NotFound,
                    format!("script {} does not exist", script.display()),
                ))
            }
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
        if !is_executable(&python) {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!(
                    "interpreter {} does not exist or is not executable; name another with \
                     `python`, or set agents.python in the kernel config",
                    python.display()
                ),
            ));
        }
        let mut argv = vec![python.display().to_string(), script.display().to_string()];
        argv.extend(request.args.iter().cloned());
        return Ok(Program {
            program: python.clone(),
            argv,
            script: Some(script),
            interpreter: Some(python),
            cwd,
        });
    }
    let command = request.command.as_deref().unwrap_or_default();
    let Some(first) = command.first() else {
        return Err(bad_request(
            "SPAWN needs a `script` path or a `command` argv",
        ));
    };
    let program = PathBuf::from(first);
    if first.contains('/') {
        if !program.is_absolute() {
            return Err(bad_request(format!(
                "SPAWN `command[0]` must be an absolute path or a bare program name (got {first:?})"
            )));
        }
        if !is_executable(&program) {
            return Err(ErrorReply::new(
                ErrorCode::NotFound,
                format!("program {first} does not exist or is not executable"),
            ));
        }
    }
    let mut argv: Vec<String> = command.to_vec();
    argv.extend(request.args.iter().cloned());
    Ok(Program {
        program,
        argv,
        script: None,
        interpreter: None,
        cwd,
    })
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
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("HOME".into(), home.display().to_string()),
        ("TMPDIR".into(), "/tmp".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("PYTHONUNBUFFERED".into(), "1".into()),
        ("AGENTOS_SOCKET".into(), socket.display().to_string()),
        ("AGENTOS_AGENT_ID".into(), id.to_string()),
        ("AGENTOS_AGENT_NAME".into(), request.name.clone()),
    ];
    for (key, value) in &request.env {
        env.retain(|(k, _)| k != key);
        env.push((key.clone(), value.clone()));
    }
    env
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str) -> SpawnRequest {
        SpawnRequest::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn scripts_run_with_the_default_interpreter() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("a.py");
        std::fs::write(&script, "print(1)").unwrap();
        let req = request(&format!(
            r#"{{"name":"w","script":"{}","args":["--x"]}}"#,
            script.display()
        ));
        let program = resolve(&req, Path::new("/bin/sh")).unwrap();
        assert_eq!(program.program, Path::new("/bin/sh"));
        assert_eq!(
            program.argv,
            vec![
                "/bin/sh".to_owned(),
                script.display().to_string(),
                "--x".into()
            ]
        );
        assert_eq!(program.script.as_deref(), Some(script.as_path()));
    }

    #[test]
    fn missing_scripts_and_interpreters_are_named() {
        let err = resolve(
            &request(r#"{"name":"w","script":"/nope/a.py"}"#),
            Path::new("/bin/sh"),
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
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::BadRequest);
        let err = resolve(
            &request(r#"{"name":"w","command":["./x"]}"#),
            Path::new("/bin/sh"),
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::BadRequest);
    }

    #[test]
    fn bare_commands_are_looked_up_inside() {
        let program = resolve(
            &request(r#"{"name":"w","command":["sleep","1"]}"#),
            Path::new("/bin/sh"),
        )
        .unwrap();
        assert_eq!(program.program, Path::new("sleep"));
        assert_eq!(program.argv, vec!["sleep".to_owned(), "1".into()]);
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
