//! A run's network as it is when the run starts, not only as it was when
//! the run was asked for. A run's policy is granted when it is admitted,
//! and it may then wait (behind its owner's other runs, or in its
//! session's queue) while NET `set` narrows its owner's: when it starts,
//! its policy must still lie within its owner's as it is then, or it does
//! not start. A session's endpoint only ever narrows, whatever a later run
//! of it was granted; and a run's connections count in its agent's record.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use agentos_egress::gateway::net_totals;
use agentos_egress::policy::{NotWithin, Policy};
use agentos_egress::record::{lock, Record};
use agentos_egress::{endpoint, Gateway};
use agentos_proto::{ErrorCode, ErrorReply};

use super::child::{RunChild, RunEndpoint};
use super::waiting::Waiting;
use crate::identity::Principal;

/// Why a queued run did not start: its owner's policy was narrowed while
/// it waited, and no longer covers what the run was given.
#[derive(Debug, thiserror::Error)]
#[error(
    "EXEC field `network`: the policy the run was given when it was queued is no longer within \
     its owner's, narrowed while it waited ({} {}); the run did not start",
    .0.field(),
    .0.reason("its owner")
)]
pub struct Narrowed(NotWithin);

impl From<Narrowed> for ErrorReply {
    fn from(narrowed: Narrowed) -> ErrorReply {
        ErrorReply::new(ErrorCode::PermissionDenied, narrowed.to_string())
    }
}

/// `policy`, granted to a run when it was admitted, as the run may have it
/// now that its owner's is `owner_now`: every entry it allows must still be
/// covered by one of the owner's (the owner's denials are added), or it is
/// refused, naming the entry.
pub fn still_within(policy: Policy, owner_now: &Policy) -> Result<Policy, Narrowed> {
    policy.within(owner_now).map_err(Narrowed)
}

/// The policy of a session's endpoint once a later run of it starts with
/// `granted`: what `granted` allows of what the endpoint has in force,
/// never more. An endpoint NET `set` narrowed stays narrowed, even for a
/// run granted a wider policy before the narrowing.
pub fn session_policy(in_force: &Policy, granted: Policy) -> Policy {
    granted.narrowed_to(in_force)
}

/// The egress side of runs: the proxy that serves their endpoints, and
/// owners' policies as NET `set` last replaced them, while their work
/// lasts (queued runs are held to them when they start).
#[derive(Debug)]
pub struct RunNetwork {
    gateway: Arc<Gateway>,
    owners_now: HashMap<Principal, Policy>,
}

impl Default for RunNetwork {
    fn default() -> Self {
        RunNetwork {
            gateway: Arc::new(Gateway::without_proxy()),
            owners_now: HashMap::new(),
        }
    }
}

impl RunNetwork {
    /// Runs with a network policy are served by `gateway`'s proxy
    /// (without one, such runs are refused).
    pub fn serve_with(&mut self, gateway: Arc<Gateway>) {
        self.gateway = gateway;
    }

    /// The environment that points a program at its sandbox's endpoint.
    pub fn environment(&self) -> Vec<(String, String)> {
        self.gateway.environment()
    }

