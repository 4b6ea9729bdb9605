//! EXEC's file ops: a session's files, as its code sees them — its disk,
//! its mounts and the read-only system beneath — stat, listed, made,
//! moved, removed, read and written by the session's steward, as the
//! session's own user. Paths are absolute and resolve inside the session
//! (`..` and symlinks included): nothing outside its sandbox is reached.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, validate_name};
use crate::error::ErrorReply;

/// The longest path, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// The deepest `list`.
pub const MAX_LIST_DEPTH: u32 = 16;
/// The most entries one `list` gives (the rest: `truncated`).
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// The most bytes one `read` gives (`length`'s default and cap).
pub const MAX_READ_BYTES: u64 = 4 << 20;
/// The most bytes one `write` carries (decoded): a request fits in the
/// default `max_request_bytes`.
pub const MAX_WRITE_BYTES: usize = 512 << 10;
/// The most bytes of a file's metadata, keys and values.
pub const MAX_METADATA_BYTES: usize = 4096;
/// The longest metadata key (an xattr's name is at most 255 bytes, of
/// which `user.e2b.` takes 9).
pub const MAX_METADATA_KEY_BYTES: usize = 246;

/// The longest an `events` follow waits.
pub const MAX_EVENTS_WAIT_MS: u64 = 60_000;

/// A path in a session: absolute, no NUL, at most [`MAX_PATH_BYTES`].
fn check_path(field: &str, path: &str) -> Result<(), ErrorReply> {
    if !path.starts_with('/') || path.contains('\0') || path.len() > MAX_PATH_BYTES {
        return Err(bad_request(format!(
            "EXEC field `{field}`: {:?} is not an absolute path of at most {MAX_PATH_BYTES} \
             bytes without NUL",
            truncated(path)
        )));
    }
    Ok(())
}

/// Enough of a hostile path to say which it was.
fn truncated(text: &str) -> String {
    text.chars().take(80).collect()
}

/// Metadata: printable ASCII, keys 1 to 246 bytes, 4 KiB in all.
fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), ErrorReply> {
    let printable = |text: &str| text.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    let bytes: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    let keys_fit = (metadata.keys()).all(|k| !k.is_empty() && k.len() <= MAX_METADATA_KEY_BYTES);
    if bytes > MAX_METADATA_BYTES
        || !keys_fit
        || !metadata.iter().all(|(k, v)| printable(k) && printable(v))
    {
        return Err(bad_request(format!(
            "EXEC field `metadata`: keys of 1 to {MAX_METADATA_KEY_BYTES} bytes and values, \
             printable ASCII, at most {MAX_METADATA_BYTES} bytes in all"
        )));
    }
    Ok(())
}

/// The fields of an op on one path.
macro_rules! file_op {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// The session.
            pub session: String,
            /// The path, absolute in the session.
            pub path: String,
            $($(#[$fdoc])* pub $field: $ty,)*
        }
    };
}

file_op!(
    /// `stat`, `remove`: one path.
    FilePath {}
);

file_op!(
    /// `list`: a directory's entries, to `depth` levels.
    FileList {
        /// Levels to descend, 1 (the default) to 16.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        depth: Option<u32>,
    }
);

file_op!(
    /// `mkdir`: a directory.
    FileMkdir {
        /// Make the directories above it too.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        parents: bool,
    }
);

file_op!(
    /// `read`: bytes of a regular file.
    FileRead {
        /// Where to start.
        #[serde(default)]
        offset: u64,
        /// How many bytes, at most (default and cap 4 MiB).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        length: Option<u64>,
    }
);

fn yes() -> bool {
    true
}

file_op!(
    /// `write`: bytes into a regular file, made if missing.
    FileWrite {
        /// The bytes, base64 (at most 512 KiB of them).
        #[serde(default)]
        data: String,
        /// Where they go.
        #[serde(default)]
        offset: u64,
        /// The file ends where they end (the default); `false` keeps what
        /// lies past them.
        #[serde(default = "yes")]
        truncate: bool,
        /// Make the directories above it too.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        parents: bool,
        /// Its metadata, replacing what it had (extended attributes
        /// `user.e2b.<key>`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<BTreeMap<String, String>>,
    }
);

file_op!(
    /// `watch`: a directory's changes, kept for `events` until `unwatch`.
    FileWatch {
        /// Its subdirectories' too, those made later included.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        recursive: bool,
    }
);

/// `events`: what a watch saw after `after`; with `follow`, waiting up to
/// `wait_ms` for more.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileEvents {
    /// The session.
    pub session: String,
    /// The watch, as `watch` named it.
    pub watch: String,
    /// The offset to read from (a reply's `offset` is the next one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// Wait for an event if there is none yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub follow: bool,
    /// How long a follow waits (default 10 000, at most 60 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// `unwatch`: a watch ended, its events gone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileUnwatch {
    /// The session.
    pub session: String,
    /// The watch.
    pub watch: String,
}

