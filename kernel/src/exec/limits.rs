//! A run's limits: what it asks for, else EXEC's defaults — never more
//! than its caller's own. An agent's own are its limits in force; an
//! operator has none beyond the ranges every limit is checked against.
//!
//! The CPU limit is a share: `cpu_quota` microseconds in every 100 ms
//! period (EXEC takes no period of its own). An agent with a quota lends a
//! run at most its own share (50 ms in 200 ms allows 25 ms in 100 ms), and
//! gives it that share as it is when the run asks for none.

use agentos_proto::payload::Limits;
use agentos_proto::ErrorReply;

use crate::cgroup::CgroupLimits;
use crate::config::exec::ExecConfig;
use crate::permissions::beyond_caller;

/// The CPU period of every run, in microseconds.
pub const RUN_CPU_PERIOD: u64 = 100_000;

/// What a run gets when it asks for nothing (and its caller allows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunDefaults {
    /// Memory, in bytes.
    pub memory: u64,
    /// Processes and threads.
    pub max_pids: u64,
}

impl RunDefaults {
    /// The defaults `exec.default_memory` and `exec.default_max_pids`.
    pub fn of(exec: &ExecConfig) -> RunDefaults {
        RunDefaults {
            memory: exec.default_memory,
            max_pids: exec.default_max_pids,
        }
    }

    /// The cgroup limits of a run that asks for nothing and whose caller
    /// has no limits below them: the limits every run cgroup is made with.
    pub fn cgroup_limits(&self) -> CgroupLimits {
        CgroupLimits {
            memory: self.memory,
            cpu_quota: None,
            cpu_period: RUN_CPU_PERIOD,
            max_pids: self.max_pids,
        }
    }
}

/// A run's cgroup limits, for a caller whose own limits are `own`.
/// `asked` has passed its range checks already.
pub fn run_limits(
    own: &Limits,
    asked: Option<&Limits>,
    defaults: RunDefaults,
) -> Result<CgroupLimits, ErrorReply> {
    let asked = asked.copied().unwrap_or_default();
    let memory = at_most("limits.memory", asked.memory, own.memory, defaults.memory)?;
    let max_pids = at_most(
        "limits.max_pids",
        asked.max_pids,
        own.max_pids,
        defaults.max_pids,
    )?;
    let (cpu_quota, cpu_period) = match (own.cpu_quota, own.cpu_period, asked.cpu_quota) {
        // Asking nothing, a run gets the caller's own share as it is.
        (Some(own_quota), Some(own_period), None) => (Some(own_quota), own_period),
        (Some(own_quota), Some(own_period), Some(quota)) => {
            let share_of = |quota: u64, period: u64| u128::from(quota) * u128::from(period);
            if share_of(quota, own_period) > share_of(own_quota, RUN_CPU_PERIOD) {
                return Err(beyond_caller(
                    "limits.cpu_quota",
                    &format!(
                        "asks for {quota} us every {RUN_CPU_PERIOD} us, more CPU than the \
                         caller's own {own_quota} us every {own_period} us"
                    ),
                ));
            }
            (Some(quota), RUN_CPU_PERIOD)
        }
        (_, _, asked) => (asked, RUN_CPU_PERIOD),
    };
    Ok(CgroupLimits {
        memory,
        cpu_quota,
        cpu_period,
        max_pids,
    })
}

/// What was asked, if within `own`; else the default, lowered to `own`.
fn at_most(
    field: &str,
    asked: Option<u64>,
    own: Option<u64>,
    default: u64,
) -> Result<u64, ErrorReply> {
    match (asked, own) {
        (Some(asked), Some(own)) if asked > own => Err(beyond_caller(
            field,
            &format!("asks for {asked}, more than the caller's own {own}"),
        )),
        (Some(asked), _) => Ok(asked),
        (None, own) => Ok(own.map_or(default, |own| own.min(default))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_proto::ErrorCode;

    const DEFAULTS: RunDefaults = RunDefaults {
        memory: 256 << 20,
        max_pids: 64,
    };

    fn agent() -> Limits {
        Limits {
            memory: Some(128 << 20),
            cpu_quota: Some(50_000),
            cpu_period: Some(200_000),
            max_pids: Some(100),
        }
    }

    #[test]
    fn an_operator_run_asking_nothing_gets_the_defaults_every_run_cgroup_has() {
        let limits = run_limits(&Limits::default(), None, DEFAULTS).unwrap();
        assert_eq!(limits, DEFAULTS.cgroup_limits());
        assert_eq!(
            limits.max_pids, 64,
            "the run is PID 1 of its namespace: no process waits beside it"
        );
        assert_eq!(limits.cpu_quota, None);
    }

    #[test]
    fn an_operator_may_ask_above_the_defaults() {
        let asked = Limits {
            memory: Some(1 << 30),
            cpu_quota: Some(20_000),
            max_pids: Some(500),
            ..Limits::default()
        };
        let limits = run_limits(&Limits::default(), Some(&asked), DEFAULTS).unwrap();
        assert_eq!(limits.memory, 1 << 30);
        assert_eq!(limits.cpu_quota, Some(20_000));
        assert_eq!(limits.max_pids, 500);
    }

    #[test]
    fn an_agents_run_defaults_to_the_lower_of_its_own_and_execs() {
        let limits = run_limits(&agent(), None, DEFAULTS).unwrap();
        assert_eq!(limits.memory, 128 << 20, "its own is below EXEC's default");
        assert_eq!(limits.max_pids, 64, "EXEC's default is below its own");
        assert_eq!(
            (limits.cpu_quota, limits.cpu_period),
            (Some(50_000), 200_000)
        );
    }

    #[test]
    fn an_agents_run_never_gets_more_than_the_agent() {
        for (asked, field) in [
            (
                Limits {
                    memory: Some(129 << 20),
                    ..Limits::default()
                },
                "`limits.memory`",
            ),
            (
                Limits {
                    max_pids: Some(101),
                    ..Limits::default()
                },
                "`limits.max_pids`",
            ),
            (
                Limits {
                    cpu_quota: Some(25_001),
                    ..Limits::default()
                },
                "`limits.cpu_quota`",
            ),
        ] {
            let err = run_limits(&agent(), Some(&asked), DEFAULTS).unwrap_err();
            assert_eq!(err.code, ErrorCode::PermissionDenied);
            assert!(err.error.contains(field), "{}", err.error);
        }
        let within = Limits {
            memory: Some(128 << 20),
            cpu_quota: Some(25_000),
            max_pids: Some(100),
            ..Limits::default()
        };
        let limits = run_limits(&agent(), Some(&within), DEFAULTS).unwrap();
        assert_eq!(limits.memory, 128 << 20);
        assert_eq!(
            (limits.cpu_quota, limits.cpu_period),
            (Some(25_000), 100_000)
        );
        assert_eq!(limits.max_pids, 100);
    }
}
