//! envd's `filesystem.Filesystem` service over the kernel's file ops in
//! a session: Stat, ListDir, MakeDir, Move and Remove are one op each;
//! WatchDir streams a watch's events as they come (the kernel's `events`
//! followed), and CreateWatcher, GetWatcherEvents and RemoveWatcher keep
//! a watch between calls, the face remembering how far each was read.

use std::collections::BTreeMap;

use agentos_http::kernel_link::Wait;
use agentos_http::Body;
use agentos_proto::payload::{
    FileCall, FileEntry, FileEntryReply, FileEvents, FileEventsReply, FileList, FileListReply,
    FileMadeReply, FileMkdir, FileMove, FilePath, FileRemovedReply, FileType, FileUnwatch,
    FileWatch, FileWatchReply, WatchEvent, WatchEventType, MAX_LIST_DEPTH,
};
use http::{HeaderMap, Response};
use serde::{Deserialize, Serialize};

use super::connect::{stream, stream_error, unary, ConnectError, StreamSender};
use super::process::{follow_wait_ms, resolve, Empty};
use super::session::Session;
use crate::face::Face;

/// An entry as envd's `EntryInfo` has it.
#[derive(Debug, Serialize)]
pub struct EntryInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    /// int64, which proto3's JSON writes as a string.
    size: String,
    mode: u32,
    permissions: String,
    owner: String,
    group: String,
    #[serde(rename = "modifiedTime")]
    modified_time: String,
    #[serde(rename = "symlinkTarget", skip_serializing_if = "Option::is_none")]
    symlink_target: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
}

impl From<FileEntry> for EntryInfo {
    fn from(entry: FileEntry) -> EntryInfo {
        EntryInfo {
            name: entry.name,
            kind: match entry.kind {
                FileType::File => "FILE_TYPE_FILE",
                FileType::Dir => "FILE_TYPE_DIRECTORY",
                FileType::Symlink => "FILE_TYPE_SYMLINK",
                FileType::Other => "FILE_TYPE_UNSPECIFIED",
            },
            path: entry.path,
            size: entry.size.to_string(),
            mode: entry.mode & 0o777,
            permissions: entry.permissions,
            owner: user_name(entry.owner),
            group: user_name(entry.group),
            modified_time: entry.modified_at,
            symlink_target: entry.symlink_target,
            metadata: entry.metadata,
        }
    }
}

/// The sandbox's one user and its group by the name E2B's SDKs give
/// them (`user`): the host names its uid `nobody`, its group `nogroup`.
fn user_name(name: String) -> String {
    match name.as_str() {
        "nobody" | "nogroup" => "user".to_owned(),
        _ => name,
    }
}

#[derive(Debug, Serialize)]
struct EntryReply {
    entry: EntryInfo,
}

#[derive(Debug, Default, Deserialize)]
pub struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct ListDirRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: u32,
}

#[derive(Debug, Default, Deserialize)]
pub struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

#[derive(Debug, Default, Deserialize)]
pub struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default, rename = "includeEntry", alias = "include_entry")]
    include_entry: bool,
}

#[derive(Debug, Default, Deserialize)]
pub struct WatcherRequest {
    #[serde(default, rename = "watcherId", alias = "watcher_id")]
    watcher_id: String,
}

/// One change, as envd's `FilesystemEvent` has it: `name` relative to
/// the directory watched.
#[derive(Debug, Serialize)]
struct FilesystemEvent {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
}

impl FilesystemEvent {
    fn of(event: &WatchEvent, root: &str) -> FilesystemEvent {
        let relative = event
            .path
            .strip_prefix(root)
            .map(|rest| rest.trim_start_matches('/'))
            .filter(|rest| !rest.is_empty())
            .unwrap_or(&event.name);
        FilesystemEvent {
            name: relative.to_owned(),
            kind: match event.kind {
                WatchEventType::Create => "EVENT_TYPE_CREATE",
                WatchEventType::Write => "EVENT_TYPE_WRITE",
                WatchEventType::Remove => "EVENT_TYPE_REMOVE",
                WatchEventType::Rename => "EVENT_TYPE_RENAME",
                WatchEventType::Chmod => "EVENT_TYPE_CHMOD",
            },
        }
    }
}

/// A WatchDir stream's message: its oneof's case is the message's one
/// field (a process stream's is under `event`).
#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum WatchDirResponse {
    Start {},
    Filesystem(FilesystemEvent),
    Keepalive {},
}

