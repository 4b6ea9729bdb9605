//! What the Clove SDK's calls reach beyond the core subsystems: lowered
//! operator connections (SET_PERMS), the host's processor figures
//! (SYSTEM_METRICS), HTTP requests in flight, asynchronous EXECs waiting
//! to be polled, and recordings of calls. Each part owns its state.

use std::sync::Arc;

use mio::Waker;

use super::lowered::LoweredConnections;
use crate::async_calls::AsyncCalls;
use crate::http_call::{HttpCalls, Upstream};
use crate::recording::Recordings;
use crate::telemetry::host::CpuSampler;

/// The parts, each reached by its field.
#[derive(Debug)]
pub struct Services {
    /// Operators' connections that lowered themselves.
    pub lowered: LoweredConnections,
    /// The host's processors at SYSTEM_METRICS' last reading.
    pub cpu_sampler: CpuSampler,
    /// HTTP requests made for callers, in flight.
    pub http_calls: HttpCalls,
    /// Asynchronous EXECs not yet polled.
    pub async_calls: AsyncCalls,
    /// Principals' recordings of calls.
    pub recordings: Recordings,
}

/// The parts, new; finished HTTP requests wake `waker`.
pub fn start(upstream: Upstream, waker: Arc<Waker>) -> Services {
    Services {
        lowered: LoweredConnections::default(),
        cpu_sampler: CpuSampler::default(),
        http_calls: HttpCalls::new(upstream, waker),
        async_calls: AsyncCalls::default(),
        recordings: Recordings::default(),
    }
}
