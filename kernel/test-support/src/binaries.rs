//! Where the binaries under test are: the profile's directory that cargo
//! builds them into, above the running test's own executable.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The daemon under test, `target/<profile>/agentosd`, which cargo builds
/// before it runs the kernel crate's integration tests.
pub fn agentosd() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| built("agentosd"))
}

/// The command-line client, `target/<profile>/agentos`. It is the binary
/// of another package (`agentos-cli`), which cargo builds for none of the
/// kernel's tests: `cargo build --workspace` (as `scripts/test` runs
/// first) puts it there.
pub fn agentos() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| built("agentos"))
}

/// A binary of the workspace, from the directory cargo builds binaries
/// into: the parent of this test executable's `deps/`.
fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join(name))
        .unwrap_or_else(|| panic!("no target directory above {}", exe.display()));
    assert!(
        path.is_file(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        path.display()
    );
    path
}
