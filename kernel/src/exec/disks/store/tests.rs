//! The store on its own: a host disk that fills midway through a snapshot,
//! and a restore whose last object is damaged while the first are copied.

use std::fs;
use std::path::{Path, PathBuf};

use super::*;

const OWNER: &str = "uid-0";
const ROOMY: Room = Room {
    owner: u64::MAX,
    kernel: u64::MAX,
};
const ROOT: RunUser = RunUser { uid: 0, gid: 0 };

/// A session's disk as a snapshot sees it: `workspace` and `home`.
fn session_disk(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
    let disk = tempfile::tempdir().unwrap();
    fs::create_dir(disk.path().join("home")).unwrap();
    fs::create_dir(disk.path().join("workspace")).unwrap();
    for (name, bytes) in files {
        fs::write(disk.path().join("workspace").join(name), bytes).unwrap();
    }
    disk
}

/// `bytes` that no two calls repeat, so each is an object of its own.
fn noise(bytes: usize, seed: u8) -> Vec<u8> {
    let mut state = u64::from(seed) + 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn take(store: &mut Store, disk: &Path, name: &str) -> Result<Manifest, StoreError> {
    let taking = (OWNER, "s1", name);
    store
        .take(taking, Some(disk), None, ROOMY, 1)
        .map(|(manifest, _)| manifest)
}

/// A tmpfs of `bytes`, unmounted when dropped: a host disk that fills.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(bytes: u64) -> Option<SmallDisk> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("!!! NOT TESTED: a full host disk needs root (to mount a small tmpfs)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap().keep();
        let size = format!("size={bytes}");
        nix::mount::mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(size.as_str()),
        )
        .unwrap();
        Some(SmallDisk(dir))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = fs::remove_dir(&self.0);
    }
}

#[test]
fn a_host_disk_full_midway_refuses_the_snapshot_as_a_limit_and_the_earlier_one_stands() {
    let Some(host) = SmallDisk::mount(2 << 20) else {
        return;
    };
    let mut store = Store::open(host.0.join("snapshots"));
    let disk = session_disk(&[("a.txt", b"saved".to_vec())]);
    let first = take(&mut store, disk.path(), "n1").unwrap();
    let held = store.held_by(OWNER);

    // Bigger than the whole disk, though the room (as the kernel counts
    // it) would take it: the write itself runs out of space.
    fs::write(disk.path().join("workspace/big.bin"), noise(3 << 20, 1)).unwrap();
    let err = take(&mut store, disk.path(), "n1").unwrap_err();
    assert!(matches!(err, StoreError::Full(_)), "{err:?}");
    assert!(err.to_string().contains("disk is full"), "{err}");

    // The earlier snapshot is whole and alone: its manifest, its objects
    // and nothing of the failed one (no object half written).
    assert_eq!(store.manifest(OWNER, "s1", "n1").unwrap(), first);
    assert_eq!(store.held_by(OWNER), held);
    let objects: Vec<_> = store.objects(OWNER).list();
    assert_eq!(objects.len(), 1, "{objects:?}");
    let restored = session_disk(&[]);
    store.restore(OWNER, &first, restored.path(), ROOT).unwrap();
    assert_eq!(
        fs::read(restored.path().join("workspace/a.txt")).unwrap(),
        b"saved"
    );
    assert!(!restored.path().join("workspace/big.bin").exists());
}

#[test]
fn a_restore_is_refused_when_an_object_it_has_already_copied_from_is_damaged_later() {
    let root = tempfile::tempdir().unwrap();
    let mut store = Store::open(root.path().join("snapshots"));
    let files: Vec<(String, Vec<u8>)> = (0..40u8)
        .map(|n| (format!("f{n:02}.bin"), noise(64 << 10, n)))
        .collect();
    let named: Vec<(&str, Vec<u8>)> = files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    let disk = session_disk(&named);
    let manifest = take(&mut store, disk.path(), "n1").unwrap();

    // The last file's object, one bit flipped: its size is right, so only
    // the check of its hash, beside the copy, can find it.
    let last = manifest
        .entries
        .iter()
        .rev()
        .find_map(|e| e.hash.clone())
        .unwrap();
    let object = store.objects(OWNER).path(&last);
    let mut bytes = fs::read(&object).unwrap();
    bytes[0] ^= 1;
    fs::set_permissions(&object, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    fs::write(&object, &bytes).unwrap();

    let target = session_disk(&[("mine.txt", b"mine".to_vec())]);
    let err = store
        .restore(OWNER, &manifest, target.path(), ROOT)
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Damaged { name, why: Damage::Object { path, .. } }
            if name == "n1" && path == "workspace/f39.bin"),
        "{err:?}"
    );
    // Nothing changed: the disk's own file stands, nothing was swapped in.
    assert_eq!(
        fs::read(target.path().join("workspace/mine.txt")).unwrap(),
        b"mine"
    );
    assert!(!target.path().join("workspace/f00.bin").exists());
    assert!(!target.path().join(".restoring").exists());
}