/// `move`: a path renamed, across the session's disks if need be.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileMove {
    /// The session.
    pub session: String,
    /// What moves.
    pub from: String,
    /// Where it goes (replacing a file there).
    pub to: String,
}

/// A file op, parsed and checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FileCall {
    /// What a path is.
    Stat(FilePath),
    /// A directory's entries.
    List(FileList),
    /// Make a directory.
    Mkdir(FileMkdir),
    /// Rename a path.
    Move(FileMove),
    /// Remove a path (a directory with all it holds).
    Remove(FilePath),
    /// Read a file's bytes.
    Read(FileRead),
    /// Write a file's bytes.
    Write(FileWrite),
    /// Watch a directory.
    Watch(FileWatch),
    /// Read a watch's events.
    Events(FileEvents),
    /// End a watch.
    Unwatch(FileUnwatch),
}

impl FileCall {
    /// The session it is about.
    pub fn session(&self) -> &str {
        match self {
            FileCall::Stat(path) | FileCall::Remove(path) => &path.session,
            FileCall::List(list) => &list.session,
            FileCall::Mkdir(mkdir) => &mkdir.session,
            FileCall::Move(moving) => &moving.session,
            FileCall::Read(read) => &read.session,
            FileCall::Write(write) => &write.session,
            FileCall::Watch(watch) => &watch.session,
            FileCall::Events(events) => &events.session,
            FileCall::Unwatch(unwatch) => &unwatch.session,
        }
    }

    /// What it does, for messages: `read /a/b`.
    pub fn describe(&self) -> String {
        match self {
            FileCall::Stat(path) => format!("stat {}", path.path),
            FileCall::List(list) => format!("list {}", list.path),
            FileCall::Mkdir(mkdir) => format!("make directory {}", mkdir.path),
            FileCall::Move(moving) => format!("move {} to {}", moving.from, moving.to),
            FileCall::Remove(path) => format!("remove {}", path.path),
            FileCall::Read(read) => format!("read {}", read.path),
            FileCall::Write(write) => format!("write {}", write.path),
            FileCall::Watch(watch) => format!("watch {}", watch.path),
            FileCall::Events(events) => format!("read the events of watch {}", events.watch),
            FileCall::Unwatch(unwatch) => format!("end watch {}", unwatch.watch),
        }
    }
}

/// A watch's name: what `watch` gave, at most 32 bytes.
fn check_watch(watch: &str) -> Result<(), ErrorReply> {
    if watch.is_empty()
        || watch.len() > 32
        || !watch
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(bad_request(format!(
            "EXEC field `watch`: {:?} is not a watch's name (as `watch` gave it)",
            truncated(watch)
        )));
    }
    Ok(())
}

/// The file ops, by their `op`.
#[derive(Clone, Copy, Debug)]
pub(super) enum FileOp {
    Stat,
    List,
    Mkdir,
    Move,
    Remove,
    Read,
    Write,
    Watch,
    Events,
    Unwatch,
}

impl FileOp {
    /// Parses `value` as this op, checked (its `op`, already read, aside).
    pub(super) fn parse(self, mut value: serde_json::Value) -> Result<FileCall, ErrorReply> {
        if let Some(fields) = value.as_object_mut() {
            fields.remove("op");
        }
        fn from<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, ErrorReply> {
            super::parse::from_value("EXEC", value)
        }
        let call = match self {
            FileOp::Stat => FileCall::Stat(from(value)?),
            FileOp::Remove => FileCall::Remove(from(value)?),
            FileOp::List => {
                let list: FileList = from(value)?;
                if list.depth.is_some_and(|d| d == 0 || d > MAX_LIST_DEPTH) {
                    return Err(bad_request(format!(
                        "EXEC field `depth`: 1 to {MAX_LIST_DEPTH}"
                    )));
                }
                FileCall::List(list)
            }
            FileOp::Mkdir => FileCall::Mkdir(from(value)?),
            FileOp::Move => {
                let moving: FileMove = from(value)?;
                check_path("from", &moving.from)?;
                check_path("to", &moving.to)?;
                FileCall::Move(moving)
            }
            FileOp::Read => {
                let read: FileRead = from(value)?;
                if read.length.is_some_and(|n| n > MAX_READ_BYTES) {
                    return Err(bad_request(format!(
                        "EXEC field `length`: at most {MAX_READ_BYTES} bytes; read in parts"
                    )));
                }
                FileCall::Read(read)
            }
            FileOp::Write => {
                let write: FileWrite = from(value)?;
                // Base64 carries 3 bytes in 4 characters.
                if write.data.len() > MAX_WRITE_BYTES.div_ceil(3) * 4 {
                    return Err(bad_request(format!(
                        "EXEC field `data`: more than {MAX_WRITE_BYTES} bytes; write in parts"
                    )));
                }
                if let Some(metadata) = &write.metadata {
                    check_metadata(metadata)?;
                }
                FileCall::Write(write)
            }
            FileOp::Watch => FileCall::Watch(from(value)?),
            FileOp::Events => {
                let events: FileEvents = from(value)?;
                if events.wait_ms.is_some_and(|ms| ms > MAX_EVENTS_WAIT_MS) {
                    return Err(bad_request(format!(
                        "EXEC field `wait_ms`: at most {MAX_EVENTS_WAIT_MS}"
                    )));
                }
                check_watch(&events.watch)?;
                FileCall::Events(events)
            }
            FileOp::Unwatch => {
                let unwatch: FileUnwatch = from(value)?;
                check_watch(&unwatch.watch)?;
                FileCall::Unwatch(unwatch)
            }
        };
        validate_name("session", call.session())?;
        let path = match &call {
            FileCall::Stat(p) | FileCall::Remove(p) => Some(&p.path),
            FileCall::List(list) => Some(&list.path),
            FileCall::Mkdir(mkdir) => Some(&mkdir.path),
            FileCall::Read(read) => Some(&read.path),
            FileCall::Write(write) => Some(&write.path),
            FileCall::Watch(watch) => Some(&watch.path),
            FileCall::Move(_) | FileCall::Events(_) | FileCall::Unwatch(_) => None,
        };
        if let Some(path) = path {
            check_path("path", path)?;
        }
        Ok(call)
    }
}

