//! Python environments the kernel looks for when none is configured: the
//! project's own `.venv` (which `scripts/setup` makes in a source tree),
//! and what an environment's site directories hold.
//!
//! Both the local model server and agents' scripts default to the
//! project's `.venv`, found the same way, so a fresh checkout after
//! `scripts/setup` needs no `python` setting at all. Everything here reads
//! the filesystem only: running an interpreter to ask it would take tens of
//! milliseconds, too long for the reactor.

use std::path::{Path, PathBuf};

/// The interpreter when neither the config nor the project has one.
pub const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Where the project's `.venv/bin/python` may be, most likely first: in a
/// directory above the daemon's binary (`target/<profile>/agentosd` in its
/// source tree), then in the source tree it was built from (an installed
/// copy elsewhere). Paths are spelled without `..`: a confined process sees
/// only the directories on the path to its interpreter. Only existing
/// paths are returned.
pub fn project_pythons() -> Vec<PathBuf> {
    let built_in = source_tree().map(|tree| tree.join(".venv/bin/python"));
    let above_binary: Vec<PathBuf> = std::env::current_exe()
        .map(|exe| {
            exe.ancestors()
                .skip(1)
                .take(4)
                .map(|dir| dir.join(".venv/bin/python"))
                .collect()
        })
        .unwrap_or_default();
    let mut found: Vec<PathBuf> = Vec::new();
    for python in above_binary.into_iter().chain(built_in) {
        if python.exists() && !found.contains(&python) {
            found.push(python);
        }
    }
    found
}

/// The source tree the daemon was built from.
pub fn source_tree() -> Option<&'static Path> {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent()
}

/// The first of the project's environments whose site directories hold
/// `package` (a path relative to a site directory, such as
/// `agentos/__init__.py`).
pub fn project_python_with(package: &str) -> Option<PathBuf> {
    project_pythons()
        .into_iter()
        .find(|python| has_package(python, package))
}

/// Whether `package` (relative to a site directory) is in one of
/// `python`'s site directories.
pub fn has_package(python: &Path, package: &str) -> bool {
    site_dirs(python)
        .iter()
        .any(|dir| dir.join(package).exists())
}

/// The directories `python` imports installed packages from, as far as
/// the filesystem tells: a virtual environment's own `site-packages` (and
/// its base installation's, when its `pyvenv.cfg` includes them), or an
/// installation's `site-packages` and Debian's `dist-packages`. A user's
/// own site directory is left out: agents run with a home of their own.
pub fn site_dirs(python: &Path) -> Vec<PathBuf> {
    let Some(env) = python.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    let config = std::fs::read_to_string(env.join("pyvenv.cfg")).ok();
    let Some(config) = config else {
        // Not a virtual environment: an installation, whose prefix is
        // above the real binary's `bin`.
        let real = std::fs::canonicalize(python).unwrap_or_else(|_| python.to_path_buf());
        return real
            .parent()
            .and_then(Path::parent)
            .map(installation_site_dirs)
            .unwrap_or_default();
    };
    let mut dirs = versioned(&env.join("lib"), "site-packages");
    let includes_base = config_value(&config, "include-system-site-packages")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if includes_base {
        let base = config_value(&config, "home")
            .map(PathBuf::from)
            .and_then(|home| home.parent().map(Path::to_path_buf));
        if let Some(base) = base {
            dirs.extend(installation_site_dirs(&base));
        }
    }
    dirs
}

/// An installation's site directories under `prefix`.
fn installation_site_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut dirs = versioned(&prefix.join("lib"), "site-packages");
    dirs.extend(versioned(&prefix.join("lib"), "dist-packages"));
    dirs.extend(versioned(&prefix.join("local/lib"), "dist-packages"));
    dirs.extend(versioned(&prefix.join("local/lib"), "site-packages"));
    dirs.retain(|dir| dir.is_dir());
    dirs
}

/// `lib/python3*/<leaf>` for every Python under `lib` (Debian's
/// version-less `python3` included).
fn versioned(lib: &Path, leaf: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(lib) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join(leaf))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// A `key = value` line of a `pyvenv.cfg`.
fn config_value<'a>(config: &'a str, key: &str) -> Option<&'a str> {
    config.lines().find_map(|line| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn venv_with(package: Option<&str>, includes_base: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path();
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(venv.join("bin/python"), "").unwrap();
        std::fs::create_dir_all(venv.join("lib/python3.11/site-packages")).unwrap();
        std::fs::write(
            venv.join("pyvenv.cfg"),
            format!("home = /nonexistent/bin\ninclude-system-site-packages = {includes_base}\n"),
        )
        .unwrap();
        if let Some(package) = package {
            let path = venv.join("lib/python3.11/site-packages").join(package);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        dir
    }

    #[test]
    fn a_virtual_environment_is_searched_in_its_own_site_packages() {
        let with = venv_with(Some("agentos/__init__.py"), false);
        assert!(has_package(
            &with.path().join("bin/python"),
            "agentos/__init__.py"
        ));
        let without = venv_with(None, false);
        assert!(!has_package(
            &without.path().join("bin/python"),
            "agentos/__init__.py"
        ));
        assert_eq!(
            site_dirs(&without.path().join("bin/python")),
            [without.path().join("lib/python3.11/site-packages")]
        );
    }

    #[test]
    fn pyvenv_cfg_values_are_read_by_key() {
        let cfg = "home = /opt/py/bin\ninclude-system-site-packages = false\n";
        assert_eq!(config_value(cfg, "home"), Some("/opt/py/bin"));
        assert_eq!(
            config_value(cfg, "include-system-site-packages"),
            Some("false")
        );
        assert_eq!(config_value(cfg, "version"), None);
    }

    #[test]
    fn a_missing_interpreter_has_no_site_directories() {
        assert!(site_dirs(Path::new("/nonexistent/bin/python")).is_empty());
        assert!(site_dirs(Path::new("python")).is_empty());
    }
}