#[test]
fn a_restore_copies_every_file_whole() {
    let root = tempfile::tempdir().unwrap();
    let mut store = Store::open(root.path().join("snapshots"));
    let big = noise(3 << 20, 7);
    let disk = session_disk(&[("big.bin", big.clone()), ("empty", Vec::new())]);
    let manifest = take(&mut store, disk.path(), "n1").unwrap();
    let target = session_disk(&[]);
    store
        .restore(OWNER, &manifest, target.path(), ROOT)
        .unwrap();
    assert_eq!(
        fs::read(target.path().join("workspace/big.bin")).unwrap(),
        big
    );
    assert_eq!(
        fs::read(target.path().join("workspace/empty")).unwrap(),
        b""
    );
}

#[test]
fn a_delegates_snapshots_count_with_its_operators_and_no_one_elses() {
    let root = tempfile::tempdir().unwrap();
    let mut store = Store::open(root.path().join("snapshots"));
    let disk = session_disk(&[("a.txt", noise(4096, 7))]);
    for owner in ["uid-1000~k1", "uid-1000~k2", "uid-1001~k1"] {
        store
            .take((owner, "s1", "n1"), Some(disk.path()), None, ROOMY, 1)
            .unwrap();
    }
    let one = store.held_by("uid-1001~k1");
    assert!(one > 0);
    assert_eq!(store.held_by("uid-1000"), 2 * one);
    assert_eq!(store.held_by("uid-1000~k9"), 2 * one);
    assert_eq!(store.held_by("uid-1001"), one);
}

/// Another node's store's snapshot `taken`, laid out as the fleet hands
/// it over: the manifest's bytes, and a staging directory holding each
/// object under its hash.
fn handed_over(from: &Store, taken: &Manifest) -> (Vec<u8>, tempfile::TempDir) {
    let staging = tempfile::tempdir().unwrap();
    let files = from.files_of(OWNER, taken);
    for (hash, path) in &files.contents {
        fs::copy(path, staging.path().join(hash)).unwrap();
    }
    (fs::read(&files.manifest).unwrap(), staging)
}

#[test]
fn a_snapshot_from_another_node_is_brought_in_whole_and_checked() {
    let disk = session_disk(&[("a.txt", noise(5000, 1)), ("b.txt", noise(7000, 2))]);
    let mut there = Store::open(tempfile::tempdir().unwrap().keep());
    let taken = take(&mut there, disk.path(), "~hibernated").unwrap();
    let mut here = Store::open(tempfile::tempdir().unwrap().keep());

    let (manifest, staging) = handed_over(&there, &taken);
    let importing = (OWNER, "s9", "~hibernated");
    let brought = here
        .import(importing, &manifest, staging.path(), ROOMY)
        .unwrap();
    assert_eq!(
        (brought.session.as_str(), brought.entries),
        ("s9", taken.entries.clone())
    );
    assert_eq!(here.held_by(OWNER), 12000);
    assert!(!staging.path().exists(), "the staging directory goes");
    let restored = tempfile::tempdir().unwrap();
    fs::create_dir(restored.path().join("workspace")).unwrap();
    fs::create_dir(restored.path().join("home")).unwrap();
    let manifest = here.manifest(OWNER, "s9", "~hibernated").unwrap();
    here.restore(OWNER, &manifest, restored.path(), ROOT)
        .unwrap();
    let read = fs::read(restored.path().join("workspace/b.txt")).unwrap();
    assert_eq!(read, noise(7000, 2));

    // A content that is not what its hash says: refused, nothing kept.
    let mut fresh = Store::open(tempfile::tempdir().unwrap().keep());
    let (manifest, staging) = handed_over(&there, &taken);
    let victim = fs::read_dir(staging.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    fs::write(victim.path(), b"something else").unwrap();
    let refused = fresh.import(importing, &manifest, staging.path(), ROOMY);
    assert!(
        matches!(refused, Err(StoreError::Damaged { .. })),
        "{refused:?}"
    );
    assert_eq!(fresh.held_by(OWNER), 0);
    assert!(fresh.manifest(OWNER, "s9", "~hibernated").is_err());

    // Past the owner's room: a limit, nothing kept.
    let (manifest, staging) = handed_over(&there, &taken);
    let small = Room {
        owner: 6000,
        kernel: u64::MAX,
    };
    let refused = fresh.import(importing, &manifest, staging.path(), small);
    assert!(matches!(refused, Err(StoreError::Full(_))), "{refused:?}");
    assert_eq!(fresh.held_by(OWNER), 0);
}

#[test]
fn a_manifest_naming_an_object_by_anything_but_a_hash_is_refused() {
    let mut here = Store::open(tempfile::tempdir().unwrap().keep());
    let staging = tempfile::tempdir().unwrap();
    let escape = "../../../outside";
    let manifest = format!(
        r#"{{"hashes":"blake3","session":"x","name":"y","created_at":1,"bytes":1,
            "entries":[{{"path":"workspace/a","hash":"{escape}","size":1}}]}}"#
    );
    let importing = (OWNER, "s9", "~hibernated");
    let refused = here.import(importing, manifest.as_bytes(), staging.path(), ROOMY);
    assert!(
        matches!(refused, Err(StoreError::Damaged { .. })),
        "{refused:?}"
    );
    assert!(here.manifest(OWNER, "s9", "~hibernated").is_err());
}

#[test]
fn only_a_hash_names_an_object() {
    assert!(is_hash(&"ab".repeat(32)));
    assert!(!is_hash(&"AB".repeat(32)));
    assert!(!is_hash("../../etc/passwd"));
    assert!(!is_hash(&format!("{}/", "a".repeat(63))));
    assert!(!is_hash(""));
}