/// What kind of thing a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// A device, socket or FIFO.
    Other,
}

/// One path in a session, as `lstat` sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Its last component.
    pub name: String,
    /// Its absolute path.
    pub path: String,
    /// What it is.
    #[serde(rename = "type")]
    pub kind: FileType,
    /// Its size in bytes.
    pub size: u64,
    /// Its permission bits (`0o644` is 420).
    pub mode: u32,
    /// Its type and permissions as `ls -l` shows them: `-rw-r--r--`.
    pub permissions: String,
    /// Its owner's name (its uid if it has none).
    pub owner: String,
    /// Its group's name (its gid if it has none).
    pub group: String,
    /// When it was last written (RFC 3339, UTC).
    pub modified_at: String,
    /// Where it points, if it is a symlink.
    pub symlink_target: Option<String>,
    /// Its metadata (`write`'s `metadata`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// The reply to `stat`, `move` and `write`: the path as it now is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileEntryReply {
    /// Always true.
    pub success: bool,
    /// The path.
    pub entry: FileEntry,
}

/// The reply to `list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileListReply {
    /// Always true.
    pub success: bool,
    /// Its entries, each directory's by name, then those a level down.
    pub entries: Vec<FileEntry>,
    /// More entries were there than one reply gives (10 000).
    pub truncated: bool,
}

/// The reply to `mkdir`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileMadeReply {
    /// Always true.
    pub success: bool,
    /// It was made (`false`: a directory was already there).
    pub created: bool,
    /// The directory.
    pub entry: FileEntry,
}

/// The reply to `remove`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileRemovedReply {
    /// Always true.
    pub success: bool,
    /// It was there, and is gone.
    pub removed: bool,
}

/// The reply to `read`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileReadReply {
    /// Always true.
    pub success: bool,
    /// The bytes, base64.
    pub data: String,
    /// Where they start.
    pub offset: u64,
    /// The file's size.
    pub size: u64,
    /// They reach its end.
    pub eof: bool,
}

/// The reply to `watch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FileWatchReply {
    /// Always true.
    pub success: bool,
    /// The watch's name, for `events` and `unwatch`.
    pub watch: String,
}

/// What happened to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum WatchEventType {
    /// It was made (or moved in).
    Create,
    /// It was written.
    Write,
    /// It was removed.
    Remove,
    /// It was renamed (moved away).
    Rename,
    /// Its permissions or other attributes changed.
    Chmod,
}

/// One change a watch saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct WatchEvent {
    /// What happened.
    #[serde(rename = "type")]
    pub kind: WatchEventType,
    /// The path it happened to.
    pub path: String,
    /// Its last component.
    pub name: String,
}

