//! Making a volume's disk, and keeping a built template's: two jobs of
//! the disks' thread ([`super::worker`]) that end in a record written.

use std::time::Duration;

use super::disk_error::DiskError;
use super::image::{DiskDir, RunUser};
use super::record::{TemplateRecord, VolumeRecord};
use super::volumes::VOLUME_PARTS;

/// How long a finished build's disk may take to be let go by its run.
const RELEASE_PATIENCE: Duration = Duration::from_secs(10);

/// Makes a volume's disk and mounts it, then records it: a volume is
/// served only once recorded.
pub fn make_volume(dir: &DiskDir, record: &VolumeRecord, user: RunUser) -> Result<(), DiskError> {
    dir.mount(record.bytes, user, &VOLUME_PARTS)
        .map_err(DiskError::Mount)?;
    record.write(&dir.0).map_err(DiskError::Record)
}

/// A built template's disk, let go by its run, shrunk to its files, moved
/// to its name and recorded — in that order, so a template is served only
/// whole.
pub fn publish(
    build: &DiskDir,
    to: &DiskDir,
    mut record: TemplateRecord,
) -> Result<TemplateRecord, DiskError> {
    build
        .release(RELEASE_PATIENCE)
        .map_err(DiskError::Publish)?;
    build.shrink().map_err(DiskError::Publish)?;
    record.bytes = build.image_bytes();
    // Found now, as the image never changes again: a session from the
    // template carries it through the fleet.
    record.image_hash = build.image_hash().ok();
    std::fs::rename(&build.0, &to.0).map_err(DiskError::Publish)?;
    record.write(&to.0).map_err(DiskError::Record)?;
    // Ready for agents started from it, which are given it at once.
    if let Err(err) = to.mount_read_only() {
        log::warn!("template {}: {err}", to.0.display());
    }
    Ok(record)
}