/// A file op on the session.
async fn file<R: serde::de::DeserializeOwned>(
    session: &Session,
    call: FileCall,
) -> Result<R, ConnectError> {
    session.op(&call, Wait::AsLongAsTheKernel).await
}

/// `Stat`.
pub async fn stat(session: &Session, asked: PathRequest) -> Response<Body> {
    unary(stat_entry(session, &resolve(&asked.path)).await)
}

async fn stat_entry(session: &Session, path: &str) -> Result<EntryReply, ConnectError> {
    let call = FileCall::Stat(FilePath {
        session: session.id.clone(),
        path: path.to_owned(),
    });
    let stat: FileEntryReply = file(session, call).await?;
    Ok(EntryReply {
        entry: stat.entry.into(),
    })
}

/// `ListDir`: `depth` 0 is one level, as envd takes it.
pub async fn list_dir(session: &Session, asked: ListDirRequest) -> Response<Body> {
    #[derive(Serialize)]
    struct Listed {
        entries: Vec<EntryInfo>,
    }
    let call = FileCall::List(FileList {
        session: session.id.clone(),
        path: resolve(&asked.path),
        depth: Some(asked.depth.clamp(1, MAX_LIST_DEPTH)),
    });
    let listed = file::<FileListReply>(session, call).await.map(|listed| {
        // envd walks depth first, each directory's entries by name; the
        // kernel lists a level at a time.
        let mut entries = listed.entries;
        entries.sort_by(|a, b| a.path.split('/').cmp(b.path.split('/')));
        Listed {
            entries: entries.into_iter().map(EntryInfo::from).collect(),
        }
    });
    unary(listed)
}

/// `MakeDir`: its parents too; one that is there is `already_exists`.
pub async fn make_dir(session: &Session, asked: PathRequest) -> Response<Body> {
    let path = resolve(&asked.path);
    let call = FileCall::Mkdir(FileMkdir {
        session: session.id.clone(),
        path: path.clone(),
        parents: true,
    });
    let made = match file::<FileMadeReply>(session, call).await {
        Ok(made) if made.created => Ok(EntryReply {
            entry: made.entry.into(),
        }),
        Ok(_) => Err(ConnectError::new(
            "already_exists",
            format!("directory {path} already exists"),
        )),
        Err(err) => Err(err),
    };
    unary(made)
}

/// `Move`.
pub async fn move_entry(session: &Session, asked: MoveRequest) -> Response<Body> {
    let call = FileCall::Move(FileMove {
        session: session.id.clone(),
        from: resolve(&asked.source),
        to: resolve(&asked.destination),
    });
    let moved = file::<FileEntryReply>(session, call)
        .await
        .map(|moved| EntryReply {
            entry: moved.entry.into(),
        });
    unary(moved)
}

/// `Remove`.
pub async fn remove(session: &Session, asked: PathRequest) -> Response<Body> {
    let call = FileCall::Remove(FilePath {
        session: session.id.clone(),
        path: resolve(&asked.path),
    });
    // As envd removes, a path that is not there is no error.
    let removed = match file::<FileRemovedReply>(session, call).await {
        Err(err) if err.code != "not_found" => Err(err),
        _ => Ok(Empty {}),
    };
    unary(removed)
}

/// A new watch of `path`; its name.
async fn watch(session: &Session, path: &str, recursive: bool) -> Result<String, ConnectError> {
    let call = FileCall::Watch(FileWatch {
        session: session.id.clone(),
        path: path.to_owned(),
        recursive,
    });
    let watching: FileWatchReply = file(session, call).await?;
    Ok(watching.watch)
}

async fn unwatch(session: &Session, watch: &str) -> Result<(), ConnectError> {
    let call = FileCall::Unwatch(FileUnwatch {
        session: session.id.clone(),
        watch: watch.to_owned(),
    });
    let _: FileRemovedReply = file(session, call).await?;
    Ok(())
}

async fn events(
    session: &Session,
    watch: &str,
    after: u64,
    follow: Option<u64>,
) -> Result<FileEventsReply, ConnectError> {
    let call = FileCall::Events(FileEvents {
        session: session.id.clone(),
        watch: watch.to_owned(),
        after: Some(after),
        follow: follow.is_some(),
        wait_ms: follow,
    });
    file(session, call).await
}