/// The reply to `events`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FileEventsReply {
    /// Always true.
    pub success: bool,
    /// The events after `after`, oldest first.
    pub events: Vec<WatchEvent>,
    /// The offset after them (the next `after`).
    pub offset: u64,
    /// Events dropped, oldest first, beyond what is kept.
    pub dropped: u64,
    /// The watch has ended (its session or steward did): no more will
    /// come.
    pub ended: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(op: FileOp, value: serde_json::Value) -> Result<FileCall, ErrorReply> {
        op.parse(value)
    }

    #[test]
    fn paths_are_absolute_short_and_without_nul() {
        for path in [
            "",
            "a.txt",
            "./a",
            "/a\0b",
            &format!("/{}", "x".repeat(4096)),
        ] {
            let err = parse(FileOp::Stat, json!({"session": "s", "path": path})).unwrap_err();
            assert!(err.error.contains("`path`"), "{path:?}: {}", err.error);
        }
        let err = parse(
            FileOp::Move,
            json!({"session": "s", "from": "/a", "to": "b"}),
        )
        .unwrap_err();
        assert!(err.error.contains("`to`"), "{}", err.error);
        assert!(parse(FileOp::Stat, json!({"session": "s", "path": "/a/../b"})).is_ok());
    }

    #[test]
    fn unknown_fields_and_bad_sessions_are_refused() {
        let err = parse(
            FileOp::Read,
            json!({"session": "s", "path": "/a", "follow": true}),
        )
        .unwrap_err();
        assert!(err.error.contains("follow"), "{}", err.error);
        assert!(parse(FileOp::Stat, json!({"session": "", "path": "/a"})).is_err());
        assert!(parse(FileOp::Stat, json!({"path": "/a"})).is_err());
    }

    #[test]
    fn sizes_and_depths_have_caps() {
        let list = |depth: u32| {
            parse(
                FileOp::List,
                json!({"session": "s", "path": "/", "depth": depth}),
            )
        };
        assert!(list(0).is_err() && list(17).is_err() && list(16).is_ok());
        let read = |length: u64| {
            parse(
                FileOp::Read,
                json!({"session": "s", "path": "/a", "length": length}),
            )
        };
        assert!(read(MAX_READ_BYTES + 1).is_err() && read(MAX_READ_BYTES).is_ok());
        let events = |wait_ms: u64| {
            parse(
                FileOp::Events,
                json!({"session": "s", "watch": "w-1", "wait_ms": wait_ms}),
            )
        };
        assert!(events(60_001).is_err() && events(60_000).is_ok());
        let data = "A".repeat(MAX_WRITE_BYTES.div_ceil(3) * 4 + 4);
        let err = parse(
            FileOp::Write,
            json!({"session": "s", "path": "/a", "data": data}),
        )
        .unwrap_err();
        assert!(err.error.contains("`data`"), "{}", err.error);
    }

    #[test]
    fn metadata_is_printable_and_small() {
        let write = |metadata: serde_json::Value| {
            parse(
                FileOp::Write,
                json!({"session": "s", "path": "/a", "metadata": metadata}),
            )
        };
        assert!(write(json!({"k": "v", "with space": "a b"})).is_ok());
        assert!(write(json!({"": "v"})).is_err());
        assert!(write(json!({"k": "line\nbreak"})).is_err());
        assert!(write(json!({"k": "é"})).is_err());
        assert!(write(json!({"k".repeat(247): "v"})).is_err());
        assert!(write(json!({"k": "v".repeat(4096)})).is_err());
    }

    #[test]
    fn a_watch_is_named_as_watch_named_it() {
        for watch in ["", "w 1", "w/1", "../w", &"w".repeat(33)] {
            let err = parse(FileOp::Unwatch, json!({"session": "s", "watch": watch})).unwrap_err();
            assert!(err.error.contains("`watch`"), "{watch:?}: {}", err.error);
        }
        let Ok(FileCall::Watch(watch)) = parse(
            FileOp::Watch,
            json!({"session": "s", "path": "/a", "recursive": true}),
        ) else {
            panic!("a watch");
        };
        assert!(watch.recursive);
    }

    #[test]
    fn a_write_truncates_unless_told_not_to() {
        let Ok(FileCall::Write(write)) = parse(
            FileOp::Write,
            json!({"session": "s", "path": "/a", "data": "aGk="}),
        ) else {
            panic!("a write");
        };
        assert!(write.truncate && write.offset == 0 && write.metadata.is_none());
        let Ok(FileCall::Write(write)) = parse(
            FileOp::Write,
            json!({"session": "s", "path": "/a", "offset": 3, "truncate": false}),
        ) else {
            panic!("a write");
        };
        assert!(!write.truncate && write.offset == 3);
    }

    #[test]
    fn an_entry_names_its_type_as_type() {
        let entry: FileEntry = serde_json::from_value(json!({
            "name": "a", "path": "/a", "type": "symlink", "size": 1, "mode": 511,
            "permissions": "lrwxrwxrwx", "owner": "nobody", "group": "nogroup",
            "modified_at": "2026-11-30T00:00:00Z", "symlink_target": "/b"
        }))
        .unwrap();
        assert_eq!(entry.kind, FileType::Symlink);
        assert!(serde_json::from_value::<FileEntry>(json!({"name": "a", "extra": 1})).is_err());
    }
}
