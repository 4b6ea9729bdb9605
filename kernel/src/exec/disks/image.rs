//! A disk: an ext4 filesystem in a file of its own, mounted through a loop
//! device under the state directory — a session's (written by its runs),
//! or a template's (written by its build, then read-only). Every sandbox runs as
//! the same unprivileged user, so no uid quota can tell two sessions
//! apart; a filesystem of a fixed size can, and its writer gets `ENOSPC`
//! when it is full, at the write that fills it. The file is allocated
//! whole when it is made, so a session's writes never find the host's
//! disk full instead.
//!
//! Everything here blocks (it runs on the disks' own thread): allocating
//! and formatting a disk takes tens of milliseconds, mounting one about
//! fifteen.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{umount2, MntFlags};

/// The image, inside a session's directory.
const IMAGE: &str = "disk.img";
/// Where it is mounted, inside a session's directory.
const MOUNT_POINT: &str = "mnt";
/// Where an image is made before it is complete: a kernel killed while
/// making one leaves only this, which the next attempt replaces.
const IMAGE_BEING_MADE: &str = "disk.img.new";
/// Where the system tools that make and mount disks are found.
const TOOL_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// The ext4 journal of a disk, in MiB: small disks, small
/// journal (mkfs would take 32 MiB of a 1 GiB disk).
const JOURNAL_MIB: &str = "4";

/// What a session's disk holds at its root.
pub const SESSION_PARTS: [&str; 3] = ["workspace", "home", "tmp"];
/// What a template's disk holds at its root: its environment.
pub const TEMPLATE_PARTS: [&str; 1] = ["env"];

/// The user runs are, who owns a disk's parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunUser {
    /// Its uid on the host.
    pub uid: u32,
    /// Its gid on the host.
    pub gid: u32,
}

/// A disk's directory on the host: its image, where it is mounted, and
/// the kernel's record of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskDir(pub PathBuf);

impl DiskDir {
    /// Its mounted disk's root.
    pub fn mount_point(&self) -> PathBuf {
        self.0.join(MOUNT_POINT)
    }

    /// Its disk's image file.
    pub fn image(&self) -> PathBuf {
        self.0.join(IMAGE)
    }

    /// The BLAKE3 hash of its disk's image, in lowercase hex.
    pub fn image_hash(&self) -> io::Result<String> {
        let mut hasher = blake3::Hasher::new();
        hasher.update_reader(fs::File::open(self.image())?)?;
        Ok(hasher.finalize().to_hex().to_string())
    }

    /// Checks its (unmounted) disk's filesystem, changing nothing: a disk
    /// from elsewhere is mounted only once this passes.
    pub fn check_filesystem(&self) -> io::Result<()> {
        run(Command::new("e2fsck").args(["-f", "-n"]).arg(self.image()))
    }

    /// Whether its disk has been made.
    pub fn has_disk(&self) -> bool {
        self.image().is_file()
    }

    /// Makes its disk of `bytes` if it has none, and mounts it (writable)
    /// if it is not mounted, with `parts` at its root: whether the disk was
    /// there already.
    pub fn mount(&self, bytes: u64, user: RunUser, parts: &[&str]) -> io::Result<bool> {
        let existed = self.has_disk();
        if !existed {
            self.make(bytes, user)?;
        }
        self.mount_as("loop,nosuid,nodev,noatime")?;
        prepare_parts(&self.mount_point(), user, parts)?;
        Ok(existed)
    }

    /// Whether its disk is mounted.
    pub fn is_mounted(&self) -> bool {
        is_mount_point(&self.mount_point()).unwrap_or(false)
    }

