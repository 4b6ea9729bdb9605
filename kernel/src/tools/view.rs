//! What a confined MCP server sees beside the system directories, and the
//! private home it writes in.
//!
//! Read-only: its program's installation (the `node_modules` tree it lies
//! in, else its directory, else only itself), the interpreter its `#!`
//! line names, its working directory, the existing absolute paths among
//! its arguments — and for an argument that is a script (`.js`, `.mjs`,
//! `.cjs`, `.py`), the whole package the script belongs to, which `node`
//! or `python` must read to import its dependencies — and the Python
//! installation each environment among those was made from. Writable: its
//! `writable` directories and its home.
//!
//! A package is never one of the directories a server must not see whole:
//! `/`, a user's home directory (or a directory holding one), or the
//! kernel's state directory (or anything in it, or holding it). A script
//! whose package would be one of those brings in only itself.

use std::fs::DirBuilder;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::config::mcp::McpServerConfig;
use crate::sandbox::lookup::interpreter_binds;
use crate::sandbox::plan::is_system;
use crate::sandbox::spec::{Bind, User};

/// File names that make a script an interpreter's program, whose package
/// is brought in.
const SCRIPT_EXTENSIONS: [&str; 4] = ["js", "mjs", "cjs", "py"];
/// What marks a directory as an installation a script's imports resolve
/// in: looked for first, nearest first.
const INSTALL_MARKERS: [&str; 3] = ["node_modules", "pyvenv.cfg", ".venv"];
/// What marks a directory as a package's root, when no installation is
/// found.
const PACKAGE_MARKERS: [&str; 2] = ["package.json", "pyproject.toml"];

/// The directories no server is shown whole.
#[derive(Clone, Debug)]
pub struct Withheld {
    /// Users' home directories (`/root`, `/home/ann`, ...).
    pub homes: Vec<PathBuf>,
    /// The kernel's state directory (the servers' homes are inside it).
    pub state_dir: PathBuf,
}

impl Withheld {
    /// The host's users' homes (from `/etc/passwd`, and `/root` and `/home`
    /// in any case) and the kernel's `state_dir`.
    pub fn of_host(state_dir: &Path) -> Withheld {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let mut homes: Vec<PathBuf> = passwd
            .lines()
            .filter_map(|line| line.split(':').nth(5))
            .filter(|home| home.starts_with('/'))
            .map(PathBuf::from)
            .collect();
        homes.extend(["/root", "/home"].map(PathBuf::from));
        Withheld {
            homes,
            state_dir: std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_owned()),
        }
    }

    /// Whether `dir` may not be shown whole: it is `/`, holds a home
    /// directory, or holds or lies in the state directory.
    fn withholds(&self, dir: &Path) -> bool {
        dir == Path::new("/")
            || self.homes.iter().any(|home| home.starts_with(dir))
            || self.touches_state(dir)
    }

    /// Whether `path` (resolved) holds or lies in the state directory,
    /// which no server sees, whoever names it.
    fn touches_state(&self, path: &Path) -> bool {
        let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        self.state_dir.starts_with(&real) || real.starts_with(&self.state_dir)
    }
}

/// The package a script belongs to: the outermost `node_modules` it lies
/// in; else the nearest directory above it holding an installation
/// (`node_modules`, `pyvenv.cfg`, `.venv`), else a package's root
/// (`package.json`, `pyproject.toml`); else its own directory. The search
/// stops at a withheld directory; `None` when even the script's own
/// directory is withheld.
pub fn package_of(script: &Path, withheld: &Withheld) -> Option<PathBuf> {
    let real = std::fs::canonicalize(script).ok()?;
    // Node looks for a dependency in every `node_modules` above the
    // importing file: the outermost holds them all.
    if let Some(modules) = real
        .ancestors()
        .filter(|dir| dir.file_name().is_some_and(|name| name == "node_modules"))
        .last()
    {
        return (!withheld.withholds(modules)).then(|| modules.to_owned());
    }
    let above: Vec<&Path> = real
        .ancestors()
        .skip(1)
        .take_while(|dir| !withheld.withholds(dir))
        .collect();
    let holding = |markers: &[&str]| {
        above
            .iter()
            .find(|dir| markers.iter().any(|m| dir.join(m).exists()))
            .map(|dir| dir.to_path_buf())
    };
    holding(&INSTALL_MARKERS)
        .or_else(|| holding(&PACKAGE_MARKERS))
        .or_else(|| above.first().map(|dir| dir.to_path_buf()))
}

/// Whether an argument names a script an interpreter runs.
fn is_script(arg: &Path) -> bool {
    arg.is_absolute()
        && arg.is_file()
        && arg
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| SCRIPT_EXTENSIONS.contains(&e))
}

