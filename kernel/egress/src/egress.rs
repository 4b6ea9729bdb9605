//! What a sandbox may reach: its own loopback, the host's network, or what
//! a policy allows through the proxy — read from a request's `network`,
//! and narrowed to what the caller itself was given.

use agentos_proto::payload::Network;
use agentos_proto::{ErrorCode, ErrorReply};

use super::policy::{Policy, PolicyError};

/// A sandbox's egress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Egress {
    /// Its own loopback only.
    Loopback,
    /// The host's network.
    Host,
    /// What the policy allows, through the kernel's proxy.
    Policy(Policy),
}

impl Egress {
    /// Reads `network` of a `what` (SPAWN, EXEC, NET) request; an error
    /// names the entry at fault.
    pub fn from_request(what: &str, network: &Network) -> Result<Egress, ErrorReply> {
        match network {
            Network::Host(false) => Ok(Egress::Loopback),
            Network::Host(true) => Ok(Egress::Host),
            Network::Policy(policy) => Policy::from_proto(policy)
                .map(Egress::Policy)
                .map_err(|why| bad_field(what, &why)),
        }
    }

    /// The egress as a request's `network` gives it.
    pub fn to_wire(&self) -> Network {
        match self {
            Egress::Loopback => Network::Host(false),
            Egress::Host => Network::Host(true),
            Egress::Policy(policy) => Network::Policy(Box::new(policy.to_proto())),
        }
    }

    /// The policy, if the proxy serves this egress.
    pub fn policy(&self) -> Option<&Policy> {
        match self {
            Egress::Policy(policy) => Some(policy),
            _ => None,
        }
    }

    /// This egress as something holding `parent` may give it: the host's
    /// network only from the host's network; a policy from the host's
    /// network, or within a policy (the parent's denials added); loopback
    /// from anything. `permission_denied` names the field otherwise.
    pub fn within(self, parent: &Egress, parent_is: &str) -> Result<Egress, ErrorReply> {
        match (self, parent) {
            (Egress::Loopback, _) => Ok(Egress::Loopback),
            (asked, Egress::Host) => Ok(asked),
            (Egress::Host, Egress::Policy(_)) => Err(denied(
                "network",
                &format!("{parent_is} reaches only what its policy allows, not the host's network"),
            )),
            (Egress::Policy(asked), Egress::Policy(own)) => asked
                .within(own)
                .map(Egress::Policy)
                .map_err(|why| denied(&why.field(), &why.reason(parent_is))),
            (_, Egress::Loopback) => Err(denied(
                "network",
                &format!(
                    "{parent_is} has loopback only (network: false), so that is all it may give"
                ),
            )),
        }
    }

    /// What a request that leaves out `network` gets: the configured
    /// default if the caller may give it, else loopback only.
    pub fn default_within(default: Option<&Policy>, parent: &Egress) -> Egress {
        default
            .and_then(|policy| Egress::Policy(policy.clone()).within(parent, "").ok())
            .unwrap_or(Egress::Loopback)
    }
}

/// A bad request naming the field at fault (under `network.`), then what
/// is wrong there.
fn bad_field(what: &str, why: &PolicyError) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::BadRequest,
        format!("{what} field `network.{}`: {}", why.field, why.problem),
    )
}

fn denied(field: &str, why: &str) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::PermissionDenied,
        format!("field `{field}`: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(json: &str) -> Egress {
        let network: Network = serde_json::from_str(json).unwrap();
        Egress::from_request("SPAWN", &network).unwrap()
    }

    #[test]
    fn a_bad_entry_is_named_in_a_bad_request() {
        let network: Network = serde_json::from_str(r#"{"allow":["ok.example","a b"]}"#).unwrap();
        let err = Egress::from_request("SPAWN", &network).unwrap_err();
        assert_eq!(err.code, ErrorCode::BadRequest);
        assert!(err.error.contains("`network.allow[1]`"), "{}", err.error);
        let network: Network = serde_json::from_str(r#"{"deny":["x:0"]}"#).unwrap();
        let err = Egress::from_request("EXEC", &network).unwrap_err();
        assert_eq!(
            err.error,
            r#"EXEC field `network.deny[0]`: "x:0": port "0" is not 1 to 65535"#
        );
    }

    #[test]
    fn a_child_never_reaches_more_than_its_parent() {
        let parent = egress(r#"{"allow":["*.example.com:443"],"deny":["secret.example.com"]}"#);
        let narrower = egress(r#"{"allow":["api.example.com:443"]}"#);
        let Egress::Policy(child) = narrower.within(&parent, "its parent").unwrap() else {
            panic!("a policy within the parent's was not kept");
        };
        assert_eq!(child.to_proto().deny[0], "secret.example.com");
        for wider in [
            r#"{"allow":["*"]}"#,
            r#"{"allow":["api.example.com"]}"#,
            "true",
        ] {
            let err = egress(wider).within(&parent, "its parent").unwrap_err();
            assert_eq!(err.code, ErrorCode::PermissionDenied, "{wider}");
            assert!(err.error.contains("`network"), "{}", err.error);
        }
        assert_eq!(
            egress("false").within(&parent, "its parent").unwrap(),
            Egress::Loopback
        );
        let err = narrower_of_loopback();
        assert_eq!(err.code, ErrorCode::PermissionDenied);
        assert!(egress("true").within(&Egress::Host, "the operator").is_ok());
    }

    fn narrower_of_loopback() -> ErrorReply {
        egress(r#"{"allow":["api.example.com"]}"#)
            .within(&Egress::Loopback, "its parent")
            .unwrap_err()
    }

    #[test]
    fn the_default_applies_only_when_the_caller_may_give_it() {
        let Egress::Policy(default) = egress(r#"{"allow":["*.pypi.org:443"]}"#) else {
            unreachable!()
        };
        assert!(matches!(
            Egress::default_within(Some(&default), &Egress::Host),
            Egress::Policy(_)
        ));
        assert_eq!(
            Egress::default_within(Some(&default), &Egress::Loopback),
            Egress::Loopback
        );
        assert_eq!(
            Egress::default_within(None, &Egress::Host),
            Egress::Loopback
        );
    }
}
