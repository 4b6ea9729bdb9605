//! Volumes: named disks a principal owns, with a fixed size, mounted by
//! name into its agents (SPAWN) and its runs and sessions (EXEC), read-write
//! or read-only: `"volumes": [{"name": "data", "path": "/data",
//! "read_only": true}]`. EXEC's `create_volume`, `volumes` and
//! `remove_volume` manage them.
//!
//! Where a volume may go is checked here, before anything is mounted: at
//! `/data`, or beneath `/data`, `/mnt` or `/workspace` — never over `/`,
//! `/proc`, `/dev`, `/sys`, the kernel's socket (under `/run`) or the
//! system's directories, and never by a path with `.` or `..`.

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, validate_name};
use crate::error::ErrorReply;

/// Most volumes one agent or run may have mounted.
pub const MAX_VOLUMES: usize = 8;
/// Longest path a volume may be mounted at.
pub const MAX_VOLUME_PATH_LEN: usize = 256;
/// Smallest volume, in bytes: a filesystem needs room for its own records.
pub const MIN_VOLUME_BYTES: u64 = 16 << 20;

/// Where volumes may go: at or beneath the first two, beneath the last.
const VOLUME_ROOTS: [&str; 3] = ["/data", "/mnt", "/workspace"];

/// Paths refused by name, with why.
const REFUSED: [(&str, &str); 5] = [
    ("/proc", "the process filesystem"),
    ("/dev", "the devices"),
    ("/sys", "the kernel's filesystem"),
    ("/run", "where the kernel's socket is"),
    ("/tmp", "scratch space; use /data or /mnt"),
];

/// Why a path is no place for a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NoPlace(String);

impl std::fmt::Display for NoPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One volume to mount, as SPAWN and EXEC name it.
///
/// ```
/// use agentos_proto::payload::ExecRequest;
/// let run = ExecRequest::parse(
///     br#"{"code":"1","volumes":[{"name":"data","path":"/data","read_only":true}]}"#,
/// ).unwrap();
/// assert!(run.volumes[0].read_only);
/// let over_proc = br#"{"code":"1","volumes":[{"name":"data","path":"/proc/x"}]}"#;
/// assert!(ExecRequest::parse(over_proc).unwrap_err().error.contains("/proc"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume: one of the caller's, or one it was given.
    pub name: String,
    /// Where it is mounted inside.
    pub path: String,
    /// Mounted read-only (a volume given read-only is never writable).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// Checks `mounts`, the `field` of request `what`: each a volume name and a
/// path volumes may take, no path twice or within another.
pub fn check_mounts(what: &str, field: &str, mounts: &[VolumeMount]) -> Result<(), ErrorReply> {
    if mounts.len() > MAX_VOLUMES {
        return Err(bad_request(format!(
            "{what} field `{field}` names {} volumes; at most {MAX_VOLUMES}",
            mounts.len()
        )));
    }
    for (i, mount) in mounts.iter().enumerate() {
        validate_name("volumes.name", &mount.name)?;
        check_path(&mount.path)
            .map_err(|why| bad_request(format!("{what} field `{field}`: {why}")))?;
        if let Some(other) = mounts[..i]
            .iter()
            .find(|o| nested(&o.path, &mount.path) || nested(&mount.path, &o.path))
        {
            return Err(bad_request(format!(
                "{what} field `{field}`: volume paths {:?} and {:?} overlap; give each \
                 volume a place of its own",
                other.path, mount.path
            )));
        }
    }
    Ok(())
}

/// Whether `inner` is `outer` or lies beneath it.
fn nested(outer: &str, inner: &str) -> bool {
    inner == outer
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Why `path` is no place for a volume, if it is not.
fn check_path(path: &str) -> Result<(), NoPlace> {
    let named = |why: &str| NoPlace(format!("volume path {path:?} {why}"));
    if path.len() > MAX_VOLUME_PATH_LEN || path.contains('\0') {
        return Err(named(&format!(
            "is not a path of at most {MAX_VOLUME_PATH_LEN} bytes"
        )));
    }
    if !path.starts_with('/') {
        return Err(named("is not absolute"));
    }
    let names: Vec<&str> = path[1..].split('/').collect();
    if names.iter().any(|n| *n == ".." || *n == ".") {
        return Err(named("has `.` or `..` in it; give a plain path"));
    }
    if names.iter().any(|n| n.is_empty()) {
        return Err(named(if path == "/" {
            "is the root, the workspace's parent"
        } else {
            "has an empty name in it (`//` or a trailing `/`)"
        }));
    }
    if let Some((_, why)) = REFUSED.iter().find(|(root, _)| nested(root, path)) {
        return Err(named(&format!("is over {why}: refused")));
    }
    if path == "/workspace" {
        return Err(named("is the workspace itself; mount beneath it"));
    }
    if !VOLUME_ROOTS.iter().any(|root| nested(root, path)) {
        return Err(named(
            "is outside where volumes go: /data, or beneath /data, /mnt or /workspace",
        ));
    }
    Ok(())
}

/// One volume, as `volumes` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct VolumeInfo {
    /// Its name.
    pub volume: String,
    /// Its size: what it holds at most.
    pub bytes: u64,
    /// What its files take now, when known.
    pub used_bytes: Option<u64>,
    /// When it was made (RFC 3339).
    pub created_at: String,
    /// The caller's own (it may remove it). Else it was given to the
    /// caller, by whoever started it.
    pub owned: bool,
    /// Given read-only: it is never writable to the caller or anything the
    /// caller starts.
    pub read_only: bool,
}

