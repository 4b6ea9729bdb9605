//! API keys: who a request to the face speaks for.
//!
//! Each key is a delegate principal of the kernel's, `e2b.NAME`: what its
//! requests create is its own, and another key's requests find none of
//! it, in the kernel. Keys are kept hashed (`NAME sha256:HEX` lines in a
//! file only its owner may read), come from that file or from
//! `AGENTOS_E2B_API_KEY` (one key, named `default`), and never from argv,
//! which every user sees in `ps`. A presented key is hashed and compared
//! with every entry in time that does not depend on where they differ.
//!
//! Given no keys, the face makes one and keeps it for its user (as the
//! MCP face keeps its token), speaking for the one delegate `e2b`, and
//! serves that user's connections only, on loopback: a connection's uid
//! alone is not proof, as a sandbox whose policy reaches the host's
//! loopback connects as the kernel's user.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use agentos_proto::payload::DelegateName;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use agentos_http::random::hex;

/// The environment variable that gives one key.
pub const KEY_ENV: &str = "AGENTOS_E2B_API_KEY";

/// The delegate every request speaks for when the face has no keys.
const KEYLESS_DELEGATE: &str = "e2b";

/// The longest key name: `e2b.` and it make a delegate name of at most
/// 48 bytes.
const MAX_KEY_NAME: usize = 44;

/// The largest keys file read.
const MAX_KEYS_FILE_BYTES: u64 = 1 << 20;

/// A made key's random bytes.
const MADE_KEY_BYTES: usize = 24;

/// Why the keys cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("{}", path.display())]
    File {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("{0}: not a regular file")]
    NotRegular(PathBuf),
    #[error("{0}: others may read or write it; chmod 600 it")]
    Shared(PathBuf),
    #[error("{0}: it is not yours (it must be owned by the user running the face)")]
    NotOwn(PathBuf),
    #[error("{0}: longer than 1 MiB")]
    TooLong(PathBuf),
    #[error("{0}: holds no key (add one with `agentos e2b keys add NAME --keys-file PATH`)")]
    Empty(PathBuf),
    #[error("{path} line {line}: {why}")]
    Line {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error("${KEY_ENV}: a key is 16 to 256 printable characters without spaces")]
    BadEnvKey,
    #[error("key name {0:?}: give 1 to {MAX_KEY_NAME} of A-Z a-z 0-9 _ -")]
    BadName(String),
    #[error("{path}: a key named {name} is there already")]
    Taken { path: PathBuf, name: String },
    #[error("reading random bytes: {0}")]
    Random(std::io::Error),
}

/// One key: its name and its hash.
#[derive(Debug, Clone)]
struct Entry {
    delegate: DelegateName,
    hash: [u8; 32],
}

/// The keys a face knows.
#[derive(Debug, Clone)]
pub struct Keys {
    entries: Vec<Entry>,
    /// Given to the face (a file, the environment), so their holders may
    /// share them; else the face's own key, its user's alone.
    given: bool,
}

impl Keys {
    /// The face's own key, `value`: the one delegate `e2b`.
    pub fn own(value: &[u8]) -> Keys {
        let delegate = DelegateName::new(KEYLESS_DELEGATE).expect("a valid delegate name");
        Keys {
            entries: vec![Entry {
                delegate,
                hash: Sha256::digest(value).into(),
            }],
            given: false,
        }
    }

    /// The keys in `path`, a regular file only its owner (this user) may
    /// read: lines `NAME sha256:HEX`, blank lines and `#` comments. A
    /// file with none is an error: the face would serve no one.
    pub fn from_file(path: &Path) -> Result<Keys, KeysError> {
        let keys = Keys::parse_file(path)?;
        if keys.entries.is_empty() {
            return Err(KeysError::Empty(path.to_owned()));
        }
        Ok(keys)
    }

    fn parse_file(path: &Path) -> Result<Keys, KeysError> {
        let text = read_private(path)?;
        let mut entries = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| KeysError::Line {
                path: path.to_owned(),
                line: index + 1,
                why: why.to_owned(),
            };
            let (name, hash) = line
                .split_once(char::is_whitespace)
                .ok_or_else(|| bad("give NAME sha256:HEX"))?;
            let delegate = delegate_for(name).map_err(|err| bad(&err.to_string()))?;
            let hash = parse_hash(hash.trim()).ok_or_else(|| bad("give the hash as sha256:HEX"))?;
            if entries
                .iter()
                .any(|entry: &Entry| entry.delegate == delegate)
            {
                return Err(bad("the name is given twice"));
            }
            entries.push(Entry { delegate, hash });
        }
        Ok(Keys {
            entries,
            given: true,
        })
    }

    /// The key in `value` (`AGENTOS_E2B_API_KEY`), named `default`.
    pub fn from_env_value(value: &[u8]) -> Result<Keys, KeysError> {
        let value = value.trim_ascii();
        if !(16..=256).contains(&value.len()) || !value.iter().all(u8::is_ascii_graphic) {
            return Err(KeysError::BadEnvKey);
        }
        Ok(Keys {
            entries: vec![Entry {
                delegate: delegate_for("default")?,
                hash: Sha256::digest(value).into(),
            }],
            given: true,
        })
    }

    /// Every delegate a request may speak for.
    pub fn delegates(&self) -> Vec<DelegateName> {
        self.entries.iter().map(|entry| entry.delegate).collect()
    }

    /// Whether the keys were given (shared by their holders), rather than
    /// made by the face for its own user.
    pub fn given(&self) -> bool {
        self.given
    }

    /// The delegate `presented` speaks for, if it is a key the face knows.
    pub fn delegate_of(&self, presented: &[u8]) -> Option<DelegateName> {
        let hash: [u8; 32] = Sha256::digest(presented).into();
        // Every entry is compared, whichever matches, so the time taken
        // says nothing of which one did.
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.hash.ct_eq(&hash)) {
                found = Some(entry.delegate);
            }
        }
        found
    }
}

