//! The freezer: stops every process of a cgroup, and of the cgroups inside
//! it, where it stands — no CPU, no signal handled — until it is thawed.
//! cgroup v1 has it as a controller of its own (`freezer.state`: `FROZEN`,
//! `FREEZING`, `THAWED`); v2 in every cgroup (`cgroup.freeze`, with
//! `frozen 1` in `cgroup.events` once every process has stopped).
//!
//! A [`Freezer`] is only paths, so a worker can wait on it while the
//! reactor goes on.

use std::fs;
use std::io;
use std::path::PathBuf;

use agentos_proto::payload::CgroupVersion;

/// One cgroup's freezer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Freezer {
    version: CgroupVersion,
    /// The cgroup's directory in the hierarchy that has the freezer.
    dir: PathBuf,
}

impl Freezer {
    /// The freezer of the cgroup at `dir`.
    pub fn new(version: CgroupVersion, dir: PathBuf) -> Freezer {
        Freezer { version, dir }
    }

    /// Asks for the cgroup to be frozen (`true`) or thawed; freezing takes
    /// effect over a moment, which [`Freezer::is_frozen`] tells.
    pub fn set(&self, frozen: bool) -> io::Result<()> {
        match self.version {
            CgroupVersion::V1 => fs::write(
                self.dir.join("freezer.state"),
                if frozen { "FROZEN" } else { "THAWED" },
            ),
            CgroupVersion::V2 => fs::write(
                self.dir.join("cgroup.freeze"),
                if frozen { "1" } else { "0" },
            ),
        }
    }

    /// Whether every process in the cgroup has stopped. (Reading v1's
    /// state is also what moves a `FREEZING` cgroup on.)
    pub fn is_frozen(&self) -> bool {
        match self.version {
            CgroupVersion::V1 => fs::read_to_string(self.dir.join("freezer.state"))
                .is_ok_and(|state| state.trim() == "FROZEN"),
            CgroupVersion::V2 => fs::read_to_string(self.dir.join("cgroup.events"))
                .is_ok_and(|events| events.lines().any(|line| line.trim() == "frozen 1")),
        }
    }

    /// Whether the cgroup was asked to be frozen (frozen or on its way):
    /// a cgroup in this state holds signals until it is thawed.
    pub fn is_freezing(&self) -> bool {
        match self.version {
            CgroupVersion::V1 => fs::read_to_string(self.dir.join("freezer.state"))
                .is_ok_and(|state| state.trim() != "THAWED"),
            CgroupVersion::V2 => fs::read_to_string(self.dir.join("cgroup.freeze"))
                .is_ok_and(|asked| asked.trim() == "1"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_writes_and_reads_freezer_state() {
        let dir = tempfile::tempdir().unwrap();
        let freezer = Freezer::new(CgroupVersion::V1, dir.path().to_path_buf());
        freezer.set(true).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("freezer.state")).unwrap(),
            "FROZEN"
        );
        assert!(freezer.is_frozen() && freezer.is_freezing());
        fs::write(dir.path().join("freezer.state"), "FREEZING\n").unwrap();
        assert!(!freezer.is_frozen() && freezer.is_freezing());
        freezer.set(false).unwrap();
        assert!(!freezer.is_frozen() && !freezer.is_freezing());
    }

    #[test]
    fn v2_asks_by_cgroup_freeze_and_knows_by_its_events() {
        let dir = tempfile::tempdir().unwrap();
        let freezer = Freezer::new(CgroupVersion::V2, dir.path().to_path_buf());
        freezer.set(true).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("cgroup.freeze")).unwrap(),
            "1"
        );
        fs::write(dir.path().join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert!(freezer.is_freezing() && !freezer.is_frozen());
        fs::write(dir.path().join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
        assert!(freezer.is_frozen());
    }
}