/// The reply to `{"op":"volumes"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct VolumesReply {
    /// Always true.
    pub success: bool,
    /// The caller's volumes, then those it was given, each by name.
    pub volumes: Vec<VolumeInfo>,
}

/// The reply to `{"op":"create_volume"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct VolumeReply {
    /// Always true.
    pub success: bool,
    /// The volume made.
    pub volume: VolumeInfo,
}

/// The reply to an op that removes something of the caller's
/// (`remove_snapshot`, `remove_volume`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RemovedReply {
    /// Always true.
    pub success: bool,
    /// Always true: what is not the caller's is `not_found`.
    pub removed: bool,
}

/// The reply to `{"op":"remove_volume"}`: always true, since a volume
/// that is not the caller's is `not_found`.
pub type VolumeRemovedReply = RemovedReply;

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(path: &str) -> VolumeMount {
        VolumeMount {
            name: "v".into(),
            path: path.into(),
            read_only: false,
        }
    }

    fn refused(path: &str) -> String {
        check_mounts("EXEC", "volumes", &[mount(path)])
            .unwrap_err()
            .error
    }

    #[test]
    fn volumes_go_at_data_or_beneath_data_mnt_or_the_workspace() {
        for good in ["/data", "/data/a/b", "/mnt", "/mnt/x", "/workspace/shared"] {
            check_mounts("EXEC", "volumes", &[mount(good)]).unwrap();
        }
        for (hostile, word) in [
            ("/", "root"),
            ("/proc", "process"),
            ("/proc/self", "process"),
            ("/dev/shm", "devices"),
            ("/sys/fs", "kernel's filesystem"),
            ("/run/agentos", "socket"),
            ("/data/../etc", ".."),
            ("/data/./x", "`.`"),
            ("data", "absolute"),
            ("/data//x", "empty"),
            ("/data/", "empty"),
            ("/workspace", "workspace itself"),
            ("/usr/lib", "outside"),
            ("/etc", "outside"),
            ("/database", "outside"),
            ("/data\0x", "bytes"),
        ] {
            let why = refused(hostile);
            assert!(why.contains(word), "{hostile:?}: {why}");
            assert!(
                why.contains("volumes"),
                "{hostile:?} names the field: {why}"
            );
        }
        assert!(refused(&format!("/data/{}", "a".repeat(300))).contains("bytes"));
    }

    #[test]
    fn volumes_may_not_overlap_nor_be_too_many_nor_badly_named() {
        let both = [mount("/data"), mount("/data/x")];
        let err = check_mounts("SPAWN", "volumes", &both).unwrap_err();
        assert!(err.error.contains("overlap"), "{}", err.error);
        check_mounts("SPAWN", "volumes", &[mount("/data/a"), mount("/data/ab")]).unwrap();
        let many = vec![mount("/data"); MAX_VOLUMES + 1];
        assert!(check_mounts("SPAWN", "volumes", &many)
            .unwrap_err()
            .error
            .contains("at most"));
        let mut bad = mount("/data");
        bad.name = "../x".into();
        assert!(check_mounts("SPAWN", "volumes", &[bad]).is_err());
    }

    #[test]
    fn a_mount_names_its_fields_exactly() {
        let misspelt = r#"{"name":"v","path":"/data","readonly":true}"#;
        assert!(serde_json::from_str::<VolumeMount>(misspelt).is_err());
        let plain: VolumeMount = serde_json::from_str(r#"{"name":"v","path":"/data"}"#).unwrap();
        assert!(!plain.read_only);
    }
}
