//! `GET /sandboxes/{id}/metrics` and `GET /sandboxes/metrics`: what a
//! sandbox uses, read from its cgroup when asked. The face keeps no
//! history: a sandbox's metrics are one sample, taken now, and a range
//! that ends before now has none. CPU is the share of the sandbox's CPUs
//! used since its metrics were last read (or since its interpreter
//! started).

use std::collections::BTreeMap;
use std::time::SystemTime;

use agentos_proto::payload::{SessionInfo, SessionUsage};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use super::context::Control;
use crate::answer::ApiError;
use crate::cpu_samples::Reading;
use crate::query::query_pairs;

/// The most sandboxes one `GET /sandboxes/metrics` may name (E2B's bound).
const MAX_SANDBOX_IDS: usize = 100;

/// E2B's `SandboxMetric`.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    timestamp: String,
    timestamp_unix: i64,
    cpu_count: u32,
    cpu_used_pct: f64,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

/// E2B's `SandboxesWithMetrics`.
#[derive(Debug, Serialize)]
pub struct SandboxesWithMetrics {
    sandboxes: BTreeMap<String, SandboxMetric>,
}

/// The range a `GET /sandboxes/{id}/metrics` asks for, in Unix seconds.
#[derive(Debug, Default, PartialEq)]
pub struct Range {
    start: Option<i64>,
    end: Option<i64>,
}

impl Range {
    pub fn parse(query: &str) -> Result<Range, ApiError> {
        let mut range = Range::default();
        for (name, value) in query_pairs(query) {
            let slot = match name.as_str() {
                "start" => &mut range.start,
                "end" => &mut range.end,
                _ => return Err(ApiError::bad_request(format!("unknown parameter {name:?}"))),
            };
            let seconds = value.parse::<i64>().ok().filter(|seconds| *seconds >= 0);
            *slot = Some(seconds.ok_or_else(|| {
                ApiError::bad_request(format!("{name} {value:?}: give Unix seconds"))
            })?);
        }
        Ok(range)
    }

    /// Whether a sample taken at `now` falls in the range. The SDKs send
    /// whole seconds, cut down: the second after `end` counts as in it.
    fn holds(&self, now: i64) -> bool {
        self.start.is_none_or(|start| start <= now)
            && self.end.is_none_or(|end| now <= end.saturating_add(1))
    }
}

/// `GET /sandboxes/{id}/metrics`: a sample taken now, if `range` holds
/// now and the sandbox has an interpreter (a hibernated one has none; a
/// paused one, frozen, still holds its memory).
pub async fn of_sandbox(
    cx: &Control<'_>,
    id: &str,
    range: &Range,
) -> Result<Vec<SandboxMetric>, ApiError> {
    let session = (cx.tenant.sandboxes_with_usage().await?.into_iter())
        .find(|session| session.session == id)
        .ok_or_else(|| ApiError::not_found(id))?;
    let now = DateTime::<Utc>::from(SystemTime::now());
    if !range.holds(now.timestamp()) {
        return Ok(Vec::new());
    }
    Ok(sample(cx, &session, now).into_iter().collect())
}

/// `GET /sandboxes/metrics?sandbox_ids=…`: a sample of each of those
/// named that is the key's and has an interpreter; others are left out.
pub async fn of_sandboxes(cx: &Control<'_>, query: &str) -> Result<SandboxesWithMetrics, ApiError> {
    let mut ids = Vec::new();
    for (name, value) in query_pairs(query) {
        if name != "sandbox_ids" {
            return Err(ApiError::bad_request(format!("unknown parameter {name:?}")));
        }
        ids.extend(
            value
                .split(',')
                .filter(|id| !id.is_empty())
                .map(str::to_owned),
        );
    }
    if ids.is_empty() || ids.len() > MAX_SANDBOX_IDS {
        return Err(ApiError::bad_request(format!(
            "sandbox_ids: name 1 to {MAX_SANDBOX_IDS} sandboxes"
        )));
    }
    let now = DateTime::<Utc>::from(SystemTime::now());
    let sandboxes = cx
        .tenant
        .sandboxes_with_usage()
        .await?
        .into_iter()
        .filter(|session| ids.contains(&session.session))
        .filter_map(|session| Some((session.session.clone(), sample(cx, &session, now)?)))
        .collect();
    Ok(SandboxesWithMetrics { sandboxes })
}

/// A sample of `session` taken `now`, if it has an interpreter.
fn sample(cx: &Control<'_>, session: &SessionInfo, now: DateTime<Utc>) -> Option<SandboxMetric> {
    let usage = session.usage?;
    let limits = session.limits.unwrap_or_else(|| cx.face.sizing.limits());
    let cpu_count = match (limits.cpu_quota, limits.cpu_period) {
        (Some(quota), Some(period)) if period > 0 => quota.div_ceil(period) as u32,
        _ => cx.face.sizing.cpus,
    };
    Some(SandboxMetric {
        timestamp: now.to_rfc3339_opts(SecondsFormat::Millis, true),
        timestamp_unix: now.timestamp(),
        cpu_count,
        cpu_used_pct: cpu_used_pct(cx, &session.session, &usage, cpu_count),
        mem_used: usage.memory_bytes,
        mem_total: limits.memory.unwrap_or(cx.face.sizing.memory_bytes),
        mem_cache: usage.memory_cache_bytes,
        disk_used: session.disk_used_bytes.unwrap_or(session.workspace_bytes),
        disk_total: session.disk_bytes.unwrap_or(0),
    })
}

/// The share of its CPUs sandbox `id` used since its last reading, or
/// since its interpreter started; this reading is kept for the next.
fn cpu_used_pct(cx: &Control<'_>, id: &str, usage: &SessionUsage, cpus: u32) -> f64 {
    let now = Reading {
        uptime_ms: usage.uptime_ms,
        cpu_usec: usage.cpu_usec,
    };
    let before = cx.face.cpu_samples().swap(cx.tenant.delegate, id, now);
    now.used_pct(before, cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_whole_unix_seconds_and_holds_the_second_after_its_end() {
        assert_eq!(Range::parse("").unwrap(), Range::default());
        let range = Range::parse("start=100&end=200").unwrap();
        assert!(range.holds(100) && range.holds(201));
        assert!(!range.holds(99) && !range.holds(202));
        let open_ended = Range::parse(&format!("end={}", i64::MAX)).unwrap();
        assert!(open_ended.holds(0));
        for bad in ["start=-1", "end=soon", "start=", "step=5"] {
            assert!(Range::parse(bad).is_err(), "{bad}");
        }
    }
}