/// `WatchDir`: `start`, then each change as it comes, keepalives while
/// quiet; the watch ends with the stream.
pub async fn watch_dir(
    session: Session,
    headers: &HeaderMap,
    asked: WatchRequest,
) -> Response<Body> {
    if asked.include_entry {
        return stream_error(ConnectError::new(
            "unimplemented",
            "includeEntry is not supported by agentos e2b",
        ));
    }
    let root = resolve(&asked.path);
    let watch = match watch(&session, &root, asked.recursive).await {
        Ok(watch) => watch,
        Err(err) => return stream_error(err),
    };
    let wait_ms = follow_wait_ms(headers);
    let (sender, response) = stream();
    tokio::spawn(async move {
        follow_watch(&session, &sender, &watch, &root, wait_ms).await;
        let _ = unwatch(&session, &watch).await;
    });
    response
}

async fn follow_watch(
    session: &Session,
    sender: &StreamSender,
    watch: &str,
    root: &str,
    wait_ms: u64,
) {
    if !sender.send(&WatchDirResponse::Start {}).await {
        return;
    }
    let mut after = 0;
    loop {
        let seen = tokio::select! {
            seen = events(session, watch, after, Some(wait_ms)) => seen,
            () = sender.closed() => return,
        };
        let seen = match seen {
            Ok(seen) => seen,
            Err(err) => return sender.end(Some(err)).await,
        };
        for event in &seen.events {
            let message = WatchDirResponse::Filesystem(FilesystemEvent::of(event, root));
            if !sender.send(&message).await {
                return;
            }
        }
        after = seen.offset;
        if seen.ended {
            return sender.end(None).await;
        }
        if seen.events.is_empty() && !sender.send(&WatchDirResponse::Keepalive {}).await {
            return;
        }
    }
}

/// `CreateWatcher`.
pub async fn create_watcher(face: &Face, session: &Session, asked: WatchRequest) -> Response<Body> {
    #[derive(Serialize)]
    struct Created {
        #[serde(rename = "watcherId")]
        watcher_id: String,
    }
    if asked.include_entry {
        return unary::<Empty>(Err(ConnectError::new(
            "unimplemented",
            "includeEntry is not supported by agentos e2b",
        )));
    }
    let root = resolve(&asked.path);
    let made = watch(session, &root, asked.recursive).await.map(|watch| {
        let delegate = session.tenant.delegate;
        face.watchers().begin(delegate, &session.id, &watch, root);
        Created { watcher_id: watch }
    });
    unary(made)
}

/// `GetWatcherEvents`: what the watcher saw since it was last asked.
pub async fn watcher_events(
    face: &Face,
    session: &Session,
    asked: WatcherRequest,
) -> Response<Body> {
    #[derive(Serialize)]
    struct Seen {
        events: Vec<FilesystemEvent>,
    }
    let delegate = session.tenant.delegate;
    let (after, root) = face
        .watchers()
        .place(delegate, &session.id, &asked.watcher_id);
    let seen = match events(session, &asked.watcher_id, after, None).await {
        Ok(seen) => seen,
        Err(err) => return unary::<Empty>(Err(err)),
    };
    face.watchers()
        .read_to(delegate, &session.id, &asked.watcher_id, seen.offset);
    unary(Ok(Seen {
        events: seen
            .events
            .iter()
            .map(|event| FilesystemEvent::of(event, &root))
            .collect(),
    }))
}

/// `RemoveWatcher`.
pub async fn remove_watcher(
    face: &Face,
    session: &Session,
    asked: WatcherRequest,
) -> Response<Body> {
    let removed = unwatch(session, &asked.watcher_id).await;
    face.watchers()
        .end(session.tenant.delegate, &session.id, &asked.watcher_id);
    unary(removed.map(|()| Empty {}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_named_from_the_directory_watched() {
        let event = WatchEvent {
            kind: WatchEventType::Create,
            path: "/home/user/d/x".into(),
            name: "x".into(),
        };
        let shown = FilesystemEvent::of(&event, "/home/user");
        assert_eq!(shown.name, "d/x");
        assert_eq!(
            serde_json::to_string(&shown).unwrap(),
            r#"{"name":"d/x","type":"EVENT_TYPE_CREATE"}"#
        );
        assert_eq!(FilesystemEvent::of(&event, "/elsewhere").name, "x");
        let start = serde_json::to_string(&WatchDirResponse::Start {}).unwrap();
        assert_eq!(start, r#"{"start":{}}"#);
        let seen = WatchDirResponse::Filesystem(shown);
        assert_eq!(
            serde_json::to_string(&seen).unwrap(),
            r#"{"filesystem":{"name":"d/x","type":"EVENT_TYPE_CREATE"}}"#
        );
    }
}
