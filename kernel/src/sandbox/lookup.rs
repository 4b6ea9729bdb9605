//! Finding files where a caller lives: on the host, or in a sandboxed
//! agent's own view ([`super::view`]), with every symlink and `..`
//! resolved before anything is bound — and the directories a program or
//! an interpreter needs beyond the system ones, as read-only binds.

use std::fs::Metadata;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::plan::is_system;
use super::spec::Bind;
use super::view::{Seen, View, MAY_EXECUTE, MAY_READ};

/// Where paths are looked up.
#[derive(Clone, Copy, Debug)]
pub enum Lookup<'a> {
    /// On the host (an operator's SPAWN, or an agent that is not
    /// sandboxed and so sees the host).
    Host,
    /// In a sandboxed agent's own view.
    View(&'a View),
}

/// A path found by a [`Lookup`].
#[derive(Debug)]
pub struct Found {
    /// As the caller (and the workload) sees it, resolved.
    pub inside: PathBuf,
    /// The same file on the host.
    pub host: PathBuf,
    /// Its metadata.
    pub meta: Metadata,
}

impl Lookup<'_> {
    /// The file `path` names, every symlink and `..` resolved.
    pub fn file(&self, path: &Path) -> Option<Found> {
        match self {
            Lookup::Host => {
                let real = std::fs::canonicalize(path).ok()?;
                found(real.clone(), real)
            }
            Lookup::View(view) => seen(view.resolve(path).ok()?),
        }
    }

    /// `path` with its directory resolved and its last component kept.
    pub fn entry(&self, path: &Path) -> Option<Found> {
        match self {
            Lookup::Host => {
                let entry = std::fs::canonicalize(path.parent()?)
                    .ok()?
                    .join(path.file_name()?);
                found(entry.clone(), entry)
            }
            Lookup::View(view) => seen(view.resolve_entry(path).ok()?),
        }
    }

    /// The file `path` names if the caller may read it: one it may not is
    /// answered as one that does not exist (a script the child could not
    /// open would otherwise tell the parent that the file is there).
    pub fn readable(&self, path: &Path) -> Option<Found> {
        let file = self.file(path)?;
        match self {
            Lookup::Host => Some(file),
            Lookup::View(view) => view.may(&file.meta, MAY_READ).then_some(file),
        }
    }

    /// Whether `path` is a directory the caller may enter, or a place in
    /// its own sandbox (its `/tmp`, `/workspace`), which every sandbox has.
    pub fn enterable(&self, path: &Path) -> bool {
        match self {
            Lookup::Host => path.is_dir(),
            Lookup::View(view) => match view.resolve(path) {
                Ok(Seen::Private(_)) => true,
                Ok(Seen::Host { host, .. }) => std::fs::metadata(host)
                    .is_ok_and(|meta| meta.is_dir() && view.may(&meta, MAY_EXECUTE)),
                Err(_) => false,
            },
        }
    }

    /// Whether the caller may run `file`.
    pub fn may_execute(&self, file: &Found) -> bool {
        file.meta.is_file()
            && match self {
                Lookup::Host => file.meta.permissions().mode() & 0o111 != 0,
                Lookup::View(view) => view.may(&file.meta, MAY_EXECUTE),
            }
    }

    /// What a "missing" error adds for this caller.
    pub fn context(&self) -> &'static str {
        match self {
            Lookup::Host => "",
            Lookup::View(_) => {
                " in the calling agent's view (a child can be given only what its parent sees \
                 in its read-only directories, not its /tmp or /workspace)"
            }
        }
    }
}

pub fn found(inside: PathBuf, host: PathBuf) -> Option<Found> {
    let meta = std::fs::metadata(&host).ok()?;
    Some(Found { inside, host, meta })
}

fn seen(seen: Seen) -> Option<Found> {
    match seen {
        Seen::Host { inside, host } => found(inside, host),
        Seen::Private(_) => None,
    }
}

/// `path` as an executable the caller may run: its own name (resolved
/// directory), provided what it finally names is an executable file.
pub fn executable(path: &Path, lookup: Lookup<'_>) -> Option<Found> {
    let entry = lookup.entry(path)?;
    let file = lookup.file(path)?;
    lookup.may_execute(&file).then_some(entry)
}

/// Directories a workload needs beyond the system ones, found by a lookup.
#[derive(Debug, Default)]
pub struct Dirs(Vec<Bind>);

impl Dirs {
    pub fn add(&mut self, dir: Found) {
        if dir.meta.is_dir() && !is_system(&dir.inside) && dir.inside != Path::new("/") {
            self.0.push(Bind {
                source: dir.host,
                target: dir.inside,
                writable: false,
            });
        }
    }

    /// The directory holding `file`.
    pub fn add_parent_of(&mut self, file: &Found) {
        if let (Some(inside), Some(host)) = (file.inside.parent(), file.host.parent()) {
            if let Some(dir) = found(inside.to_path_buf(), host.to_path_buf()) {
                self.add(dir);
            }
        }
    }

    /// Sorted, without repeats or directories inside another one.
    pub fn binds(mut self) -> Vec<Bind> {
        self.0.sort_by(|a, b| a.target.cmp(&b.target));
        self.0.dedup_by(|a, b| a.target == b.target);
        let all = self.0.clone();
        self.0.retain(|d| {
            !all.iter()
                .any(|other| other.target != d.target && d.target.starts_with(&other.target))
        });
        self.0
    }
}

/// The host directories a Python interpreter needs beyond the system ones
/// (its installation, its virtual environment), for a child the kernel
/// runs itself.
pub fn interpreter_binds(python: &Path) -> Vec<Bind> {
    let mut dirs = Dirs::default();
    if let Some(entry) = Lookup::Host.entry(python) {
        interpreter_dirs(&entry, Lookup::Host, &mut dirs);
    }
    dirs.binds()
}

/// The directories an interpreter needs: its installation (the parent of
/// the `bin/` its real file is in), and for a virtual environment the
/// environment itself and the base installation its `pyvenv.cfg` names —
/// each only if the lookup can see it.
pub fn interpreter_dirs(interpreter: &Found, lookup: Lookup<'_>, dirs: &mut Dirs) {
    let install_of = |bin_file: &Path| -> Option<PathBuf> {
        let bin = bin_file.parent()?;
        (bin.file_name()? == "bin").then(|| bin.parent().map(Path::to_path_buf))?
    };
    if let Some(real) = lookup.file(&interpreter.inside) {
        if let Some(install) = install_of(&real.inside).and_then(|i| lookup.file(&i)) {
            dirs.add(install);
        }
    }
    let Some(venv) = install_of(&interpreter.inside) else {
        return;
    };
    let Some(config) = lookup.file(&venv.join("pyvenv.cfg")) else {
        return;
    };
    let home = std::fs::read_to_string(&config.host).ok().and_then(|text| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once('=')?;
            (key.trim() == "home").then(|| PathBuf::from(value.trim()))
        })
    });
    if let Some(base) = home
        .filter(|h| h.is_absolute())
        .and_then(|h| lookup.file(&h))
        .and_then(|h| h.inside.parent().and_then(|p| lookup.file(p)))
    {
        dirs.add(base);
    }
    if let Some(venv) = lookup.file(&venv) {
        dirs.add(venv);
    }
}
