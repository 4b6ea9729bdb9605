//! The bearer token an HTTP face requires of every request.
//!
//! A face never serves without one: a loopback port is open to every
//! user of the machine, and, through the kernel's egress proxy, to a
//! sandbox whose policy names a loopback range, whose connections are
//! the kernel's user's. Without a token given, one is made and kept in a
//! file only its owner can read, outside any sandbox's view.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;

/// A token file is one token and a line end: anything longer is a
/// wrong file.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// A token shorter than this is refused as guessable.
const MIN_TOKEN_BYTES: usize = 16;

/// Random bytes in a made token (written as twice as many hex digits).
const MADE_TOKEN_BYTES: usize = 32;

/// The bearer token every request must carry.
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// How a face came by its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `--token-file` or the environment: its holders may share it.
    Given,
    /// Made now and written to this file.
    Made(PathBuf),
    /// Made by an earlier start and read back from this file.
    Kept(PathBuf),
}

/// Why a face has no token to require. `source` names where the token
/// was to come from (`--token-file PATH`, `the token file PATH`, an
/// environment variable).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file could not be opened, read or written.
    #[error("{source_name}")]
    File {
        source_name: String,
        #[source]
        error: std::io::Error,
    },
    #[error("{0}: not a regular file")]
    NotRegular(String),
    #[error("{0}: other users can read it; chmod 600 it")]
    Readable(String),
    #[error("{0}: longer than {MAX_TOKEN_FILE_BYTES} bytes; it holds one token")]
    TooLong(String),
    #[error("{0}: has no directory")]
    NoDirectory(String),
    /// The token file's directory could not be made.
    #[error("creating {}", dir.display())]
    CreateDirectory {
        dir: PathBuf,
        #[source]
        error: std::io::Error,
    },
    /// The directory is not the user's alone to write.
    #[error(
        "{source_name}: {} is not a directory of this user's that only it may write to; \
         give --token-file",
        dir.display()
    )]
    SharedDirectory { source_name: String, dir: PathBuf },
    #[error("{0}: not a file of this user's; remove it, or give --token-file")]
    NotOwn(String),
    #[error("{0}: a link, not a file of this user's; remove it, or give --token-file")]
    Link(String),
    #[error("reading /dev/urandom for a token")]
    Random(#[source] std::io::Error),
    #[error("{0}: the token must be at least {MIN_TOKEN_BYTES} characters")]
    TooShort(String),
    #[error("{0}: the token must be printable ASCII without spaces")]
    NotPrintable(String),
    #[error("neither XDG_CONFIG_HOME nor HOME is set to keep a token in: give --token-file")]
    NoConfigHome,
    #[error(
        "{} is not an absolute path to keep a token under: give --token-file",
        .0.display()
    )]
    RelativeConfigHome(PathBuf),
}

impl Token {
    /// The token in `path`, a regular file only its owner may read.
    pub fn from_file(path: &Path, flag: &str) -> Result<Token, TokenError> {
        let source = format!("{flag} {}", path.display());
        // O_NONBLOCK: a FIFO put in the file's place cannot hang the
        // start; it is refused below as not a regular file.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|error| file_error(&source, error))?;
        Token::read_private(file, &source)
    }

    /// The token in `file`, checked on the file as opened, not by its
    /// path, which may have changed since.
    fn read_private(file: File, source: &str) -> Result<Token, TokenError> {
        let metadata = file.metadata().map_err(|error| file_error(source, error))?;
        if !metadata.is_file() {
            return Err(TokenError::NotRegular(source.to_owned()));
        }
        // The file is the secret: one that others can read gives the
        // endpoint to them too.
        if metadata.mode() & 0o077 != 0 {
            return Err(TokenError::Readable(source.to_owned()));
        }
        let mut bytes = Vec::new();
        file.take(MAX_TOKEN_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| file_error(source, error))?;
        if bytes.len() as u64 > MAX_TOKEN_FILE_BYTES {
            return Err(TokenError::TooLong(source.to_owned()));
        }
        Token::new(bytes, source)
    }

