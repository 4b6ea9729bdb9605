//! The rule for a SPAWN made by an agent: **a child never gets more than
//! its parent.**
//!
//! - network: the host's only from the host's; a policy within the
//!   parent's (its denials added); loopback from anything;
//! - limits (memory, CPU share, processes): each defaults to the parent's
//!   own and may not exceed it;
//! - permissions: each defaults to the parent's and may not exceed it;
//! - LLM tokens: a tree of agents shares one budget. A child may set a
//!   budget of its own no larger than what its parent has left; either
//!   way every token it uses is also charged to each budget above it.
//!
//! Asking for more is `permission_denied` naming the field. (Sandboxing
//! and paths are the SPAWN's business elsewhere: an agent's children are
//! always sandboxed, and their paths are looked up in its own view.)

use agentos_egress::policy::Policy;
use agentos_egress::Egress;
use agentos_proto::payload::{Limits, Permissions, SpawnRequest};
use agentos_proto::{ErrorCode, ErrorReply};

use crate::permissions::covered_by;

/// What an agent was given, which bounds what it may give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// What it may reach.
    pub network: Egress,
    /// Its limits in force (defaults applied).
    pub limits: Limits,
    /// Its permissions.
    pub permissions: Permissions,
}

/// A child's limits and permissions under `parent`. `tokens_left` is what
/// the parent's token budgets still allow (`None`: it has none);
/// `default_policy` is the kernel's, for a request without `network`.
pub fn child_grant(
    parent: &Grant,
    request: &SpawnRequest,
    tokens_left: Option<u64>,
    default_policy: Option<&Policy>,
) -> Result<Grant, ErrorReply> {
    Ok(Grant {
        network: child_network(&parent.network, request, default_policy)?,
        limits: child_limits(&parent.limits, &request.limits)?,
        permissions: child_permissions(&parent.permissions, request, tokens_left)?,
    })
}

/// What a child may reach: what it asks for, within what its parent (or
/// the operator, holding the host's network) has.
pub fn child_network(
    parent: &Egress,
    request: &SpawnRequest,
    default_policy: Option<&Policy>,
) -> Result<Egress, ErrorReply> {
    match &request.network {
        Some(asked) => Egress::from_request("SPAWN", asked)?.within(parent, "its parent"),
        None => Ok(Egress::default_within(default_policy, parent)),
    }
}

fn child_limits(parent: &Limits, asked: &Limits) -> Result<Limits, ErrorReply> {
    let at_most = |field: &str, asked: Option<u64>, own: Option<u64>| match (asked, own) {
        (Some(asked), Some(own)) if asked > own => Err(denied(
            field,
            &format!("asks for {asked}, more than its parent's own {own}"),
        )),
        (asked, own) => Ok(asked.or(own)),
    };
    let memory = at_most("limits.memory", asked.memory, parent.memory)?;
    let max_pids = at_most("limits.max_pids", asked.max_pids, parent.max_pids)?;
    let period = asked.cpu_period.or(parent.cpu_period);
    let quota = match (parent.cpu_quota, parent.cpu_period) {
        // The parent's share of a CPU, quota / period, bounds the child's,
        // whatever period the child runs on.
        (Some(own_quota), Some(own_period)) => {
            let period = period.unwrap_or(own_period);
            let share_of = |quota: u64| u128::from(quota) * u128::from(own_period);
            let own_share = u128::from(own_quota) * u128::from(period);
            match asked.cpu_quota {
                Some(quota) if share_of(quota) > own_share => {
                    return Err(denied(
                        "limits.cpu_quota",
                        &format!(
                            "asks for {quota} us every {period} us, more CPU than its \
                             parent's own {own_quota} us every {own_period} us"
                        ),
                    ))
                }
                Some(quota) => Some(quota),
                None => {
                    let quota = u64::try_from(own_share / u128::from(own_period)).ok();
                    let (least, _) = Limits::CPU_QUOTA_RANGE;
                    if quota.is_none_or(|q| q < least) {
                        return Err(denied(
                            "limits.cpu_period",
                            &format!(
                                "at a period of {period} us its parent's CPU share is below \
                                 the smallest quota ({least} us); give a longer period"
                            ),
                        ));
                    }
                    quota
                }
            }
        }
        _ => asked.cpu_quota,
    };
    Ok(Limits {
        memory,
        cpu_quota: quota,
        cpu_period: period,
        max_pids,
    })
}

fn child_permissions(
    parent: &Permissions,
    request: &SpawnRequest,
    tokens_left: Option<u64>,
) -> Result<Permissions, ErrorReply> {
    let asked = &request.permissions;
    if let Some(field) = asked.beyond(parent) {
        return Err(denied(
            &format!("permissions.{field}"),
            "its parent does not have it",
        ));
    }
    if let Some(wider) = asked
        .tools
        .iter()
        .flatten()
        .find(|pattern| !covered_by(&parent.tools, pattern))
    {
        return Err(denied(
            "permissions.tools",
            &format!(
                "{wider:?} allows tools its parent's {:?} do not",
                parent.tools
            ),
        ));
    }
    let llm_tokens = match (asked.llm_tokens.unwrap_or(0), tokens_left) {
        // Its own budget, carved out of what the tree has left.
        (tokens, Some(left)) if tokens > left => {
            return Err(denied(
                "permissions.llm_tokens",
                &format!("asks for {tokens} tokens; its parent's budget has {left} left"),
            ))
        }
        (tokens, _) => tokens,
    };
    Ok(Permissions {
        llm_tokens,
        ..asked.or(parent.clone())
    })
}

