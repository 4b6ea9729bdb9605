//! Whether the interpreter a SPAWN's script runs with can import the
//! `agentos` SDK. An agent whose Python lacks it dies at its first import;
//! SPAWN's reply warns of that up front, naming the interpreter and the
//! fix, rather than leaving the cause to the agent's log.
//!
//! The check reads the interpreter's site directories (running it would
//! take tens of milliseconds on the reactor) and is remembered per
//! interpreter until the interpreter or one of those directories changes
//! (their modification times), so a SPAWN pays for it once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::config::python_env;
use crate::config::SDK_PACKAGE;

/// Modification times that decide whether a remembered answer still holds:
/// the interpreter's, then each site directory's (installing a package
/// adds an entry to one).
type Stamp = Vec<Option<SystemTime>>;

/// Remembered answers, by the interpreter's host path.
#[derive(Debug, Default)]
pub struct SdkCheck {
    known: HashMap<PathBuf, (Stamp, bool)>,
}

impl SdkCheck {
    /// What SPAWN's reply should warn of for a script run by `interpreter`
    /// (its path on the host; `None`: a command, not a script).
    pub fn warnings(&mut self, interpreter: Option<&Path>) -> Vec<String> {
        let Some(python) = interpreter else {
            return Vec::new();
        };
        if self.can_import(python) {
            Vec::new()
        } else {
            vec![format!(
                "the interpreter {} cannot import the agentos SDK: give `python` or set \
                 agents.python",
                python.display()
            )]
        }
    }

    /// Whether `python` can import the SDK, from memory when nothing has
    /// changed since it was last looked at.
    fn can_import(&mut self, python: &Path) -> bool {
        let site_dirs = python_env::site_dirs(python);
        let stamp: Stamp = std::iter::once(python)
            .chain(site_dirs.iter().map(PathBuf::as_path))
            .map(|path| std::fs::metadata(path).and_then(|m| m.modified()).ok())
            .collect();
        if let Some((known_stamp, answer)) = self.known.get(python) {
            if *known_stamp == stamp {
                return *answer;
            }
        }
        let answer = site_dirs.iter().any(|dir| dir.join(SDK_PACKAGE).exists());
        self.known.insert(python.to_path_buf(), (stamp, answer));
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A virtual environment at `dir` with an empty `site-packages`.
    fn venv(dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::create_dir_all(dir.join("lib/python3.11/site-packages")).unwrap();
        std::fs::write(dir.join("pyvenv.cfg"), "home = /nonexistent/bin\n").unwrap();
        let python = dir.join("bin/python");
        std::fs::write(&python, "").unwrap();
        python
    }

    #[test]
    fn an_interpreter_without_the_sdk_is_named_in_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let python = venv(dir.path());
        let warnings = SdkCheck::default().warnings(Some(&python));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains(&python.display().to_string()));
        assert!(warnings[0].contains("agents.python"), "{}", warnings[0]);
        assert!(SdkCheck::default().warnings(None).is_empty());
    }

    #[test]
    fn installing_the_sdk_is_noticed_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let python = venv(dir.path());
        let mut check = SdkCheck::default();
        assert!(!check.can_import(&python));
        let site = dir.path().join("lib/python3.11/site-packages");
        // The directory's time has a granularity; make the change visible.
        let before = std::fs::metadata(&site).unwrap().modified().unwrap();
        std::fs::create_dir(site.join("agentos")).unwrap();
        std::fs::write(site.join("agentos/__init__.py"), "").unwrap();
        let later = before + std::time::Duration::from_secs(2);
        std::fs::File::open(&site)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert!(check.can_import(&python));
        assert!(check.warnings(Some(&python)).is_empty());
    }

    #[test]
    fn an_unchanged_interpreter_is_answered_from_memory() {
        let dir = tempfile::tempdir().unwrap();
        let python = venv(dir.path());
        let mut check = SdkCheck::default();
        assert!(!check.can_import(&python));
        // Forge the remembered answer: a second look that reads it back
        // proves nothing was checked again.
        if let Some((_, answer)) = check.known.get_mut(&python) {
            *answer = true;
        }
        assert!(check.can_import(&python));
    }
}