/// What a confined server sees beside the system directories (see the
/// module's doc); `home` is its private home, writable.
pub fn server_binds(
    program: &Path,
    config: &McpServerConfig,
    home: Option<&Path>,
    withheld: &Withheld,
) -> Vec<Bind> {
    let mut binds = Vec::new();
    let mut read_only = |path: &Path| {
        if path.is_absolute()
            && path.exists()
            && !is_system(path)
            && path != Path::new("/")
            && !withheld.touches_state(path)
        {
            binds.push(Bind {
                source: path.to_path_buf(),
                target: path.to_path_buf(),
                writable: false,
            });
        }
    };
    let real = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
    // A program in a `node_modules` tree needs the tree; any other, its
    // directory (its libraries beside it) — unless that is withheld: then
    // only the program itself.
    let in_modules = real.ancestors().any(|dir| dir.ends_with("node_modules"));
    let installation = match real.parent() {
        _ if in_modules => package_of(&real, withheld),
        Some(dir) if !withheld.withholds(dir) => Some(dir.to_owned()),
        _ => None,
    };
    read_only(installation.as_deref().unwrap_or(&real));
    let interpreter = shebang(&real);
    if let Some(interpreter) = &interpreter {
        read_only(interpreter.parent().unwrap_or(Path::new("/")));
    }
    for path in config.cwd.iter() {
        read_only(path);
    }
    for arg in config.args.iter().map(Path::new) {
        match is_script(arg).then(|| package_of(arg, withheld)).flatten() {
            Some(package) => read_only(&package),
            None => read_only(arg),
        }
    }
    // A Python environment among what it sees (a project's `.venv`) runs
    // on the installation it was made from, which must be seen too.
    let environments: Vec<PathBuf> = binds
        .iter()
        .flat_map(|b| {
            [
                b.source.join("bin/python"),
                b.source.join(".venv/bin/python"),
            ]
        })
        .filter(|python| python.exists())
        .collect();
    let mut binds: Vec<Bind> = binds
        .into_iter()
        .chain(interpreter_binds(program))
        .chain(
            interpreter
                .map(|i| interpreter_binds(&i))
                .unwrap_or_default(),
        )
        .chain(
            environments
                .iter()
                .flat_map(|python| interpreter_binds(python)),
        )
        .collect();
    binds.sort_by(|a, b| a.target.cmp(&b.target));
    binds.dedup_by(|a, b| a.target == b.target);
    // Writable directories last, so they lie over a read-only one above.
    let writable = config.writable.iter().map(PathBuf::as_path).chain(home);
    binds.extend(writable.map(|dir| Bind {
        source: dir.to_path_buf(),
        target: dir.to_path_buf(),
        writable: true,
    }));
    binds
}

/// The interpreter a script's `#!` line names, unless it is a system one
/// (`/usr/bin/env node` finds node among the system directories).
fn shebang(program: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line);
    let interpreter = PathBuf::from(line.lines().next()?.split_whitespace().next()?);
    (!is_system(&interpreter)).then_some(interpreter)
}

/// Makes (or keeps) server `name`'s private home, `<state_dir>/mcp/<name>/home`:
/// its `HOME`, where npm, uv and pip keep their caches, so a server that
/// installs itself on its first start (`npx`, `uvx`) starts offline and
/// fast after that. Only its `user` may enter it (0700); the directories
/// above are the kernel's (0700), so no server reaches another's.
pub fn private_home(state_dir: &Path, name: &str, user: Option<User>) -> io::Result<PathBuf> {
    let server_dir = state_dir.join("mcp").join(name);
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&server_dir)?;
    let home = server_dir.join("home");
    match DirBuilder::new().mode(0o700).create(&home) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(err),
    }
    // Never follow a link planted in its place.
    if !std::fs::symlink_metadata(&home)?.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            home.display()
        )));
    }
    if let Some(user) = user {
        std::os::unix::fs::lchown(&home, Some(user.uid), Some(user.gid))?;
    }
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
    Ok(home)
}