fn denied(field: &str, why: &str) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::PermissionDenied,
        format!("SPAWN field `{field}`: {why} (a child never gets more than its parent)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent() -> Grant {
        Grant {
            network: Egress::Loopback,
            limits: Limits {
                memory: Some(64 << 20),
                cpu_quota: Some(20_000),
                cpu_period: Some(100_000),
                max_pids: Some(16),
            },
            permissions: Permissions {
                think: false,
                exec: true,
                spawn: true,
                task: true,
                read: true,
                write: false,
                http: true,
                ipc: false,
                llm_tokens: 1000,
                tools: vec!["everything.*".into(), "time.get_current_time".into()],
            },
        }
    }

    fn child(json: &str, tokens_left: Option<u64>) -> Result<Grant, ErrorReply> {
        let request = SpawnRequest::parse(json.as_bytes()).unwrap();
        child_grant(&parent(), &request, tokens_left, None)
    }

    fn refused_field(json: &str) -> String {
        let err = child(json, Some(600)).unwrap_err();
        assert_eq!(err.code, ErrorCode::PermissionDenied, "{json}");
        err.error
    }

    #[test]
    fn a_child_asking_for_nothing_gets_its_parents_share() {
        let grant = child(r#"{"name":"c","command":["x"]}"#, Some(600)).unwrap();
        assert_eq!(grant.limits, parent().limits);
        assert_eq!(
            grant.permissions,
            Permissions {
                llm_tokens: 0,
                ..parent().permissions
            }
        );
        assert_eq!(grant.network, Egress::Loopback);
    }

    #[test]
    fn asking_for_more_names_the_field() {
        for (json, field) in [
            (
                r#"{"name":"c","command":["x"],"network":true}"#,
                "`network`",
            ),
            (
                r#"{"name":"c","command":["x"],"network":{"allow":["pypi.org"]}}"#,
                "`network`",
            ),
            (
                r#"{"name":"c","command":["x"],"limits":{"memory":1099511627776}}"#,
                "`limits.memory`",
            ),
            (
                r#"{"name":"c","command":["x"],"limits":{"max_pids":1000000}}"#,
                "`limits.max_pids`",
            ),
            (
                r#"{"name":"c","command":["x"],"limits":{"cpu_quota":200000,"cpu_period":100000}}"#,
                "`limits.cpu_quota`",
            ),
            (
                r#"{"name":"c","command":["x"],"limits":{"cpu_quota":30000}}"#,
                "`limits.cpu_quota`",
            ),
            (
                r#"{"name":"c","command":["x"],"permissions":{"think":true}}"#,
                "`permissions.think`",
            ),
            (
                r#"{"name":"c","command":["x"],"permissions":{"llm_tokens":601}}"#,
                "`permissions.llm_tokens`",
            ),
            (
                r#"{"name":"c","command":["x"],"permissions":{"tools":["*"]}}"#,
                "`permissions.tools`",
            ),
            (
                r#"{"name":"c","command":["x"],"permissions":{"tools":["time.*"]}}"#,
                "`permissions.tools`",
            ),
            (
                r#"{"name":"c","command":["x"],"permissions":{"tools":["everything*"]}}"#,
                "`permissions.tools`",
            ),
        ] {
            let error = refused_field(json);
            assert!(error.contains(field), "{json}: {error}");
        }
    }

    #[test]
    fn the_cpu_share_is_compared_whatever_the_period() {
        let half_period = child(
            r#"{"name":"c","command":["x"],"limits":{"cpu_period":50000}}"#,
            None,
        )
        .unwrap();
        assert_eq!(half_period.limits.cpu_quota, Some(10_000));
        assert_eq!(half_period.limits.cpu_period, Some(50_000));
        let same_share = child(
            r#"{"name":"c","command":["x"],"limits":{"cpu_quota":40000,"cpu_period":200000}}"#,
            None,
        );
        assert!(same_share.is_ok());
        let too_short = child(
            r#"{"name":"c","command":["x"],"limits":{"cpu_period":1000}}"#,
            None,
        )
        .unwrap_err();
        assert!(
            too_short.error.contains("limits.cpu_period"),
            "{}",
            too_short.error
        );
    }

    #[test]
    fn less_is_always_fine() {
        let grant = child(
            r#"{"name":"c","command":["x"],"limits":{"memory":1048576,"max_pids":2},
                "permissions":{"exec":false,"spawn":false,"llm_tokens":600,
                               "tools":["everything.echo","everything.get-*","time.get_current_time"]}}"#,
            Some(600),
        )
        .unwrap();
        assert_eq!(grant.limits.memory, Some(1 << 20));
        assert_eq!(grant.limits.max_pids, Some(2));
        assert!(!grant.permissions.exec && !grant.permissions.spawn);
        assert_eq!(grant.permissions.llm_tokens, 600);
        assert_eq!(grant.permissions.tools.len(), 3);
    }

    #[test]
    fn an_unlimited_parent_gives_what_is_asked() {
        let mut unlimited = parent();
        unlimited.limits.cpu_quota = None;
        unlimited.permissions.llm_tokens = 0;
        let request = SpawnRequest::parse(
            br#"{"name":"c","command":["x"],"permissions":{"llm_tokens":5000},
                 "limits":{"cpu_quota":300000,"cpu_period":100000}}"#,
        )
        .unwrap();
        let grant = child_grant(&unlimited, &request, None, None).unwrap();
        assert_eq!(grant.permissions.llm_tokens, 5000);
        assert_eq!(grant.limits.cpu_quota, Some(300_000));
    }
}
