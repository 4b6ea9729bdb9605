//! Where EXEC's files lie on the host.

use std::path::PathBuf;

/// Where EXEC's files lie on the host.
#[derive(Clone, Debug)]
pub struct ExecDirs {
    /// The generated `tools` package runs import, if there is one.
    pub tools: Option<PathBuf>,
    /// The kernel's state directory: sessions' disks lie under it.
    pub state: PathBuf,
}
