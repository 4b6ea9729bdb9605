//! Taking a snapshot: a walk of a session's disk as the kernel mounted it,
//! never through a symlink. Directories and regular files are kept, each
//! file's content copied into the owner's objects as it was read (unless
//! an earlier snapshot saw it unchanged); anything else — a symlink, a
//! device, a socket, a name that is not UTF-8, a file swapped meanwhile —
//! is left out, and named if it is in `/workspace` (the environment's own
//! links, its interpreter's, are made again when it is restored).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::Dir;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};

use super::manifest::Entry;
use super::objects::{Objects, Put};

/// The parts of a session's disk a snapshot covers: its files, and its
/// home with the packages it installed (`home/.cache` aside: caches).
pub const SNAPSHOT_PARTS: [&str; 2] = ["workspace", "home"];
/// Beneath `home`, what a snapshot leaves out.
const LEFT_OUT_OF_HOME: &str = ".cache";

/// A snapshot being taken into one owner's objects.
pub struct Walk<'a> {
    objects: &'a Objects,
    /// Bytes it may still add.
    room: u64,
    /// Why it may add no more, past `room`.
    room_is: String,
    /// Objects it has added, removed if it fails.
    pub added: Vec<String>,
    /// Their bytes.
    pub added_bytes: u64,
    /// Paths in `/workspace` not saved, relative to it.
    pub left_out: Vec<String>,
}

impl<'a> Walk<'a> {
    /// A walk adding at most `room` bytes to `objects` (`room_is` says
    /// whose room it is).
    pub fn new(objects: &'a Objects, room: u64, room_is: String) -> Walk<'a> {
        Walk {
            objects,
            room,
            room_is,
            added: Vec::new(),
            added_bytes: 0,
            left_out: Vec::new(),
        }
    }

    /// Walks the parts of the disk mounted at `disk` (`known`: what
    /// earlier snapshots of its session saw, by path): its entries, each
    /// directory before what it holds, and the bytes of its files.
    pub fn disk(
        &mut self,
        disk: &Path,
        known: &HashMap<String, Entry>,
    ) -> io::Result<(Vec<Entry>, u64)> {
        let mut entries = Vec::new();
        let mut bytes = 0;
        let root = File::open(disk)?;
        for part in SNAPSHOT_PARTS {
            let Ok(dir) = open_at(root.as_fd(), OsStr::new(part), OFlag::O_DIRECTORY) else {
                continue;
            };
            let mut pending = vec![(part.to_owned(), dir)];
            while let Some((path, dir)) = pending.pop() {
                let mut listed = list(&dir)?;
                listed.sort();
                for name in listed {
                    let Some(text) = name.to_str() else {
                        self.leave_out(&format!("{path}/{}", name.to_string_lossy()));
                        continue;
                    };
                    if path == "home" && text == LEFT_OUT_OF_HOME {
                        continue;
                    }
                    let child = format!("{path}/{text}");
                    let Ok(fd) = open_at(dir.as_fd(), &name, OFlag::O_NONBLOCK) else {
                        // A symlink, or something swapped or gone.
                        self.leave_out(&child);
                        continue;
                    };
                    let stat = fstat(&fd).map_err(io::Error::from)?;
                    let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
                    if kind == SFlag::S_IFDIR {
                        entries.push(Entry {
                            path: child.clone(),
                            hash: None,
                            size: 0,
                            exec: false,
                            seen: (0, 0),
                        });
                        pending.push((child, fd));
                    } else if kind == SFlag::S_IFREG {
                        let seen = (
                            stat.st_ino,
                            stat.st_ctime * 1_000_000_000 + stat.st_ctime_nsec,
                        );
                        let size = stat.st_size as u64;
                        let unchanged = known
                            .get(&child)
                            .filter(|e| e.seen == seen && e.size == size)
                            .and_then(|e| e.hash.clone())
                            .filter(|hash| self.objects.has(hash));
                        let (hash, size) = match unchanged {
                            Some(hash) => (hash, size),
                            None => self.put(File::from(fd))?,
                        };
                        bytes += size;
                        entries.push(Entry {
                            path: child,
                            hash: Some(hash),
                            size,
                            exec: stat.st_mode & 0o111 != 0,
                            seen,
                        });
                    } else {
                        // A device, a socket, a FIFO: never kept.
                        self.leave_out(&child);
                    }
                }
            }
        }
        Ok((entries, bytes))
    }

    /// Names `path` (beneath the disk's root) as left out, if it is in
    /// `/workspace`.
    fn leave_out(&mut self, path: &str) {
        if let Some(relative) = path.strip_prefix("workspace/") {
            self.left_out.push(relative.to_owned());
        }
    }

    /// Copies `source` into the objects, within the room left: its hash
    /// and bytes.
    pub fn put(&mut self, source: File) -> io::Result<(String, u64)> {
        let (room, used) = (self.room, self.added_bytes);
        let room_is = &self.room_is;
        let put = self.objects.put(source, |bytes| {
            if used + bytes <= room {
                return Ok(());
            }
            Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "the snapshot needs more than the {} bytes left of {room_is}; remove a \
                     snapshot or close a session",
                    room.saturating_sub(used)
                ),
            ))
        })?;
        let Put { hash, bytes, added } = put;
        if added {
            self.added.push(hash.clone());
            self.added_bytes += bytes;
        }
        Ok((hash, bytes))
    }
}

/// Opens `name` in `dir` for reading (with `flags` beside), never through
/// a symlink.
fn open_at(dir: BorrowedFd<'_>, name: &OsStr, flags: OFlag) -> io::Result<OwnedFd> {
    let flags = flags | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    Ok(openat(dir, name, flags, Mode::empty())?)
}

/// The names in directory `dir`.
fn list(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    let copy = nix::unistd::dup(dir).map_err(io::Error::from)?;
    let mut listing = Dir::from_fd(copy).map_err(io::Error::from)?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(io::Error::from)?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}