    /// Mounts its disk, made before, writable if it is not mounted.
    pub fn mount_made(&self) -> io::Result<()> {
        if !self.has_disk() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "it has no disk"));
        }
        self.mount_as("loop,nosuid,nodev,noatime")
    }

    /// Mounts its disk read-only, if it is not mounted.
    pub fn mount_read_only(&self) -> io::Result<()> {
        if !self.has_disk() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "it has no disk"));
        }
        self.mount_as("loop,ro,nosuid,nodev,noatime")
    }

    fn mount_as(&self, options: &str) -> io::Result<()> {
        let mount_point = self.mount_point();
        if !is_mount_point(&mount_point)? {
            if let Some(device) = attached_loop_device(&self.image())? {
                // Mounted once more, the filesystem would be written by two
                // at once: what held it (a kernel killed, its sandboxes still
                // ending) must let it go first.
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("its disk is still held by {device}; retry in a moment"),
                ));
            }
            run(Command::new("mount")
                .args(["-t", "ext4", "-o", options])
                .arg(self.image())
                .arg(&mount_point))?;
        }
        Ok(())
    }

    /// Unmounts it and waits (up to `patience`) for its loop device to let
    /// it go, so that it can be checked, shrunk, moved or mounted again.
    pub fn release(&self, patience: std::time::Duration) -> io::Result<()> {
        self.unmount()?;
        let deadline = std::time::Instant::now() + patience;
        while let Some(device) = attached_loop_device(&self.image())? {
            if std::time::Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("its disk is still held by {device}"),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(())
    }

    /// Shrinks its (released) disk to what it holds: a template built in a
    /// large disk keeps only the room its files take.
    pub fn shrink(&self) -> io::Result<()> {
        let image = self.image();
        run(Command::new("e2fsck").args(["-f", "-y"]).arg(&image))?;
        run(Command::new("resize2fs").args(["-M"]).arg(&image))?;
        let output = Command::new("dumpe2fs")
            .env_clear()
            .env("PATH", TOOL_PATH)
            .args(["-h"])
            .arg(&image)
            .output()?;
        let header = String::from_utf8_lossy(&output.stdout);
        let field = |name: &str| -> Option<u64> {
            header
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().parse().ok())
        };
        if let (Some(blocks), Some(size)) = (field("Block count:"), field("Block size:")) {
            fs::OpenOptions::new()
                .write(true)
                .open(&image)?
                .set_len(blocks * size)?;
        }
        Ok(())
    }

    /// Bytes its image takes on the host.
    pub fn image_bytes(&self) -> u64 {
        fs::metadata(self.image()).map_or(0, |meta| meta.blocks() * 512)
    }

    /// Makes its directory and disk: allocated whole, formatted, and only
    /// then given its name.
    fn make(&self, bytes: u64, user: RunUser) -> io::Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.mount_point())?;
        let building = self.0.join(IMAGE_BEING_MADE);
        let _ = fs::remove_file(&building);
        let file = fs::File::create(&building)?;
        nix::fcntl::posix_fallocate(&file, 0, bytes as i64).map_err(io::Error::from)?;
        drop(file);
        let owner = format!("root_owner={}:{},nodiscard", user.uid, user.gid);
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-L", "agentos-session", "-J"])
            .arg(format!("size={JOURNAL_MIB}"))
            .args(["-E", &owner])
            .arg(&building))?;
        fs::rename(&building, self.image())
    }

    /// Becomes the disk `spare` made ahead (mounted, its parts in place):
    /// its directory is moved here, the mount with it.
    pub fn take_spare(&self, spare: &DiskDir) -> io::Result<()> {
        if let Some(parent) = self.0.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
        fs::rename(&spare.0, &self.0)
    }

    /// Unmounts its disk (lazily: a sandbox ending still holds it a
    /// moment), which stays on the host.
    pub fn unmount(&self) -> io::Result<()> {
        detach(&self.mount_point())
    }

    /// Unmounts and deletes it, disk and all.
    pub fn remove(&self) -> io::Result<()> {
        self.unmount()?;
        match fs::remove_dir_all(&self.0) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ => Ok(()),
        }
    }

    /// Bytes used on its disk, if it is mounted.
    pub fn used_bytes(&self) -> Option<u64> {
        let mount_point = self.mount_point();
        if !is_mount_point(&mount_point).unwrap_or(false) {
            return None;
        }
        let stat = nix::sys::statvfs::statvfs(&mount_point).ok()?;
        let blocks = stat.blocks().saturating_sub(stat.blocks_free());
        Some(blocks * stat.fragment_size())
    }
}

/// The disk's parts, made on its first mount: each the run user's, not
/// the others' (0700), `/tmp` as every `/tmp` is (1777), a template's
/// environment readable by every run (0755).
/// Bytes an unprivileged writer may still put on the filesystem `path`
/// lies on.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(path)?;
    Ok(stat.blocks_available() * stat.fragment_size())
}

fn prepare_parts(root: &Path, user: RunUser, parts: &[&str]) -> io::Result<()> {
    for &part in parts {
        let path = root.join(part);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() && !meta.file_type().is_symlink() => continue,
            Ok(_) => {
                // Only the kernel writes the disk's root; something else
                // there is a damaged disk, not the run's doing.
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not a directory", path.display()),
                ));
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        fs::create_dir(&path)?;
        let mode = match part {
            "tmp" => 0o1777,
            "env" => 0o755,
            _ => 0o700,
        };
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))?;
        if part == "home" {
            let profile = path.join(".profile");
            fs::write(&profile, LOGIN_PROFILE)?;
            std::os::unix::fs::chown(&profile, Some(user.uid), Some(user.gid))?;
        }
    }
    Ok(())
}

/// A new home's `.profile`. A login shell (`bash -l`, as E2B's SDKs run
/// every command) reads `/etc/profile`, which sets `PATH` anew for a
/// user who is not root; this puts the session's own programs first
/// again, as every other process of the session has them: its packages,
/// then its template's.
const LOGIN_PROFILE: &str = "\
# A login shell's /etc/profile sets PATH anew: the session's packages
# (~/.venv/bin) and its template's programs (/opt/template/bin) come
# first again, as they do for the session's other processes.
for dir in /opt/template/bin \"$HOME/.venv/bin\"; do
  case \":$PATH:\" in
    *\":$dir:\"*) ;;
    *) if [ -d \"$dir\" ]; then PATH=\"$dir:$PATH\"; fi ;;
  esac
done
export PATH
";

/// Whether something is mounted on `path` (a directory on another device
/// than its parent's).
fn is_mount_point(path: &Path) -> io::Result<bool> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(err),
    };
    let parent = path.parent().unwrap_or(Path::new("/"));
    Ok(meta.dev() != fs::symlink_metadata(parent)?.dev())
}

