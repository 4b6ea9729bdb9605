//! Templates going with sessions through the fleet's store (docs/fleet.md,
//! "Hibernated sessions wake on any node"). A session opened from an
//! operator's template carries it when it hibernates for the fleet: the
//! template's name, its record, and its disk's image, named by the image's
//! BLAKE3 hash like any content. Where the session wakes, a template of
//! that name serves it if it is that very image (the same hash) or was
//! built from the same packages (as `scripts/setup` builds `python-data`
//! on every node); a node with none keeps the image as the template —
//! checked against its hash and its size, its filesystem checked, then
//! moved to its name, recorded and mounted read-only, as a template built
//! here would be. A node whose template of that name was built from other
//! packages refuses the session, by name.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentos_proto::payload::validate_name;
use serde::{Deserialize, Serialize};

use super::image::{DiskDir, TEMPLATE_PARTS};
use super::record::TemplateRecord;
use super::store::{is_hash, SnapshotFiles, StoreError};

/// How long a template's disk may take to be let go once checked.
const RELEASE_PATIENCE: Duration = Duration::from_secs(10);

/// A template as it goes with a session: its name, its image's hash, and
/// its record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CarriedTemplate {
    pub name: String,
    pub hash: String,
    /// The machine it was built for (`x86_64`, `aarch64`): its packages'
    /// compiled parts serve that one alone.
    pub arch: String,
    pub record: TemplateRecord,
}

/// This node's template, to publish with a session: what goes with it,
/// and the file holding its image.
#[derive(Debug)]
pub struct TemplateImage {
    pub carried: CarriedTemplate,
    pub path: PathBuf,
}

/// Where a hibernation for the fleet lies: its snapshot, and its
/// template's image.
#[derive(Debug)]
pub struct FleetFiles {
    pub snapshot: SnapshotFiles,
    pub template: Option<TemplateImage>,
}

/// What a session brought from the fleet finds of its template here.
#[derive(Debug)]
pub enum TemplateArrival {
    /// A template of its name, which must be its image.
    Here {
        carried: CarriedTemplate,
        dir: DiskDir,
    },
    /// None: the image is kept as template `to`, by way of `build` (the
    /// name reserved meanwhile), within `max_bytes`.
    Keep {
        carried: CarriedTemplate,
        build: DiskDir,
        to: DiskDir,
        max_bytes: u64,
        /// Who may remove it here (see [`super::templates::Templates::remove`]):
        /// the session's operator, else root.
        built_by: u32,
    },
}

impl TemplateArrival {
    /// The template's name.
    pub fn name(&self) -> &str {
        match self {
            TemplateArrival::Here { carried, .. } | TemplateArrival::Keep { carried, .. } => {
                &carried.name
            }
        }
    }
}

/// How a session's template arrived.
#[derive(Debug)]
pub enum Arrived {
    /// This node's of its name is its image.
    Found,
    /// Kept here now, with its record.
    Kept(TemplateRecord),
    /// Not kept (the session is refused): its name is free again.
    NotKept,
}

/// A session brought from the fleet into its owner's store: whether it
/// keeps globals, and its template's name; or why it was not.
pub type Brought = Result<(bool, Option<String>), ImportError>;

/// Why a session brought from the fleet is not brought in.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Template(#[from] TemplateMoveError),
}

/// Why a template does not go, or come, with a session.
#[derive(Debug, thiserror::Error)]
pub enum TemplateMoveError {
    #[error("its template {name:?} cannot be read: {err}")]
    Read { name: String, err: std::io::Error },
    #[error(
        "its template {name:?} was built from {carried:?}, this node's of that name from \
         {here:?}: remove this node's, or wake the session on a node with the same one"
    )]
    Differs {
        name: String,
        carried: Vec<String>,
        here: Vec<String>,
    },
    #[error("its template {name:?} from the fleet is damaged: {why}")]
    Damaged { name: String, why: String },
    #[error(
        "its template {name:?} is {bytes} bytes, over this node's exec.template_disk_bytes \
         ({max})"
    )]
    TooLarge { name: String, bytes: u64, max: u64 },
    #[error("its template {name:?} cannot be kept here: {err}")]
    Keep { name: String, err: std::io::Error },
    #[error("its template does not parse: {0}")]
    Unreadable(#[from] serde_json::Error),
    #[error(
        "its template {name:?} was built for {arch}, this node is {}",
        std::env::consts::ARCH
    )]
    OtherMachine { name: String, arch: String },
}

