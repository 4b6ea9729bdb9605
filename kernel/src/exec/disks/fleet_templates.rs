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

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use agentos_proto::payload::validate_name;
use serde::{Deserialize, Serialize};

use super::image::DiskDir;
use super::record::TemplateRecord;
use super::store::{is_hash, SnapshotFiles, StoreError};

/// A template as it goes with a session: its name, its image's hash, and
/// its record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CarriedTemplate {
    pub name: String,
    pub hash: String,
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
        } => match keep(carried, &staging.join(&carried.hash), build, to, *max_bytes) {
            Ok(record) => (Arrived::Kept(record), Ok(())),
            Err(err) => {
                let _ = fs::remove_dir_all(&build.0);
                (Arrived::NotKept, Err(err))
            }
        },
    }
}

/// Whether this node's template `here` serves a session that carries
/// `carried` of its name: the same image, or one built from the same
/// packages.
fn serves(carried: &CarriedTemplate, here: &TemplateRecord) -> Result<(), TemplateMoveError> {
    let same_image = here.image_hash.as_ref() == Some(&carried.hash);
    if same_image || here.packages == carried.record.packages {
        return Ok(());
    }
    Err(TemplateMoveError::Differs {
        name: carried.name.clone(),
        carried: carried.record.packages.clone(),
        here: here.packages.clone(),
    })
}

/// Keeps `image` as template `to`: within `max_bytes`, moved into `build`,
/// checked against its hash and as a filesystem, moved to its name,
/// recorded, and mounted read-only.
fn keep(
    carried: &CarriedTemplate,
    image: &Path,
    build: &DiskDir,
    to: &DiskDir,
    max_bytes: u64,
) -> Result<TemplateRecord, TemplateMoveError> {
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
    fs::rename(image, build.image()).map_err(unkept)?;
    let hash = build.image_hash().map_err(unkept)?;
    if hash != carried.hash {
        return Err(damaged("its image is not what its hash says".into()));
    }
    build
        .check_filesystem()
        .map_err(|err| damaged(format!("its filesystem does not check: {err}")))?;
    let record = TemplateRecord {
        bytes: build.image_bytes(),
        image_hash: Some(hash),
        ..carried.record.clone()
    };
    fs::rename(&build.0, &to.0).map_err(unkept)?;
    if let Err(err) = record.write(&to.0) {
        let _ = fs::remove_dir_all(&to.0);
        return Err(unkept(err));
    }
    if let Err(err) = to.mount_read_only() {
        log::warn!("template {}: {err}", to.0.display());
    }
    Ok(record)
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
            record: record(),
        };
        let json = serde_json::to_vec(&good).unwrap();
        assert_eq!(carried(&json).unwrap(), good);
        for (name, hash) in [
            ("../../etc", "a".repeat(64)),
            ("agent-7@mine", "a".repeat(64)),
            ("python-data", "../x".to_owned()),
            ("python-data", "A".repeat(64)),
        ] {
            let bad = CarriedTemplate {
                name: name.into(),
                hash,
                record: record(),
            };
            let json = serde_json::to_vec(&bad).unwrap();
            assert!(carried(&json).is_err(), "{name}");
        }
        assert!(carried(br#"{"name":"t","hash":"x","record":{},"more":1}"#).is_err());
    }

    #[test]
    fn a_template_here_serves_if_it_is_the_same_image_or_built_from_the_same_packages() {
        let carried = CarriedTemplate {
            name: "t".into(),
            hash: "a".repeat(64),
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
        };
        let refused = arrive(&small, &staging).1.unwrap_err();
        assert!(
            matches!(refused, TemplateMoveError::TooLarge { .. }),
            "{refused}"
        );
        assert!(!build.0.exists() && !to.0.exists());
    }
}