/// The delegate a key named `name` speaks for: `e2b.NAME`.
fn delegate_for(name: &str) -> Result<DelegateName, KeysError> {
    let fits = !name.is_empty()
        && name.len() <= MAX_KEY_NAME
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-'));
    if !fits {
        return Err(KeysError::BadName(name.to_owned()));
    }
    DelegateName::new(&format!("{KEYLESS_DELEGATE}.{name}"))
        .map_err(|_| KeysError::BadName(name.to_owned()))
}

/// `sha256:` and 64 hex digits.
fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let hex = text.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (byte, pair) in hash.iter_mut().zip(hex.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(hash)
}

/// Makes a key named `name`, adds its hash to `path` (made, mode 600, if
/// it is not there) and returns the key, which is not kept anywhere.
pub fn add_key(path: &Path, name: &str) -> Result<String, KeysError> {
    let delegate = delegate_for(name)?;
    let existing = match Keys::parse_file(path) {
        Ok(keys) => keys.entries,
        Err(KeysError::File { error, .. }) if error.kind() == ErrorKind::NotFound => Vec::new(),
        Err(err) => return Err(err),
    };
    if existing.iter().any(|entry| entry.delegate == delegate) {
        return Err(KeysError::Taken {
            path: path.to_owned(),
            name: name.to_owned(),
        });
    }
    let random = agentos_http::random::bytes::<MADE_KEY_BYTES>().map_err(KeysError::Random)?;
    let key = format!("e2b_{}", hex(&random));
    let file_error = |error| KeysError::File {
        path: path.to_owned(),
        error,
    };
    // O_NOFOLLOW: a link put in the file's place is not written through.
    let mut file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(file_error)?;
    let line = format!("{name} sha256:{}\n", hex(&Sha256::digest(key.as_bytes())));
    file.write_all(line.as_bytes()).map_err(file_error)?;
    Ok(key)
}

/// The text of `path`, a regular file of this user's that no one else
/// may read or write, checked on the file as opened.
fn read_private(path: &Path) -> Result<String, KeysError> {
    let file_error = |error| KeysError::File {
        path: path.to_owned(),
        error,
    };
    // O_NONBLOCK: a FIFO put in the file's place cannot hang the start.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(file_error)?;
    let metadata = file.metadata().map_err(file_error)?;
    if !metadata.is_file() {
        return Err(KeysError::NotRegular(path.to_owned()));
    }
    if metadata.mode() & 0o077 != 0 {
        return Err(KeysError::Shared(path.to_owned()));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if metadata.uid() != unsafe { libc::geteuid() } {
        return Err(KeysError::NotOwn(path.to_owned()));
    }
    let mut text = String::new();
    file.take(MAX_KEYS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(file_error)?;
    if text.len() as u64 > MAX_KEYS_FILE_BYTES {
        return Err(KeysError::TooLong(path.to_owned()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn an_added_key_is_found_and_names_its_delegate_and_no_other_value_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        let alice = add_key(&path, "alice").unwrap();
        let bob = add_key(&path, "bob").unwrap();
        assert!(alice.starts_with("e2b_") && alice.len() == 52, "{alice}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let keys = Keys::from_file(&path).unwrap();
        assert_eq!(
            keys.delegate_of(alice.as_bytes()).unwrap().as_str(),
            "e2b.alice"
        );
        assert_eq!(
            keys.delegate_of(bob.as_bytes()).unwrap().as_str(),
            "e2b.bob"
        );
        assert!(keys.delegate_of(b"e2b_wrong").is_none());
        assert!(keys.delegate_of(&alice.as_bytes()[1..]).is_none());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&alice), "the key itself is never kept");
        assert!(matches!(
            add_key(&path, "alice"),
            Err(KeysError::Taken { .. })
        ));
    }

    #[test]
    fn a_shared_file_a_bad_line_and_a_bad_name_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, format!("a sha256:{}\n", "0".repeat(64))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(Keys::from_file(&path), Err(KeysError::Shared(_))));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Keys::from_file(&path).unwrap().entries.len(), 1);
        std::fs::write(&path, "# no keys yet\n").unwrap();
        assert!(matches!(Keys::from_file(&path), Err(KeysError::Empty(_))));
        for bad in [
            "a sha256:00",
            "a md5:00",
            "../x sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "a",
        ] {
            std::fs::write(&path, format!("# keys\n\n{bad}\n")).unwrap();
            let err = Keys::from_file(&path).unwrap_err();
            assert!(
                matches!(err, KeysError::Line { line: 3, .. }),
                "{bad}: {err}"
            );
        }
        for bad in ["", "a.b", "a/b", &"x".repeat(45)] {
            assert!(
                matches!(delegate_for(bad), Err(KeysError::BadName(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_faces_own_key_is_the_one_delegate_and_the_env_key_is_default() {
        let own = Keys::own(b"made-by-the-face");
        assert_eq!(
            own.delegate_of(b"made-by-the-face").unwrap().as_str(),
            "e2b"
        );
        assert!(own.delegate_of(b"anything").is_none());
        assert!(!own.given());
        let one = Keys::from_env_value(b"a-long-enough-key\n").unwrap();
        assert_eq!(
            one.delegate_of(b"a-long-enough-key").unwrap().as_str(),
            "e2b.default"
        );
        assert!(one.delegate_of(b"anything").is_none());
        assert!(Keys::from_env_value(b"short").is_err());
        assert!(Keys::from_env_value(b"has a space in it ok").is_err());
    }
}