/// What a session's publication says of its template (JSON, as another
/// node wrote it): checked as hostile input, as the database's rows are.
pub fn carried(json: &[u8]) -> Result<CarriedTemplate, TemplateMoveError> {
    let carried: CarriedTemplate = serde_json::from_slice(json)?;
    let damaged = |why: String| TemplateMoveError::Damaged {
        name: carried.name.clone(),
        why,
    };
    validate_name("template", &carried.name).map_err(|err| damaged(err.error))?;
    if carried.name.starts_with('.') {
        return Err(damaged("its name starts with '.'".into()));
    }
    if !is_hash(&carried.hash) {
        return Err(damaged("it is named by no hash".into()));
    }
    Ok(carried)
}

/// Template `name` (at `dir`), to publish with a session: its image's hash
/// is its record's, or found now and kept in its record.
pub fn image_of(dir: &DiskDir, name: &str) -> Result<TemplateImage, TemplateMoveError> {
    let unread = |err| TemplateMoveError::Read {
        name: name.to_owned(),
        err,
    };
    let mut record = TemplateRecord::read(&dir.0).map_err(unread)?;
    if record.image_hash.is_none() {
        record.image_hash = Some(dir.image_hash().map_err(unread)?);
        if let Err(err) = record.write(&dir.0) {
            log::warn!("template {name:?}: its image's hash is not kept: {err}");
        }
    }
    let hash = record.image_hash.clone().unwrap_or_default();
    Ok(TemplateImage {
        carried: CarriedTemplate {
            name: name.to_owned(),
            hash,
            arch: std::env::consts::ARCH.to_owned(),
            record,
        },
        path: dir.image(),
    })
}

/// Settles the template of a session fetched into `staging`: this node's
/// of its name must be its image; else its image (in `staging`, named by
/// its hash) is kept as the template. How it arrived, and why the session
/// is refused if it is.
pub fn arrive(
    arrival: &TemplateArrival,
    staging: &Path,
) -> (Arrived, Result<(), TemplateMoveError>) {
    match arrival {
        TemplateArrival::Here { carried, dir } => {
            let here = TemplateRecord::read(&dir.0).map_err(|err| TemplateMoveError::Read {
                name: carried.name.clone(),
                err,
            });
            (Arrived::Found, here.and_then(|here| serves(carried, &here)))
        }
        TemplateArrival::Keep {
            carried,
            build,
            to,
            max_bytes,
            built_by,
        } => {
            let image = staging.join(&carried.hash);
            match keep(carried, &image, (build, to), *max_bytes, *built_by) {
                Ok(record) => (Arrived::Kept(record), Ok(())),
                Err(err) => {
                    if let Err(left) = build.remove() {
                        log::warn!("template {}: {left}", build.0.display());
                    }
                    (Arrived::NotKept, Err(err))
                }
            }
        }
    }
}

/// Whether this node's template `here` serves a session that carries
/// `carried` of its name: the same image, or one built from the same
/// packages.
fn serves(carried: &CarriedTemplate, here: &TemplateRecord) -> Result<(), TemplateMoveError> {
    same_machine(carried)?;
    let same_image = here.image_hash.as_ref() == Some(&carried.hash);
    if same_image || package_set(&here.packages) == package_set(&carried.record.packages) {
        return Ok(());
    }
    Err(TemplateMoveError::Differs {
        name: carried.name.clone(),
        carried: carried.record.packages.clone(),
        here: here.packages.clone(),
    })
}

/// Whether `carried` was built for this machine.
fn same_machine(carried: &CarriedTemplate) -> Result<(), TemplateMoveError> {
    if carried.arch == std::env::consts::ARCH {
        return Ok(());
    }
    Err(TemplateMoveError::OtherMachine {
        name: carried.name.clone(),
        arch: carried.arch.clone(),
    })
}

/// Packages as a set: the order they were named in changes nothing built.
fn package_set(packages: &[String]) -> BTreeSet<&str> {
    packages.iter().map(String::as_str).collect()
}