/// Detaches every mount stacked on `path`.
pub fn detach(path: &Path) -> io::Result<()> {
    loop {
        match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => continue,
            // Nothing (more) mounted there, or no such directory.
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => return Ok(()),
            Err(err) => return Err(err.into()),
        }
    }
}

/// The loop device `image` is attached to, if one is.
fn attached_loop_device(image: &Path) -> io::Result<Option<String>> {
    let image = fs::canonicalize(image)?;
    let Ok(devices) = fs::read_dir("/sys/block") else {
        return Ok(None);
    };
    for device in devices.flatten() {
        let name = device.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = fs::read_to_string(device.path().join("loop/backing_file")) else {
            continue;
        };
        if Path::new(backing.trim_end()) == image {
            return Ok(Some(format!("/dev/{name}")));
        }
    }
    Ok(None)
}

/// Runs a system tool, with nothing of the kernel's environment.
fn run(command: &mut Command) -> io::Result<()> {
    let output = command
        .env_clear()
        .env("PATH", TOOL_PATH)
        .stdin(std::process::Stdio::null())
        .output()?;
    if output.status.success() {
        return Ok(());
    }
    let program = command.get_program().to_string_lossy().into_owned();
    Err(io::Error::other(format!(
        "{program} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

/// Whether this host can give sessions disks: root (loop devices and
/// mounts), and the tools that make and mount them. Why not, if not.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("sessions' disks need a root daemon (loop devices)".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("sessions' disks need loop devices (/dev/loop-control)".into());
    }
    for tool in ["mkfs.ext4", "mount", "e2fsck", "resize2fs", "dumpe2fs"] {
        let found = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .any(|dir| Path::new(dir).join(tool).is_file());
        if !found {
            return Some(format!(
                "sessions' disks need {tool} (e2fsprogs, util-linux)"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_only() -> bool {
        if let Some(why) = unavailable() {
            eprintln!("SKIPPED: {why}");
            return false;
        }
        true
    }

    const NOBODY: RunUser = RunUser {
        uid: 65534,
        gid: 65534,
    };

    #[test]
    fn a_disk_is_made_mounted_full_at_its_size_and_removed() {
        if !root_only() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let session = DiskDir(dir.path().join("s1"));
        assert!(
            !session.mount(16 << 20, NOBODY, &SESSION_PARTS).unwrap(),
            "a new disk"
        );
        let root = session.mount_point();
        for part in SESSION_PARTS {
            let meta = fs::metadata(root.join(part)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "{part}");
        }
        // Mounting again finds it mounted: nothing changes.
        assert!(
            session.mount(16 << 20, NOBODY, &SESSION_PARTS).unwrap(),
            "the same disk"
        );
        let big = vec![7u8; 32 << 20];
        let err = fs::write(root.join("workspace/big"), &big).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        // Unmounted, the files stay on the disk.
        fs::write(root.join("workspace/kept"), b"kept").unwrap();
        session.unmount().unwrap();
        assert!(!root.join("workspace").exists());
        assert!(session.mount(16 << 20, NOBODY, &SESSION_PARTS).unwrap());
        assert_eq!(fs::read(root.join("workspace/kept")).unwrap(), b"kept");
        session.remove().unwrap();
        assert!(!session.0.exists());
    }

    #[test]
    fn a_template_disk_is_shrunk_to_its_files_and_served_read_only() {
        if !root_only() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let template = DiskDir(dir.path().join("t1"));
        template.mount(64 << 20, NOBODY, &TEMPLATE_PARTS).unwrap();
        let env = template.mount_point().join("env");
        fs::write(env.join("module.py"), vec![b'#'; 1 << 20]).unwrap();
        template.release(std::time::Duration::from_secs(5)).unwrap();
        template.shrink().unwrap();
        let size = fs::metadata(template.image()).unwrap().len();
        assert!(size < 32 << 20, "shrunk to {size} bytes");
        template.mount_read_only().unwrap();
        assert_eq!(fs::metadata(env.join("module.py")).unwrap().len(), 1 << 20);
        let err = fs::write(env.join("other.py"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
        template.remove().unwrap();
    }

    #[test]
    fn a_disk_that_was_half_made_is_made_again() {
        if !root_only() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let session = DiskDir(dir.path().join("s1"));
        fs::create_dir_all(session.mount_point()).unwrap();
        fs::write(session.0.join(IMAGE_BEING_MADE), b"cut short").unwrap();
        assert!(!session.mount(16 << 20, NOBODY, &SESSION_PARTS).unwrap());
        assert!(!session.0.join(IMAGE_BEING_MADE).exists());
        session.remove().unwrap();
    }
}
