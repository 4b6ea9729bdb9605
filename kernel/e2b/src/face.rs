//! What every request of the face shares: the kernel, the keys, the
//! envd token secret, what a sandbox is given, and the idempotency keys
//! seen.

use std::sync::{Mutex, MutexGuard, PoisonError};

use agentos_http::kernel_link::KernelLink;
use agentos_http::Site;
use agentos_proto::payload::Limits;

use crate::context_locks::ContextLocks;
use crate::cpu_samples::CpuSamples;
use crate::idempotency::Idempotency;
use crate::keys::Keys;
use crate::making::Making;
use crate::tokens::EnvdTokens;
use crate::watchers::Watchers;
use agentos_http::fleet::FleetFace;

/// What each sandbox is given, and how many one key holds.
#[derive(Debug, Clone, Copy)]
pub struct Sizing {
    /// Memory limit, bytes.
    pub memory_bytes: u64,
    /// CPUs' worth of time.
    pub cpus: u32,
    /// Processes and threads.
    pub max_pids: u64,
    /// How long a sandbox paused with its memory stays frozen before it
    /// is hibernated (its files kept, its memory freed).
    pub paused_keep_ms: u64,
    /// Live sandboxes one key may hold.
    pub max_sandboxes_per_key: usize,
    /// The most one upload to `/files` may write.
    pub max_upload_bytes: u64,
}

/// The kernel's CPU accounting period, µs: a run's CPU limit is a quota
/// per that period.
const CPU_PERIOD_US: u64 = 100_000;

impl Sizing {
    /// The kernel limits of a sandbox.
    pub fn limits(&self) -> Limits {
        Limits {
            memory: Some(self.memory_bytes),
            cpu_quota: Some(u64::from(self.cpus) * CPU_PERIOD_US),
            cpu_period: None,
            max_pids: Some(self.max_pids),
        }
    }

    /// The figures E2B's records report.
    pub fn sizes(&self) -> Sizes {
        Sizes {
            cpu_count: self.cpus,
            memory_mb: self.memory_bytes >> 20,
        }
    }
}

/// What a sandbox is given, as E2B's records report it.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub cpu_count: u32,
    pub memory_mb: u64,
}

/// The face's shared state.
#[derive(Debug)]
pub struct Face {
    pub kernel: KernelLink,
    pub keys: Keys,
    pub tokens: EnvdTokens,
    pub site: Site,
    pub sizing: Sizing,
    /// The face's part in its node's fleet, if it forwards.
    pub fleet: Option<FleetFace>,
    idempotency: Mutex<Idempotency>,
    watchers: Mutex<Watchers>,
    context_locks: Mutex<ContextLocks>,
    cpu_samples: Mutex<CpuSamples>,
    making: Mutex<Making>,
}

impl Face {
    pub fn new(
        kernel: KernelLink,
        keys: Keys,
        tokens: EnvdTokens,
        site: Site,
        sizing: Sizing,
        fleet: Option<FleetFace>,
    ) -> Face {
        Face {
            kernel,
            keys,
            tokens,
            site,
            sizing,
            fleet,
            idempotency: Mutex::new(Idempotency::default()),
            watchers: Mutex::new(Watchers::default()),
            context_locks: Mutex::new(ContextLocks::default()),
            cpu_samples: Mutex::new(CpuSamples::default()),
            making: Mutex::new(Making::default()),
        }
    }

    /// The idempotency keys seen; held only between awaits.
    pub fn idempotency(&self) -> MutexGuard<'_, Idempotency> {
        // The maps are left whole by every step, so a panic elsewhere
        // while one was held leaves nothing half-done.
        self.idempotency
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The watchers made with `CreateWatcher`; held only between awaits.
    pub fn watchers(&self) -> MutexGuard<'_, Watchers> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The sandboxes being made for each key; held only between awaits.
    pub fn making(&self) -> MutexGuard<'_, Making> {
        self.making.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Each sandbox's last CPU reading; held only between awaits.
    pub fn cpu_samples(&self) -> MutexGuard<'_, CpuSamples> {
        self.cpu_samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The code contexts' turns; held only between awaits.
    pub fn context_locks(&self) -> MutexGuard<'_, ContextLocks> {
        self.context_locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
