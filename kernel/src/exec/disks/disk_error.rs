//! Why the disks' thread could not do a job.

use std::io;

use super::store::StoreError;

/// Why a disk could not be given or published.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The disk could not be made or mounted.
    #[error("its disk cannot be mounted: {0}")]
    Mount(io::Error),
    /// Its record could not be written beside it.
    #[error("it cannot be recorded: {0}")]
    Record(io::Error),
    /// Its parts could not be mounted in the child.
    #[error("its disk cannot be given to its sandbox: {0}")]
    Attach(io::Error),
    /// A built template's disk could not be let go, shrunk or moved.
    #[error("the built template cannot be kept: {0}")]
    Publish(io::Error),
    /// A snapshot could not be restored onto it.
    #[error("{0}")]
    Restore(StoreError),
}
