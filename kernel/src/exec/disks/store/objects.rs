//! An owner's objects: the contents of files, each in a file named by its
//! BLAKE3 hash (`objects/ab/abcd…`, 0400, the kernel's), written once
//! however many snapshots hold it. BLAKE3 rather than SHA-256 because a
//! restore reads every byte it copies once more to check it: at twice
//! SHA-256's speed here, the check keeps up with the copy.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use super::manifest::{ObjectError, BEING_WRITTEN};

/// Bytes copied at a time.
const CHUNK: usize = 256 << 10;

/// One owner's objects.
#[derive(Clone, Debug)]
pub struct Objects {
    dir: PathBuf,
}

/// An object put into the store.
#[derive(Debug)]
pub struct Put {
    /// Its hash.
    pub hash: String,
    /// Its bytes.
    pub bytes: u64,
    /// It was not there before.
    pub added: bool,
}

impl Objects {
    /// The objects in `dir`.
    pub fn new(dir: PathBuf) -> Objects {
        Objects { dir }
    }

    /// Where object `hash` lies (`hash` one that [`is_hash`] allows: a
    /// name from elsewhere is checked first).
    pub fn path(&self, hash: &str) -> PathBuf {
        let shard = hash.get(..2).unwrap_or("00");
        self.dir.join(shard).join(hash)
    }

    /// Whether object `hash` is there.
    pub fn has(&self, hash: &str) -> bool {
        self.path(hash).is_file()
    }

    /// Copies `source` into the store, unless `fits` says its bytes (when
    /// they are new to it) do not fit. One whose size does not fit is only
    /// read, not written, unless the store has it already: the host's disk
    /// never takes more than the room left.
    pub fn put(&self, mut source: File, fits: impl Fn(u64) -> io::Result<()>) -> io::Result<Put> {
        if let Err(err) = fits(source.metadata()?.len()) {
            let (bytes, hash) = copy_hashing(&mut source, &mut io::sink())?;
            if !self.has(&hash) {
                return Err(err);
            }
            let added = false;
            return Ok(Put { hash, bytes, added });
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let temporary = self
            .dir
            .join(format!("{BEING_WRITTEN}-{}", std::process::id()));
        let mut sink = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o400)
            .open(&temporary)?;
        let copied = copy_hashing(&mut source, &mut sink);
        drop(sink);
        let (bytes, hash) = match copied {
            Ok(copied) => copied,
            Err(err) => {
                let _ = fs::remove_file(&temporary);
                return Err(err);
            }
        };
        let object = self.path(&hash);
        if object.exists() {
            fs::remove_file(&temporary)?;
            return Ok(Put {
                hash,
                bytes,
                added: false,
            });
        }
        if let Err(err) = fits(bytes) {
            let _ = fs::remove_file(&temporary);
            return Err(err);
        }
        if let Some(shard) = object.parent() {
            fs::DirBuilder::new()
                .mode(0o700)
                .recursive(true)
                .create(shard)?;
        }
        fs::rename(&temporary, &object)?;
        Ok(Put {
            hash,
            bytes,
            added: true,
        })
    }

    /// Checks that object `hash` is `size` bytes whose hash is `hash`.
    pub fn check(&self, hash: &str, size: u64) -> Result<(), ObjectError> {
        let mut source = self.open(hash)?;
        let (read, found) =
            copy_hashing(&mut source, &mut io::sink()).map_err(ObjectError::Copy)?;
        if read != size || found != hash {
            return Err(ObjectError::Differs);
        }
        Ok(())
    }

    /// Copies object `hash`, of `size` bytes, into `sink` (by the host's
    /// kernel, never through this process's memory), unchecked: see
    /// [`Objects::check`].
    pub fn copy_out(&self, hash: &str, size: u64, sink: &File) -> Result<(), ObjectError> {
        let source = self.open(hash)?;
        let mut left = size;
        while left > 0 {
            let chunk = usize::try_from(left).unwrap_or(usize::MAX).min(1 << 30);
            match nix::sys::sendfile::sendfile64(sink, &source, None, chunk) {
                Ok(0) => return Err(ObjectError::CutShort),
                Ok(n) => left -= n as u64,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(errno) => return Err(ObjectError::Copy(errno.into())),
            }
        }
        Ok(())
    }

    /// Opens object `hash` for reading.
    pub fn open(&self, hash: &str) -> Result<File, ObjectError> {
        File::open(self.path(hash)).map_err(|err| ObjectError::Missing {
            hash: hash.to_owned(),
            err,
        })
    }

    /// Every object: its path, name and bytes (and what was being written
    /// when a kernel was killed, to be removed).
    pub fn list(&self) -> Vec<(PathBuf, String, u64)> {
        let mut found = Vec::new();
        let Ok(shards) = fs::read_dir(&self.dir) else {
            return found;
        };
        for shard in shards.flatten() {
            let path = shard.path();
            if !path.is_dir() {
                found.push((path, String::new(), 0));
                continue;
            }
            for object in fs::read_dir(&path).into_iter().flatten().flatten() {
                let bytes = object.metadata().map_or(0, |m| m.len());
                let name = object.file_name().into_string().unwrap_or_default();
                found.push((object.path(), name, bytes));
            }
        }
        found
    }
}

/// Copies `source` into `sink` whole: bytes copied and their hash.
fn copy_hashing(source: &mut File, sink: &mut impl Write) -> io::Result<(u64, String)> {
    let mut hasher = blake3::Hasher::new();
    let mut buffer = vec![0u8; CHUNK];
    let mut copied = 0u64;
    loop {
        let n = match source.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        hasher.update(&buffer[..n]);
        sink.write_all(&buffer[..n])?;
        copied += n as u64;
    }
    Ok((copied, hasher.finalize().to_hex().to_string()))
}

/// Whether `name` is an object's hash (BLAKE3, in lowercase hex), and so
/// a plain file name in the store.
pub fn is_hash(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}