    /// NET `set` replaced the policies of `owners` (an agent's, and those
    /// of the runs under it, narrowed with it): the `endpoints` serving
    /// their runs and sessions are narrowed to lie within them (the proxy
    /// closes what they now refuse), and their queued runs are held to
    /// them when they start.
    pub fn replaced<'a>(
        &mut self,
        owners: Vec<(Principal, Policy)>,
        endpoints: impl Iterator<Item = &'a mut RunEndpoint>,
    ) {
        for open in endpoints {
            if let Some((_, now)) = owners.iter().find(|(owner, _)| *owner == open.owner) {
                let narrowed = open.policy.clone().narrowed_to(now);
                open.set_policy(narrowed);
            }
        }
        self.owners_now.extend(owners);
    }

    /// `owner`'s work has ended: its policy is forgotten, as nothing of it
    /// waits to start.
    pub fn forget(&mut self, owner: Principal) {
        self.owners_now.remove(&owner);
    }

    /// A queued request whose turn has come, with its policy as it may
    /// have it now: within its owner's, if NET `set` has replaced that
    /// since the request was admitted (a request admitted later was held to
    /// the owner's policy as it was then, which is still the one here).
    pub fn at_start(&self, waiting: &mut Waiting) -> Result<(), Narrowed> {
        let Some(owner_now) = self.owners_now.get(&waiting.owner) else {
            return Ok(());
        };
        if let Some(policy) = waiting.policy.take() {
            waiting.policy = Some(still_within(policy, owner_now)?);
        }
        Ok(())
    }

    /// Serves `run`'s network namespace on the egress proxy under `policy`,
    /// unless it is served already (a session's earlier run); the environment
    /// that points the run at its endpoint.
    pub fn open_endpoint(
        &self,
        run: &mut RunChild,
        (owner, number, owner_record): EndpointOf<'_>,
        policy: Policy,
    ) -> io::Result<Vec<(String, String)>> {
        match &mut run.endpoint {
            // A session's later run: the endpoint keeps no more than it has.
            Some(open) => {
                let narrowed = session_policy(&open.policy, policy);
                open.set_policy(narrowed);
            }
            None => {
                let pidfd = run.pidfd.as_ref().ok_or(io::ErrorKind::NotFound)?;
                let listener = endpoint::listen_inside(pidfd.as_fd())?;
                let label =
                    number.map_or_else(|| "exec session".to_owned(), |n| format!("run {n}"));
                let endpoint = self.gateway.open(label, listener, policy.clone())?;
                // Linked before the run's order is sent: nothing in the sandbox
                // runs before that, so no attempt escapes the agent's record.
                if let Some(record) = owner_record {
                    lock(endpoint.record()).count_in(Arc::clone(record));
                }
                run.endpoint = Some(RunEndpoint {
                    endpoint,
                    owner,
                    policy,
                });
            }
        }
        if let Some(open) = &run.endpoint {
            run.net_before = net_totals(open.endpoint.record());
        }
        Ok(self.gateway.environment())
    }
}

/// Whose work a run is, its number (a run's), and the record of the agent
/// whose work it is (which its endpoint's attempts count in too).
pub type EndpointOf<'a> = (Principal, Option<u64>, Option<&'a Arc<Mutex<Record>>>);

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: &str) -> Policy {
        Policy::from_proto(&serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn a_queued_runs_policy_must_still_lie_within_its_owners_narrowed_one() {
        let granted = policy(r#"{"allow":["127.0.0.1/32:8080"]}"#);
        let cut = still_within(granted.clone(), &policy(r#"{"allow":[]}"#)).unwrap_err();
        let refusal = ErrorReply::from(cut);
        assert_eq!(refusal.code, ErrorCode::PermissionDenied);
        assert!(refusal.error.contains("`network`"), "{}", refusal.error);
        assert!(
            refusal
                .error
                .contains(r#"network.allow[0] "127.0.0.1:8080""#),
            "{}",
            refusal.error
        );
        let elsewhere = policy(r#"{"allow":["127.0.0.1/32:9090"]}"#);
        assert!(still_within(granted.clone(), &elsewhere).is_err());
        // Within what the owner has now, it starts, with the owner's
        // denials added.
        let wider = policy(r#"{"allow":["127.0.0.0/8"],"deny":["127.0.0.2"]}"#);
        let kept = still_within(granted, &wider).unwrap();
        assert_eq!(
            serde_json::to_value(kept.to_proto()).unwrap(),
            serde_json::json!({"allow": ["127.0.0.1:8080"], "deny": ["127.0.0.2"]})
        );
    }

    #[test]
    fn a_sessions_endpoint_only_ever_narrows() {
        let granted = policy(r#"{"allow":["api.example.com:443","files.example.org"]}"#);
        // NET `set` cut the endpoint to nothing: a run granted the old
        // policy before the cut does not put it back.
        let cut = policy(r#"{"allow":[]}"#);
        assert_eq!(
            serde_json::to_value(session_policy(&cut, granted.clone()).to_proto()).unwrap(),
            serde_json::json!({"allow": [], "deny": []})
        );
        // Narrowed to one entry: the run keeps only that one.
        let one = policy(r#"{"allow":["*.example.com"],"deny":["bad.example.com"]}"#);
        assert_eq!(
            serde_json::to_value(session_policy(&one, granted.clone()).to_proto()).unwrap(),
            serde_json::json!({"allow": ["api.example.com:443"], "deny": ["bad.example.com"]})
        );
        // A narrower run narrows it further; the same policy changes nothing.
        let narrower = policy(r#"{"allow":["files.example.org:443"]}"#);
        assert_eq!(session_policy(&granted, narrower.clone()), narrower);
        assert_eq!(session_policy(&granted, granted.clone()), granted);
    }
}