/// Why a server running as `user` could not write in its `writable`
/// directory `dir`, in words that say what to do; `None` when it can (or
/// it runs as the kernel's own user, who gave it the directory). The
/// kernel never changes who owns a user's directory: the operator does.
pub fn unwritable(dir: &Path, user: Option<User>) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let user = user?;
    let meta = match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => meta,
        Ok(_) => return Some(format!("its writable {} is not a directory", dir.display())),
        Err(err) => return Some(format!("its writable {}: {err}", dir.display())),
    };
    let mode = meta.mode();
    let writable = (meta.uid() == user.uid && mode & 0o200 != 0)
        || (meta.gid() == user.gid && mode & 0o020 != 0)
        || mode & 0o002 != 0;
    (!writable).then(|| {
        format!(
            "it runs as uid {uid}, which cannot write in its writable {dir} (owner uid {owner}, \
             mode {mode:o}): give that user the directory (`chown -R {uid}:{gid} {dir}`) or \
             name one it owns; the kernel never changes a directory's owner",
            uid = user.uid,
            gid = user.gid,
            dir = dir.display(),
            owner = meta.uid(),
            mode = mode & 0o7777,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_writable_directory_the_servers_user_cannot_write_is_said_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let nobody = User {
            uid: 65534,
            gid: 65534,
        };
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let said = unwritable(dir.path(), Some(nobody)).unwrap();
        assert!(said.contains("runs as uid 65534"), "{said}");
        assert!(said.contains("chown -R 65534:65534"), "{said}");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(unwritable(dir.path(), Some(nobody)), None);
        // The kernel's own user gave it the directory: nothing to check.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(unwritable(dir.path(), None), None);
        let missing = dir.path().join("missing");
        assert!(unwritable(&missing, Some(nobody)).is_some());
    }

    /// A host tree: a home, a state directory, and projects in each.
    struct Host {
        dir: tempfile::TempDir,
        withheld: Withheld,
    }

    impl Host {
        fn new() -> Host {
            let dir = tempfile::tempdir().unwrap();
            let withheld = Withheld {
                homes: vec![dir.path().join("home/ann")],
                state_dir: dir.path().join("state"),
            };
            Host { dir, withheld }
        }

        fn file(&self, relative: &str) -> PathBuf {
            let path = self.dir.path().join(relative);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, "").unwrap();
            path
        }

        fn path(&self, relative: &str) -> PathBuf {
            self.dir.path().join(relative)
        }
    }

    #[test]
    fn a_scripts_package_is_its_project_or_the_outermost_node_modules() {
        let host = Host::new();
        // A built project: its dependencies beside its package.json, and a
        // package.json of its own in dist/ (`{"type": "module"}`).
        host.file("srv/server/package.json");
        host.file("srv/server/node_modules/zod/index.js");
        let built = host.file("srv/server/dist/index.js");
        host.file("srv/server/dist/package.json");
        assert_eq!(
            package_of(&built, &host.withheld),
            Some(host.path("srv/server"))
        );
        // An installed package: hoisted dependencies are in the outer tree.
        let installed = host.file("srv/app/node_modules/@x/server/dist/index.js");
        host.file("srv/app/node_modules/@x/server/node_modules/y/index.js");
        assert_eq!(
            package_of(&installed, &host.withheld),
            Some(host.path("srv/app/node_modules"))
        );
        // A Python project with its environment inside.
        host.file("srv/py/pyproject.toml");
        host.file("srv/py/.venv/pyvenv.cfg");
        let server = host.file("srv/py/src/server/main.py");
        assert_eq!(
            package_of(&server, &host.withheld),
            Some(host.path("srv/py"))
        );
        // No marker: its directory.
        let lone = host.file("srv/lone/server.py");
        assert_eq!(
            package_of(&lone, &host.withheld),
            Some(host.path("srv/lone"))
        );
    }

    #[test]
    fn no_package_is_a_home_the_state_directory_or_what_holds_them() {
        let host = Host::new();
        // A script right in a home, under a home holding package.json.
        host.file("home/ann/package.json");
        host.file("home/ann/node_modules/a/index.js");
        let in_home = host.file("home/ann/server.js");
        assert_eq!(package_of(&in_home, &host.withheld), None);
        // In a project inside the home: that project, never the home.
        let project = host.file("home/ann/proj/tool/server.js");
        assert_eq!(
            package_of(&project, &host.withheld),
            Some(host.path("home/ann/proj/tool"))
        );
        // Anything in the state directory (another server's home).
        host.file("state/mcp/other/home/package.json");
        let planted = host.file("state/mcp/other/home/x/server.js");
        assert_eq!(package_of(&planted, &host.withheld), None);
        // A directory above them all (holding the home and the state).
        let above = host.file("top.py");
        host.file("pyproject.toml");
        assert_eq!(package_of(&above, &host.withheld), None);
        // `/` is withheld by any host.
        let everyone = Withheld {
            homes: vec![],
            state_dir: "/nonexistent".into(),
        };
        assert!(everyone.withholds(Path::new("/")));
        // Named outright, the state directory and what is in it stay
        // hidden too.
        let tasks = host.file("state/tasks.db");
        let link = host.path("srv/link.js");
        fs::create_dir_all(host.path("srv")).unwrap();
        std::os::unix::fs::symlink(&planted, &link).unwrap();
        let config = McpServerConfig {
            command: "node".into(),
            args: [
                &tasks,
                &host.path("state"),
                &link,
                &host.dir.path().to_owned(),
            ]
            .map(|p| p.display().to_string())
            .into(),
            cwd: Some(host.path("state/mcp")),
            ..McpServerConfig::default()
        };
        let binds = server_binds(Path::new("/usr/bin/node"), &config, None, &host.withheld);
        assert!(binds.is_empty(), "{binds:?}");
        // A program right in a home brings in only itself.
        let program = host.file("home/ann/server");
        let config = McpServerConfig {
            command: program.display().to_string(),
            ..McpServerConfig::default()
        };
        let binds = server_binds(&program, &config, None, &host.withheld);
        let targets: Vec<&Path> = binds.iter().map(|b| b.target.as_path()).collect();
        assert_eq!(targets, [program.as_path()]);
        // Binds fall back to the script alone.
        let config = McpServerConfig {
            command: "node".into(),
            args: vec![in_home.display().to_string()],
            ..McpServerConfig::default()
        };
        let binds = server_binds(Path::new("/usr/bin/node"), &config, None, &host.withheld);
        let targets: Vec<&Path> = binds.iter().map(|b| b.target.as_path()).collect();
        assert_eq!(targets, [in_home.as_path()]);
    }

    #[test]
    fn a_server_sees_its_package_its_arguments_its_home_and_what_it_may_write() {
        let host = Host::new();
        let script = host.path("srv/node_modules/server/dist/index.js");
        fs::create_dir_all(script.parent().unwrap()).unwrap();
        fs::write(&script, "#!/usr/bin/env node\n").unwrap();
        let data = host.path("data");
        fs::create_dir(&data).unwrap();
        let home = host.path("state/mcp/x/home");
        let config = McpServerConfig {
            command: script.display().to_string(),
            args: vec![data.display().to_string(), "/usr/share".into(), "-v".into()],
            writable: vec![host.path("out")],
            ..McpServerConfig::default()
        };
        let binds = server_binds(&script, &config, Some(&home), &host.withheld);
        let seen: Vec<(&Path, bool)> = binds
            .iter()
            .map(|b| (b.target.as_path(), b.writable))
            .collect();
        let modules = host.path("srv/node_modules");
        assert!(seen.contains(&(modules.as_path(), false)), "{seen:?}");
        assert!(seen.contains(&(data.as_path(), false)), "{seen:?}");
        assert!(seen.contains(&(host.path("out").as_path(), true)));
        assert!(seen.contains(&(home.as_path(), true)), "{seen:?}");
        assert!(!seen.iter().any(|(p, _)| p.starts_with("/usr")), "{seen:?}");
    }

    #[test]
    fn a_projects_environment_brings_the_python_it_was_made_from() {
        let host = Host::new();
        let python = host.file("opt/python3.11/bin/python3");
        let project = host.path("srv/project");
        fs::create_dir_all(project.join(".venv/bin")).unwrap();
        std::os::unix::fs::symlink(&python, project.join(".venv/bin/python")).unwrap();
        fs::write(
            project.join(".venv/pyvenv.cfg"),
            format!("home = {}\n", python.parent().unwrap().display()),
        )
        .unwrap();
        let config = McpServerConfig {
            command: "uv".into(),
            args: ["--directory", project.to_str().unwrap(), "run", "server"]
                .map(String::from)
                .into(),
            ..McpServerConfig::default()
        };
        let binds = server_binds(Path::new("/usr/bin/uv"), &config, None, &host.withheld);
        let targets: Vec<&Path> = binds.iter().map(|b| b.target.as_path()).collect();
        let base = host.path("opt/python3.11");
        assert!(targets.contains(&base.as_path()), "{targets:?}");
        assert!(targets.contains(&project.as_path()), "{targets:?}");
    }

    #[test]
    fn a_servers_home_is_private_kept_and_never_a_planted_link() {
        let state = tempfile::tempdir().unwrap();
        let home = private_home(state.path(), "npx", None).unwrap();
        assert_eq!(home, state.path().join("mcp/npx/home"));
        fs::write(home.join("cached"), "kept").unwrap();
        let again = private_home(state.path(), "npx", None).unwrap();
        assert_eq!(fs::read_to_string(again.join("cached")).unwrap(), "kept");
        for dir in [state.path().join("mcp/npx"), home.clone()] {
            assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700, "{dir:?}");
        }
        let elsewhere = tempfile::tempdir().unwrap();
        fs::create_dir_all(state.path().join("mcp/evil")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), state.path().join("mcp/evil/home")).unwrap();
        assert!(private_home(state.path(), "evil", None).is_err());
    }
}
