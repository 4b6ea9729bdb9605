//! The `tools` package EXEC runs import, kept in step with the tools on
//! offer: written again whenever the servers' tools change, and taken up
//! by the exec hosts once the changes settle.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::tools::offer::{offered, Listing};
use crate::tools::package::Package;
use crate::tools::servers::Servers;

/// How long the tools on offer must stay unchanged before exec hosts
/// renew their pools for them: changes come in bursts (a server lists its
/// tools again right after starting), and each renews the pool.
const POOL_RENEWAL_SETTLE: Duration = Duration::from_millis(100);

/// The package, and what it was last written for.
#[derive(Debug)]
pub struct ToolCatalog {
    /// `None` when it could not be made: runs then get no `tools`.
    package: Option<Package>,
    /// The servers' generation it was last written for.
    written_for: Option<u64>,
    /// When exec hosts take up what was last written.
    renewal: Option<Instant>,
}

impl ToolCatalog {
    /// The package in `dir`, not yet written for any tools.
    pub fn create(dir: &Path) -> ToolCatalog {
        let package = Package::create(dir)
            .map_err(|err| log::error!("EXEC runs get no `tools` package: {err}"))
            .ok();
        ToolCatalog {
            package,
            written_for: None,
            renewal: None,
        }
    }

    /// The package's directory, if there is a package.
    pub fn dir(&self) -> Option<PathBuf> {
        self.package.as_ref().map(|p| p.dir().to_path_buf())
    }

    /// Whether the tools on offer changed since it was last written.
    pub fn is_stale(&self, servers: &Servers) -> bool {
        self.written_for != Some(servers.generation())
    }

    /// The servers were replaced: the package is written again for them.
    pub fn forget(&mut self) {
        self.written_for = None;
    }

    /// Writes the catalog for the tools on offer now (runs that find a
    /// tool missing read it again); if it changed, exec hosts take it up
    /// once changes settle.
    pub fn write(&mut self, servers: &Servers, now: Instant) {
        self.written_for = Some(servers.generation());
        let Some(package) = self.package.as_mut() else {
            return;
        };
        match package.update(&offered(servers, Listing::Known)) {
            Ok(true) => self.renewal = Some(now + POOL_RENEWAL_SETTLE),
            Ok(false) => {}
            Err(err) => log::error!("cannot write the `tools` package: {err}"),
        }
    }

    /// How long until exec hosts are due to take the package up.
    pub fn next_deadline(&self, now: Instant) -> Option<Duration> {
        self.renewal.map(|due| due.saturating_duration_since(now))
    }

    /// Whether exec hosts are due to take the package up now (once).
    pub fn renewal_due(&mut self, now: Instant) -> bool {
        let due = self.renewal.is_some_and(|due| due <= now);
        if due {
            self.renewal = None;
        }
        due
    }
}