/// Keeps `image` as template `to` (removable here by `built_by`): within
/// `max_bytes`, linked into `build` (the staged file stays, should the
/// snapshot name the same content), checked against its hash, as a
/// filesystem, and for what its root holds (its environment, a directory,
/// and nothing else: a link there would give sandboxes another path of
/// the host); then moved to its name, recorded, and mounted read-only.
fn keep(
    carried: &CarriedTemplate,
    image: &Path,
    (build, to): (&DiskDir, &DiskDir),
    max_bytes: u64,
    built_by: u32,
) -> Result<TemplateRecord, TemplateMoveError> {
    same_machine(carried)?;
    let name = carried.name.clone();
    let damaged = |why: String| TemplateMoveError::Damaged {
        name: name.clone(),
        why,
    };
    let unkept = |err| TemplateMoveError::Keep {
        name: name.clone(),
        err,
    };
    let bytes = fs::metadata(image)
        .map_err(|err| damaged(format!("its image is missing: {err}")))?
        .len();
    if bytes > max_bytes {
        return Err(TemplateMoveError::TooLarge {
            name,
            bytes,
            max: max_bytes,
        });
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(build.mount_point())
        .map_err(unkept)?;
    // A link, unless the templates lie on another filesystem than the
    // staging: a copy then.
    (fs::hard_link(image, build.image()))
        .or_else(|_| fs::copy(image, build.image()).map(|_| ()))
        .map_err(unkept)?;
    let hash = build.image_hash().map_err(unkept)?;
    if hash != carried.hash {
        return Err(damaged("its image is not what its hash says".into()));
    }
    build
        .check_filesystem()
        .map_err(|err| damaged(format!("its filesystem does not check: {err}")))?;
    build
        .mount_read_only()
        .map_err(|err| damaged(format!("it does not mount: {err}")))?;
    only_an_environment(&build.mount_point()).map_err(|err| damaged(err.to_string()))?;
    build.release(RELEASE_PATIENCE).map_err(unkept)?;
    let record = TemplateRecord {
        bytes: build.image_bytes(),
        image_hash: Some(hash),
        built_by,
        ..carried.record.clone()
    };
    fs::rename(&build.0, &to.0).map_err(unkept)?;
    let served = record.write(&to.0).and_then(|()| to.mount_read_only());
    if let Err(err) = served {
        if let Err(left) = to.remove() {
            log::warn!("template {}: {left}", to.0.display());
        }
        return Err(unkept(err));
    }
    Ok(record)
}

/// What is wrong with the root of a template's disk from elsewhere.
#[derive(Debug, thiserror::Error)]
enum StrangeRoot {
    #[error("its root cannot be read: {0}")]
    Unreadable(#[from] std::io::Error),
    #[error("its root holds {0:?}, which no template's does (only a directory env)")]
    Holds(std::ffi::OsString),
    #[error("its root holds no environment (a directory env)")]
    NoEnvironment,
}

/// Checks that the root of a template's disk, mounted at `root`, holds its
/// environment (`env`, a directory, not a link) and nothing else but the
/// filesystem's own `lost+found`.
fn only_an_environment(root: &Path) -> Result<(), StrangeRoot> {
    let mut has_env = false;
    for entry in fs::read_dir(root)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        match entry.file_name().to_str() {
            Some(part) if TEMPLATE_PARTS.contains(&part) && kind.is_dir() => has_env = true,
            Some("lost+found") if kind.is_dir() => {}
            _ => return Err(StrangeRoot::Holds(entry.file_name())),
        }
    }
    if !has_env {
        return Err(StrangeRoot::NoEnvironment);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> TemplateRecord {
        TemplateRecord {
            created_at: 1,
            built_by: 0,
            packages: vec!["pandas".into()],
            bytes: 10,
            image_hash: None,
        }
    }

    #[test]
    fn a_carried_template_names_a_template_and_a_hash_or_is_refused() {
        let good = CarriedTemplate {
            name: "python-data".into(),
            hash: "a".repeat(64),
            arch: std::env::consts::ARCH.into(),
            record: record(),
        };
        let json = serde_json::to_vec(&good).unwrap();
        assert_eq!(carried(&json).unwrap(), good);
        for (name, hash) in [
            ("../../etc", "a".repeat(64)),
            ("agent-7@mine", "a".repeat(64)),
            ("python-data", "../x".to_owned()),
            ("python-data", "A".repeat(64)),
            (".build-x", "a".repeat(64)),
        ] {
            let bad = CarriedTemplate {
                name: name.into(),
                hash,
                arch: std::env::consts::ARCH.into(),
                record: record(),
            };
            let json = serde_json::to_vec(&bad).unwrap();
            assert!(carried(&json).is_err(), "{name}");
        }
        let mut more = serde_json::to_value(&good).unwrap();
        more["more"] = 1.into();
        assert!(carried(&serde_json::to_vec(&more).unwrap()).is_err());
    }

    #[test]
    fn a_template_here_serves_if_it_is_the_same_image_or_built_from_the_same_packages() {
        let carried = CarriedTemplate {
            name: "t".into(),
            hash: "a".repeat(64),
            arch: std::env::consts::ARCH.into(),
            record: record(),
        };
        let built_again = TemplateRecord {
            image_hash: Some("b".repeat(64)),
            ..record()
        };
        assert!(serves(&carried, &built_again).is_ok());
        let same_image = TemplateRecord {
            packages: vec!["other".into()],
            image_hash: Some("a".repeat(64)),
            ..record()
        };
        assert!(serves(&carried, &same_image).is_ok());
        let other = TemplateRecord {
            packages: vec!["other".into()],
            image_hash: Some("b".repeat(64)),
            ..record()
        };
        let refused = serves(&carried, &other).unwrap_err();
        assert!(refused.to_string().contains(r#"["other"]"#), "{refused}");
        // The same packages named in another order are the same set; a
        // template built for another machine serves nothing here.
        let reordered = CarriedTemplate {
            record: TemplateRecord {
                packages: vec!["numpy".into(), "pandas".into()],
                ..record()
            },
            ..carried.clone()
        };
        let here = TemplateRecord {
            packages: vec!["pandas".into(), "numpy".into()],
            ..record()
        };
        assert!(serves(&reordered, &here).is_ok());
        let elsewhere = CarriedTemplate {
            arch: "elsewhere".into(),
            ..carried
        };
        let refused = serves(&elsewhere, &built_again).unwrap_err();
        assert!(matches!(refused, TemplateMoveError::OtherMachine { .. }));
    }

    #[test]
    fn an_image_that_is_not_its_hash_or_too_large_is_not_kept() {
        let root = tempfile::tempdir().unwrap();
        let staging = root.path().join("staging");
        fs::create_dir(&staging).unwrap();
        let image = b"not the image the hash names";
        let carried = CarriedTemplate {
            name: "t".into(),
            hash: blake3::hash(b"another image").to_hex().to_string(),
            arch: std::env::consts::ARCH.into(),
            record: record(),
        };
        fs::write(staging.join(&carried.hash), image).unwrap();
        let (build, to) = (
            DiskDir(root.path().join(".build-t")),
            DiskDir(root.path().join("t")),
        );
        let arrival = TemplateArrival::Keep {
            carried: carried.clone(),
            build: build.clone(),
            to: to.clone(),
            max_bytes: 1 << 20,
            built_by: 0,
        };
        let (arrived, refused) = arrive(&arrival, &staging);
        assert!(matches!(arrived, Arrived::NotKept));
        let refused = refused.unwrap_err();
        assert!(
            matches!(refused, TemplateMoveError::Damaged { .. }),
            "{refused}"
        );
        assert!(!build.0.exists() && !to.0.exists());
        fs::write(staging.join(&carried.hash), image).unwrap();
        let small = TemplateArrival::Keep {
            carried,
            build: build.clone(),
            to: to.clone(),
            max_bytes: 4,
            built_by: 0,
        };
        let refused = arrive(&small, &staging).1.unwrap_err();
        assert!(
            matches!(refused, TemplateMoveError::TooLarge { .. }),
            "{refused}"
        );
        assert!(!build.0.exists() && !to.0.exists());
    }

    #[test]
    fn a_template_root_holds_its_environment_directory_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        assert!(only_an_environment(root.path()).is_err(), "no env");
        fs::create_dir(root.path().join("lost+found")).unwrap();
        std::os::unix::fs::symlink("/", root.path().join("env")).unwrap();
        let refused = only_an_environment(root.path()).unwrap_err();
        assert!(
            matches!(&refused, StrangeRoot::Holds(name) if name == "env"),
            "{refused}"
        );
        fs::remove_file(root.path().join("env")).unwrap();
        fs::create_dir(root.path().join("env")).unwrap();
        assert!(only_an_environment(root.path()).is_ok());
        fs::write(root.path().join("more"), b"").unwrap();
        assert!(only_an_environment(root.path()).is_err(), "another entry");
    }
}
