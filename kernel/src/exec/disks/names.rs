//! How disks' directories are named: by owner (`uid-1000`, `agent-7`,
//! `run-42`), then by the name its owner gave (a session's, a volume's).

use std::path::{Path, PathBuf};

use agentos_proto::payload::DelegateName;

use crate::identity::Principal;

/// Where `owner`'s disk named `name` lies beneath `root` (the sessions'
/// or the volumes' directory).
pub fn disk_path(root: &Path, owner: Principal, name: &str) -> PathBuf {
    root.join(owner_dir_name(owner)).join(dir_name(name))
}

/// The directory of session `name`: the name itself, which the protocol
/// keeps to letters, digits, `_`, `.` and `-`; anything else (never sent
/// by a client the protocol's checks passed) spelled in hex, so that no
/// name ever leaves its owner's directory.
pub fn dir_name(name: &str) -> String {
    let plain = !name.is_empty()
        && name != "."
        && !name.contains("..")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if plain {
        return name.to_owned();
    }
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("x-{hex}")
}

/// The directory name of `owner`'s sessions.
pub fn owner_dir_name(owner: Principal) -> String {
    match owner {
        Principal::Operator { uid } => format!("uid-{uid}"),
        // `~` is in no delegate's name, nor in the other kinds' forms.
        Principal::Delegate { uid, name } => format!("uid-{uid}~{name}"),
        Principal::Agent { id } => format!("agent-{id}"),
        Principal::Run { number } => format!("run-{number}"),
    }
}

/// The owner a directory of sessions belongs to.
pub fn owner_of(name: &str) -> Option<Principal> {
    if let Some(uid) = name.strip_prefix("uid-") {
        return match uid.split_once('~') {
            Some((uid, name)) => Some(Principal::Delegate {
                uid: uid.parse().ok()?,
                name: DelegateName::new(name).ok()?,
            }),
            None => uid.parse().ok().map(|uid| Principal::Operator { uid }),
        };
    }
    if let Some(id) = name.strip_prefix("agent-") {
        return id.parse().ok().map(|id| Principal::Agent { id });
    }
    let number = name.strip_prefix("run-")?.parse().ok()?;
    Some(Principal::Run { number })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_session_name_leaves_its_owners_directory() {
        assert_eq!(dir_name("s1.v2-x_y"), "s1.v2-x_y");
        for hostile in ["..", "../etc", "/abs", "a/b", ".", ""] {
            let name = dir_name(hostile);
            assert!(name.starts_with("x-"), "{hostile:?} -> {name}");
            assert!(!name.contains('/') && !name.contains(".."), "{name}");
        }
    }

    #[test]
    fn owners_name_their_directories_both_ways() {
        for owner in [
            Principal::Operator { uid: 1000 },
            Principal::Delegate {
                uid: 1000,
                name: DelegateName::new("e2b.key-1").unwrap(),
            },
            Principal::Agent { id: 7 },
            Principal::Run { number: 42 },
        ] {
            assert_eq!(owner_of(&owner_dir_name(owner)), Some(owner));
        }
        assert_eq!(owner_of("uid-x"), None);
        assert_eq!(owner_of("lost+found"), None);
    }
}