    /// The token in `path` if an earlier start made one there, else a new
    /// one written there (mode 600, its directory 700). The directory and
    /// the file must be this user's own and no one else's to write, or
    /// someone else could have put a token they know there.
    pub fn made_or_kept(path: &Path) -> Result<(Token, Origin), TokenError> {
        let source = format!("the token file {}", path.display());
        let dir = path
            .parent()
            .ok_or_else(|| TokenError::NoDirectory(source.clone()))?;
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|error| TokenError::CreateDirectory {
                dir: dir.to_owned(),
                error,
            })?;
        let owner = effective_uid();
        let dir_metadata =
            std::fs::symlink_metadata(dir).map_err(|error| file_error(&source, error))?;
        if !dir_metadata.is_dir() || dir_metadata.uid() != owner || dir_metadata.mode() & 0o022 != 0
        {
            return Err(TokenError::SharedDirectory {
                source_name: source,
                dir: dir.to_owned(),
            });
        }
        // O_NOFOLLOW: a link put in the file's place is refused, not
        // followed to a file of someone else's choosing.
        let existing = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path);
        match existing {
            Ok(file) => {
                let metadata = file
                    .metadata()
                    .map_err(|error| file_error(&source, error))?;
                if metadata.uid() != owner {
                    return Err(TokenError::NotOwn(source));
                }
                let token = Token::read_private(file, &source)?;
                return Ok((token, Origin::Kept(path.to_owned())));
            }
            Err(err) if err.raw_os_error() == Some(libc::ELOOP) => {
                return Err(TokenError::Link(source));
            }
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Err(error) => return Err(file_error(&source, error)),
        }
        let mut random = [0u8; MADE_TOKEN_BYTES];
        File::open("/dev/urandom")
            .and_then(|mut urandom| urandom.read_exact(&mut random))
            .map_err(TokenError::Random)?;
        let text: String = random.iter().map(|byte| format!("{byte:02x}")).collect();
        // create_new: a file (or link) that appeared meanwhile is not
        // written through.
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|error| file_error(&source, error))?;
        writeln!(file, "{text}").map_err(|error| file_error(&source, error))?;
        Ok((Token(text.into_bytes()), Origin::Made(path.to_owned())))
    }

    /// The token in `bytes`, without the line end a file usually has.
    pub fn new(mut bytes: Vec<u8>, source: &str) -> Result<Token, TokenError> {
        while bytes.last().is_some_and(u8::is_ascii_whitespace) {
            bytes.pop();
        }
        if bytes.len() < MIN_TOKEN_BYTES {
            return Err(TokenError::TooShort(source.to_owned()));
        }
        // It goes in an HTTP header, so it is printable ASCII without
        // spaces, as RFC 6750's b64token is.
        if !bytes.iter().all(|byte| byte.is_ascii_graphic()) {
            return Err(TokenError::NotPrintable(source.to_owned()));
        }
        Ok(Token(bytes))
    }

    /// The token's bytes, for a face that derives other secrets from it.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Compares in time that does not depend on where the bytes differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.0.as_slice().ct_eq(presented))
    }
}

/// An I/O error on the token file named by `source`.
fn file_error(source: &str, error: std::io::Error) -> TokenError {
    TokenError::File {
        source_name: source.to_owned(),
        error,
    }
}

/// Where a face keeps the token it makes for `name`:
/// `$XDG_CONFIG_HOME/agentos/NAME-token`, else under `~/.config`. Both are
/// the user's own and no sandbox sees either.
pub fn default_token_path(name: &str) -> Result<PathBuf, TokenError> {
    let config = match std::env::var_os("XDG_CONFIG_HOME").filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|dir| !dir.is_empty()) {
            Some(home) => PathBuf::from(home).join(".config"),
            None => return Err(TokenError::NoConfigHome),
        },
    };
    if !config.is_absolute() {
        return Err(TokenError::RelativeConfigHome(config));
    }
    Ok(config.join("agentos").join(format!("{name}-token")))
}

/// The user this process runs as.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_long_printable_and_compared_whole() {
        assert!(Token::new(b"short".to_vec(), "t").is_err());
        assert!(Token::new(b"has a space in it, sixteen+".to_vec(), "t").is_err());
        let token = Token::new(b"0123456789abcdef\n".to_vec(), "t").unwrap();
        assert!(token.matches(b"0123456789abcdef"));
        assert!(!token.matches(b"0123456789abcdeF"));
        assert!(!token.matches(b"0123456789abcde"));
        assert!(!token.matches(b"0123456789abcdef0"));
    }

    #[test]
    fn a_made_token_is_private_and_kept_for_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/agentos/mcp-token");
        let (made, origin) = Token::made_or_kept(&path).unwrap();
        assert_eq!(origin, Origin::Made(path.clone()));
        let metadata = std::fs::metadata(&path).unwrap();
        assert_eq!(metadata.mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777,
            0o700
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim_end().len(), 2 * MADE_TOKEN_BYTES);
        assert!(made.matches(text.trim_end().as_bytes()));

        let (kept, origin) = Token::made_or_kept(&path).unwrap();
        assert_eq!(origin, Origin::Kept(path.clone()));
        assert!(kept.matches(text.trim_end().as_bytes()));
    }

    #[test]
    fn a_token_kept_where_others_may_write_or_that_is_no_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let refused = Token::made_or_kept(&shared.join("mcp-token"))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("only it may write to"), "{refused}");

        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        let fifo = private.join("mcp-token");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let refused = Token::made_or_kept(&fifo).unwrap_err().to_string();
        assert!(refused.contains("not a regular file"), "{refused}");
    }

    #[test]
    fn a_token_file_others_can_read_or_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp-token");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let refused = Token::made_or_kept(&path).unwrap_err().to_string();
        assert!(refused.contains("other users can read it"), "{refused}");

        let link = dir.path().join("linked-token");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let refused = Token::made_or_kept(&link).unwrap_err().to_string();
        assert!(refused.contains("a link"), "{refused}");
    }
}
