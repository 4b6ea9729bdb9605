//! What a file op's reply must be. The steward writes it inside the
//! sandbox, so before it goes to the caller the kernel reads it as the
//! reply that op has (no other fields), and holds it to what was asked:
//! a `list` of at most 10 000 entries, a `read` of at most the bytes asked
//! for, from where they were asked.

use agentos_proto::payload::{
    FileCall, FileEntryReply, FileListReply, FileMadeReply, FileReadReply, FileRemovedReply,
    FileWatchReply, MAX_LIST_ENTRIES, MAX_READ_BYTES,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::address::Answer;

/// A steward's reply that is not what its op was to give.
#[derive(Debug, thiserror::Error)]
#[error("a reply to {what} {why}")]
pub struct UnfitReply {
    what: String,
    why: Unfit,
}

/// Why a reply is not what its op was to give.
#[derive(Debug, thiserror::Error)]
enum Unfit {
    #[error("not of that op's shape")]
    Shape,
    #[error("of too many entries")]
    TooManyEntries,
    #[error("of other bytes than were asked for")]
    OtherBytes,
}

/// A file op sent to a steward, as its reply is to be checked.
#[derive(Debug)]
pub struct FileAsked {
    /// What it does, for messages (`read /a`).
    pub what: String,
    reply: Expected,
}

/// The reply an op has.
#[derive(Debug, Clone, Copy)]
enum Expected {
    /// The path as it now is (`stat`, `move`, `write`).
    Entry,
    /// A directory's entries.
    List,
    /// A directory made or found.
    Made,
    /// A path removed.
    Removed,
    /// At most `length` bytes from `offset`.
    Read { offset: u64, length: u64 },
    /// A watch made (the kernel names it).
    Watch,
    /// Nothing: the op is the kernel's own (`events`, `unwatch`), never
    /// the steward's to answer.
    Nothing,
}

impl FileAsked {
    /// What `call`'s reply must be.
    pub fn of(call: &FileCall) -> FileAsked {
        let reply = match call {
            FileCall::Stat(_) | FileCall::Move(_) | FileCall::Write(_) => Expected::Entry,
            FileCall::List(_) => Expected::List,
            FileCall::Mkdir(_) => Expected::Made,
            FileCall::Remove(_) => Expected::Removed,
            FileCall::Watch(_) => Expected::Watch,
            FileCall::Events(_) | FileCall::Unwatch(_) => Expected::Nothing,
            FileCall::Read(read) => Expected::Read {
                offset: read.offset,
                length: read.length.unwrap_or(MAX_READ_BYTES),
            },
        };
        FileAsked {
            what: call.describe(),
            reply,
        }
    }

    /// Whether it makes a watch.
    pub fn is_watch(&self) -> bool {
        matches!(self.reply, Expected::Watch)
    }

    /// The steward's `reply` as the caller gets it, if it is what was
    /// asked for.
    pub fn checked(&self, reply: &str) -> Result<Answer, UnfitReply> {
        let unfit = |why| UnfitReply {
            what: self.what.clone(),
            why,
        };
        let passed = match self.reply {
            Expected::Entry => pass(reply, |entry: &mut FileEntryReply| {
                entry.success = true;
                Ok(())
            }),
            Expected::List => pass(reply, |list: &mut FileListReply| {
                list.success = true;
                match list.entries.len() <= MAX_LIST_ENTRIES {
                    true => Ok(()),
                    false => Err(Unfit::TooManyEntries),
                }
            }),
            Expected::Made => pass(reply, |made: &mut FileMadeReply| {
                made.success = true;
                Ok(())
            }),
            Expected::Removed => pass(reply, |removed: &mut FileRemovedReply| {
                removed.success = true;
                Ok(())
            }),
            Expected::Read { offset, length } => pass(reply, |read: &mut FileReadReply| {
                read.success = true;
                // Base64 carries 3 bytes in 4 characters.
                let most = length.div_ceil(3) * 4;
                match read.offset == offset && read.data.len() as u64 <= most {
                    true => Ok(()),
                    false => Err(Unfit::OtherBytes),
                }
            }),
            Expected::Watch => pass(reply, |watch: &mut FileWatchReply| {
                watch.success = true;
                Ok(())
            }),
            Expected::Nothing => Err(Unfit::Shape),
        };
        passed.map_err(unfit)
    }
}

/// `reply` read as a `T` (no other fields) and held to `check`, which
/// marks it a success: the answer it makes, or why it is unfit.
fn pass<T: DeserializeOwned + Serialize>(
    reply: &str,
    check: impl FnOnce(&mut T) -> Result<(), Unfit>,
) -> Result<Answer, Unfit> {
    let mut read: T = serde_json::from_str(reply).map_err(|_| Unfit::Shape)?;
    check(&mut read)?;
    Ok(Answer::json(&read))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_proto::payload::ExecCall;
    use serde_json::json;

    fn asked(call: serde_json::Value) -> FileAsked {
        match ExecCall::parse(&serde_json::to_vec(&call).unwrap()).unwrap() {
            ExecCall::Files(call) => FileAsked::of(&call),
            other => panic!("not a file op: {other:?}"),
        }
    }

    fn entry() -> serde_json::Value {
        json!({
            "name": "a", "path": "/a", "type": "file", "size": 3, "mode": 420,
            "permissions": "-rw-r--r--", "owner": "nobody", "group": "nogroup",
            "modified_at": "2026-11-30T00:00:00Z", "symlink_target": null
        })
    }

    #[test]
    fn a_reply_that_fits_goes_on_marked_a_success() {
        let stat = asked(json!({"op": "stat", "session": "s", "path": "/a"}));
        let answer = stat
            .checked(&json!({"success": false, "entry": entry()}).to_string())
            .unwrap();
        let sent: serde_json::Value = serde_json::from_slice(&answer.into_json()).unwrap();
        assert_eq!(sent["success"], true);
        assert_eq!(sent["entry"]["type"], "file");
    }

    #[test]
    fn a_reply_of_another_shape_or_with_more_fields_drops_the_steward() {
        let stat = asked(json!({"op": "stat", "session": "s", "path": "/a"}));
        let hostile = [
            json!({"success": true}),
            json!({"success": true, "entry": entry(), "note": "hi"}),
            json!({"success": true, "removed": true}),
            json!([1, 2]),
        ];
        for reply in hostile {
            let err = stat.checked(&reply.to_string()).unwrap_err();
            assert!(err.to_string().starts_with("a reply to stat /a"), "{err}");
        }
    }

    #[test]
    fn a_read_gives_no_more_than_was_asked_from_where_it_was_asked() {
        let read =
            asked(json!({"op": "read", "session": "s", "path": "/a", "offset": 5, "length": 3}));
        let reply = |data: &str, offset: u64| json!({"success": true, "data": data, "offset": offset, "size": 9, "eof": false});
        assert!(read.checked(&reply("YWJj", 5).to_string()).is_ok());
        assert!(read.checked(&reply("YWJjZA==", 5).to_string()).is_err());
        assert!(read.checked(&reply("YWJj", 0).to_string()).is_err());
    }

    #[test]
    fn a_list_has_at_most_its_cap_of_entries() {
        let list = asked(json!({"op": "list", "session": "s", "path": "/"}));
        let entries = vec![entry(); MAX_LIST_ENTRIES + 1];
        let reply = json!({"success": true, "entries": entries, "truncated": false});
        assert!(list.checked(&reply.to_string()).is_err());
        // The kernel's own ops are never the steward's to answer.
        let events = asked(json!({"op": "events", "session": "s", "watch": "w-1"}));
        assert!(!events.is_watch());
        assert!(events.checked(r#"{"success":true,"watch":"w-1"}"#).is_err());
    }
}
