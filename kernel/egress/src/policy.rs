//! Network policies: which hosts and addresses a sandbox may reach through
//! the kernel's egress proxy (PROTOCOL.md, "Network policy").
//!
//! A policy is an allow list and a deny list of entries, each a host
//! pattern (`api.github.com`, `*.pypi.org`, or `*` for any name) or an
//! address range (`10.1.2.0/24`, `[fd00::]/8`, an address alone), with an
//! optional port. A connection is decided on both the name it was asked
//! for and the address that name resolved to: a deny entry that matches
//! either refuses it; a private, loopback, link-local or metadata address
//! is refused unless an allow entry names its range (and, for a name, an
//! allow entry names it too); otherwise an allow entry must match.
//!
//! A child's policy must lie within its parent's: every entry it allows is
//! allowed by one of the parent's, and the parent's denials are added to
//! its own.

mod entry;
mod range;

use std::fmt;
use std::net::IpAddr;

use agentos_proto::payload::NetworkPolicy;

pub use entry::EntryError;
use entry::Rule;
use range::special_range;
pub use range::RangeError;

/// At most this many entries in each list: a policy is read on every
/// connection, and it comes from a hostile caller.
pub const MAX_ENTRIES: usize = 256;

/// A network policy, as SPAWN's and EXEC's `network` object gives it (the
/// default allows nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    allow: Vec<Rule>,
    deny: Vec<Rule>,
}

/// How a connection was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Refused, and why, in words the sandbox's code can act on.
    Refused(String),
}

impl Policy {
    /// Reads a policy from a request's `network` object (either list may
    /// be empty). An error names the field at fault.
    pub fn from_proto(policy: &NetworkPolicy) -> Result<Policy, PolicyError> {
        Ok(Policy {
            allow: rules(&policy.allow, List::Allow)?,
            deny: rules(&policy.deny, List::Deny)?,
        })
    }

    /// The policy as a request's `network` object gives it, in the form it
    /// was read (names lowercased).
    pub fn to_proto(&self) -> NetworkPolicy {
        let entries = |rules: &[Rule]| rules.iter().map(Rule::to_string).collect();
        NetworkPolicy {
            allow: entries(&self.allow),
            deny: entries(&self.deny),
        }
    }

    /// Whether a connection to `port` of `name` (as asked for: a name, or
    /// an address literal), which resolved to `address`, may be made.
    ///
    /// A name is allowed by name entries only (address ranges allow
    /// address literals), so [`Policy::decide_name`] settles it before any
    /// DNS query is made; the address it resolved to must then not be
    /// denied, and if it lies in a special range, an allow entry must
    /// name that range too.
    pub fn decide(&self, name: &str, address: IpAddr, port: u16) -> Decision {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(rule) = self
            .deny
            .iter()
            .find(|rule| rule.matches(&name, address, port))
        {
            return Decision::Refused(format!(
                "{name}:{port} is denied by the policy's \"{rule}\""
            ));
        }
        let literal = name.parse::<IpAddr>().is_ok();
        let named_range = self
            .allow
            .iter()
            .any(|rule| rule.is_range() && rule.matches(&name, address, port));
        if let Some(kind) = special_range(address).filter(|_| !named_range) {
            return Decision::Refused(format!(
                "{name} resolves to {address}, a {kind} address: allow its range to reach it"
            ));
        }
        let allowed = if literal {
            named_range
        } else {
            self.allow
                .iter()
                .any(|rule| !rule.is_range() && rule.matches(&name, address, port))
        };
        if allowed {
            Decision::Allowed
        } else {
            Decision::Refused(format!("{name}:{port} is not in the policy's allow list"))
        }
    }

    /// What can be decided of a connection to `port` of the name `name`
    /// before it is resolved: refused if a deny entry names it or no allow
    /// entry does (so a sandbox cannot make the kernel look up names its
    /// policy never allows). `None`: resolve it, and [`Policy::decide`].
    pub fn decide_name(&self, name: &str, port: u16) -> Option<Decision> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if name.parse::<IpAddr>().is_ok() {
            return None;
        }
        if let Some(rule) = self.deny.iter().find(|rule| rule.names(&name, port)) {
            return Some(Decision::Refused(format!(
                "{name}:{port} is denied by the policy's \"{rule}\""
            )));
        }
        if !self.allow.iter().any(|rule| rule.names(&name, port)) {
            return Some(Decision::Refused(format!(
                "{name}:{port} is not in the policy's allow list"
            )));
        }
        None
    }

    /// This policy as a child of `parent` may have it: every entry it
    /// allows must be allowed by one of the parent's, and the parent's
    /// denials are added to its own. The error names the entry at fault.
    pub fn within(mut self, parent: &Policy) -> Result<Policy, NotWithin> {
        for (index, rule) in self.allow.iter().enumerate() {
            if !parent.allow.iter().any(|wider| wider.covers(rule)) {
                return Err(NotWithin::Allow {
                    index,
                    rule: rule.to_string(),
                });
            }
        }
        for rule in &parent.deny {
            if !self.deny.contains(rule) {
                self.deny.push(rule.clone());
            }
        }
        if self.deny.len() > MAX_ENTRIES {
            return Err(NotWithin::TooManyDenials {
                count: self.deny.len(),
            });
        }
        Ok(self)
    }

    /// This policy cut down to lie within `parent`: the entries no entry
    /// of the parent's covers are dropped, and the parent's denials added.
    /// (What a descendant keeps when its ancestor's policy narrows.)
    pub fn narrowed_to(mut self, parent: &Policy) -> Policy {
        self.allow
            .retain(|rule| parent.allow.iter().any(|wider| wider.covers(rule)));
        for rule in &parent.deny {
            if !self.deny.contains(rule) {
                self.deny.push(rule.clone());
            }
        }
        self
    }
}

/// The policy as JSON, the way a request's `network` gives it (for the
/// log).
impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let json = serde_json::to_string(&self.to_proto()).map_err(|_| fmt::Error)?;
        f.write_str(&json)
    }
}

/// One of a policy's two lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Allow,
    Deny,
}

impl fmt::Display for List {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            List::Allow => "allow",
            List::Deny => "deny",
        })
    }
}

/// A field of a policy, as an error names it: a list (`allow`), or one of
/// its entries (`allow[2]`). Whoever reports it puts it under the object
/// that holds the policy (`network.`, the config file's
/// `network.default_`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub list: List,
    /// The entry's place in the list; `None`: the list as a whole.
    pub index: Option<usize>,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(index) => write!(f, "{}[{index}]", self.list),
            None => write!(f, "{}", self.list),
        }
    }
}

/// Why a policy cannot be read: the field at fault, and what is wrong
/// there. Its text names the field under `network.`, as a request does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.under("network."))]
pub struct PolicyError {
    /// Where: `allow[2]`, `deny`.
    pub field: Field,
    /// What is wrong there.
    pub problem: Problem,
}

/// What is wrong at a policy's field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// A list of more than [`MAX_ENTRIES`] entries.
    #[error("at most {MAX_ENTRIES} entries")]
    TooMany,
    /// An entry that is neither a host pattern nor an address range.
    #[error("{entry:?}: {why}")]
    Entry { entry: String, why: EntryError },
}

impl PolicyError {
    /// The message, with the field put under `parent`: `network.` for a
    /// request's, `network.default_` for the config file's lists.
    pub fn under(&self, parent: &str) -> String {
        let between = match self.problem {
            Problem::TooMany => ": ",
            Problem::Entry { .. } => " ",
        };
        format!("{parent}{}{between}{}", self.field, self.problem)
    }
}

/// Why a policy cannot be had within a wider one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotWithin {
    /// An allowed entry that no entry of the wider policy covers.
    #[error("network.allow[{index}] \"{rule}\": not within the parent's policy")]
    Allow { index: usize, rule: String },
    /// The denials, with the wider policy's added, are too many.
    #[error(
        "network.deny: with its parent's denials added it has {count} entries, more than \
         {MAX_ENTRIES}"
    )]
    TooManyDenials { count: usize },
}

impl NotWithin {
    /// The request's field at fault: `network.allow[2]`, `network.deny`.
    pub fn field(&self) -> String {
        let field = match self {
            NotWithin::Allow { index, .. } => Field {
                list: List::Allow,
                index: Some(*index),
            },
            NotWithin::TooManyDenials { .. } => Field {
                list: List::Deny,
                index: None,
            },
        };
        format!("network.{field}")
    }

    /// Why, with `holder` naming who holds the wider policy (`its
    /// parent`, `the caller`).
    pub fn reason(&self, holder: &str) -> String {
        match self {
            NotWithin::Allow { rule, .. } => format!("\"{rule}\": not within {holder}'s policy"),
            NotWithin::TooManyDenials { count } => format!(
                "with {holder}'s denials added it has {count} entries, more than {MAX_ENTRIES}"
            ),
        }
    }
}

/// The entries of list `list`.
fn rules(entries: &[String], list: List) -> Result<Vec<Rule>, PolicyError> {
    if entries.len() > MAX_ENTRIES {
        return Err(PolicyError {
            field: Field { list, index: None },
            problem: Problem::TooMany,
        });
    }
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            Rule::parse(entry).map_err(|why| PolicyError {
                field: Field {
                    list,
                    index: Some(index),
                },
                problem: Problem::Entry {
                    entry: entry.clone(),
                    why,
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_proto::payload::{parse_json, Network};
    use serde_json::{json, Value};

    fn read(value: &Value) -> Result<Policy, PolicyError> {
        Policy::from_proto(&serde_json::from_value(value.clone()).unwrap())
    }

    fn policy(value: Value) -> Policy {
        read(&value).unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn names_patterns_and_ports_decide_public_addresses() {
        let p = policy(
            json!({"allow": ["api.github.com:443", "*.pypi.org", "files.pythonhosted.org:443"]}),
        );
        assert_eq!(
            p.decide("api.github.com", ip("140.82.112.6"), 443),
            Decision::Allowed
        );
        assert!(matches!(
            p.decide("api.github.com", ip("140.82.112.6"), 80),
            Decision::Refused(_)
        ));
        assert_eq!(
            p.decide("upload.pypi.org", ip("151.101.0.223"), 80),
            Decision::Allowed
        );
        assert_eq!(
            p.decide("a.b.pypi.org", ip("151.101.0.223"), 443),
            Decision::Allowed
        );
        assert!(matches!(
            p.decide("pypi.org", ip("151.101.0.223"), 443),
            Decision::Refused(_)
        ));
        assert!(matches!(
            p.decide("evilpypi.org", ip("1.2.3.4"), 443),
            Decision::Refused(_)
        ));
        assert!(matches!(
            p.decide("example.com", ip("93.184.216.34"), 443),
            Decision::Refused(_)
        ));
        // Names compare without case or a final dot.
        assert_eq!(
            p.decide("API.GitHub.com.", ip("140.82.112.6"), 443),
            Decision::Allowed
        );
    }

    #[test]
    fn private_loopback_and_metadata_addresses_need_their_range_named() {
        let p = policy(json!({"allow": ["*", "10.1.2.0/24:5432"]}));
        for (name, address) in [
            ("internal.example", "127.0.0.1"),
            ("metadata.example", "169.254.169.254"),
            ("lan.example", "192.168.1.10"),
            ("v6.example", "fd00::1"),
            ("v6-loopback.example", "::1"),
            ("mapped.example", "::ffff:127.0.0.1"),
            ("cgnat.example", "100.64.0.1"),
        ] {
            let decision = p.decide(name, ip(address), 443);
            assert!(
                matches!(&decision, Decision::Refused(why) if why.contains("address")),
                "{name} -> {address}: {decision:?}"
            );
        }
        assert_eq!(
            p.decide("db.example", ip("10.1.2.7"), 5432),
            Decision::Allowed
        );
        assert!(matches!(
            p.decide("db.example", ip("10.1.2.7"), 22),
            Decision::Refused(_)
        ));
        // A name pattern never lets in an address literal: only a range does.
        assert!(matches!(
            p.decide("93.184.216.34", ip("93.184.216.34"), 443),
            Decision::Refused(_)
        ));
    }

    #[test]
    fn a_denial_beats_any_allowance_by_name_or_by_address() {
        let p = policy(
            json!({"allow": ["*", "10.0.0.0/8"], "deny": ["*.internal.example", "10.9.0.0/16"]}),
        );
        assert!(matches!(
            p.decide("db.internal.example", ip("1.2.3.4"), 443),
            Decision::Refused(_)
        ));
        assert!(matches!(
            p.decide("fine.example", ip("10.9.1.1"), 443),
            Decision::Refused(_)
        ));
        assert!(matches!(
            p.decide("x", ip("::ffff:10.9.1.1"), 443),
            Decision::Refused(_)
        ));
        assert_eq!(
            p.decide("fine.example", ip("10.8.1.1"), 443),
            Decision::Allowed
        );
    }

    #[test]
    fn malformed_and_oversized_policies_are_refused_naming_the_field() {
        let cases = [
            (json!({"allow": ["a..b"]}), "network.allow[0]"),
            (json!({"allow": ["*.*.x"]}), "network.allow[0]"),
            (json!({"allow": ["x:0"]}), "network.allow[0]"),
            (json!({"allow": ["x:65536"]}), "network.allow[0]"),
            (json!({"allow": ["x:+1"]}), "network.allow[0]"),
            (json!({"allow": ["10.0.0.1/8"]}), "network.allow[0]"),
            (json!({"allow": ["10.0.0.0/33"]}), "network.allow[0]"),
            (json!({"allow": ["10.0.0.0/08"]}), "network.allow[0]"),
            (json!({"allow": ["[fd00::/8"]}), "network.allow[0]"),
            (json!({"deny": ["bad_name"]}), "network.deny[0]"),
            (json!({"allow": ["x".repeat(300)]}), "network.allow[0]"),
            (
                json!({"allow": vec!["a.example"; MAX_ENTRIES + 1]}),
                "network.allow",
            ),
        ];
        for (value, field) in cases {
            let error = read(&value).unwrap_err();
            assert_eq!(
                format!("network.{}", error.field),
                field,
                "{value}: {error}"
            );
            assert!(error.to_string().starts_with(field), "{value}: {error}");
        }
        // A `network` of no policy's shape never reaches the kernel: a
        // request's parse refuses it, unknown fields included.
        for value in [
            json!({"allow": "x"}),
            json!({"allow": [1]}),
            json!({"allow": [], "proxy": "x"}),
            json!(["a.example"]),
        ] {
            let payload = value.to_string();
            assert!(
                parse_json::<Network>("NET", payload.as_bytes()).is_err(),
                "{value}"
            );
        }
    }

    #[test]
    fn an_errors_field_is_put_under_the_object_that_holds_the_policy() {
        let error = read(&json!({"deny": ["ok.example", "network.example:0"]})).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"network.deny[1] "network.example:0": port "0" is not 1 to 65535"#
        );
        assert_eq!(
            error.under("network.default_"),
            r#"network.default_deny[1] "network.example:0": port "0" is not 1 to 65535"#
        );
        let error = read(&json!({"allow": vec!["a.example"; MAX_ENTRIES + 1]})).unwrap_err();
        assert_eq!(
            error.under("network.default_"),
            format!("network.default_allow: at most {MAX_ENTRIES} entries")
        );
    }

    #[test]
    fn ipv6_ranges_take_ports_in_brackets() {
        let p = policy(json!({"allow": ["[fd00::/8]", "[fd12::1]:8443", "2001:db8::/32"]}));
        assert_eq!(
            p.to_proto().allow,
            ["fd00::/8", "[fd12::1]:8443", "2001:db8::/32"]
        );
        assert_eq!(p.decide("fd12::1", ip("fd12::1"), 8443), Decision::Allowed);
        // A name resolving into a named private range still needs its name.
        assert!(matches!(
            p.decide("x", ip("fd12::1"), 8443),
            Decision::Refused(_)
        ));
        let named = policy(json!({"allow": ["db.internal", "fd00::/8"]}));
        assert_eq!(
            named.decide("db.internal", ip("fd12::1"), 5432),
            Decision::Allowed
        );
        assert_eq!(
            p.decide("2001:db8::5", ip("2001:db8::5"), 1),
            Decision::Allowed
        );
        // A range allows address literals; a name needs a name entry.
        assert!(matches!(
            p.decide("x", ip("2001:db8::5"), 1),
            Decision::Refused(_)
        ));
        assert!(matches!(
            p.decide("2001:db9::5", ip("2001:db9::5"), 1),
            Decision::Refused(_)
        ));
    }

    #[test]
    fn ipv6_addresses_carrying_ipv4_ones_are_special() {
        let p = policy(json!({"allow": ["*"]}));
        for address in [
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "2001:0:4136:e378::1",
        ] {
            let Decision::Refused(why) = p.decide("host.example", ip(address), 80) else {
                panic!("{address} was allowed");
            };
            assert!(why.contains("IPv4-embedding"), "{why}");
        }
        let named = policy(json!({"allow": ["64:ff9b::/96"]}));
        assert_eq!(
            named.decide("64:ff9b::102:304", ip("64:ff9b::102:304"), 80),
            Decision::Allowed
        );
    }

    #[test]
    fn a_name_no_entry_allows_is_refused_before_it_is_resolved() {
        let p =
            policy(json!({"allow": ["*.pypi.org:443", "10.0.0.0/8"], "deny": ["evil.pypi.org"]}));
        assert_eq!(p.decide_name("files.pypi.org", 443), None);
        assert_eq!(
            p.decide_name("10.1.2.3", 80),
            None,
            "a literal is decided on its address"
        );
        for (name, port) in [
            ("exfil-1234.attacker.example", 443),
            ("files.pypi.org", 80),
            ("evil.pypi.org", 443),
        ] {
            assert!(
                matches!(p.decide_name(name, port), Some(Decision::Refused(_))),
                "{name}:{port}"
            );
        }
    }

    #[test]
    fn a_child_gets_no_more_than_its_parent_and_keeps_its_denials() {
        let parent = policy(
            json!({"allow": ["*.example.com", "api.other.org:443", "10.0.0.0/8"], "deny": ["secret.example.com"]}),
        );
        let child = policy(json!({"allow": ["a.example.com", "*.b.example.com:443", "api.other.org:443", "10.1.0.0/16:22"]}))
            .within(&parent)
            .unwrap();
        assert!(matches!(
            child.decide("secret.example.com", ip("1.2.3.4"), 443),
            Decision::Refused(_)
        ));
        for (wider, field) in [
            (json!({"allow": ["example.com"]}), "network.allow[0]"),
            (json!({"allow": ["api.other.org"]}), "network.allow[0]"),
            (json!({"allow": ["a.example.com", "*"]}), "network.allow[1]"),
            (json!({"allow": ["10.0.0.0/7"]}), "network.allow[0]"),
            (json!({"allow": ["11.0.0.0/8"]}), "network.allow[0]"),
        ] {
            let error = policy(wider.clone()).within(&parent).unwrap_err();
            assert_eq!(error.field(), field, "{wider}: {error}");
            assert!(error.to_string().contains("parent"), "{wider}: {error}");
        }
    }
}

#[cfg(test)]
mod narrowing {
    use super::*;

    fn policy(json: &str) -> Policy {
        Policy::from_proto(&serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn a_narrowed_policy_keeps_only_what_its_parent_still_allows() {
        let child = policy(r#"{"allow":["api.example.com:443","files.example.org"]}"#);
        let parent = policy(r#"{"allow":["*.example.com"],"deny":["bad.example.com"]}"#);
        let narrowed = child.narrowed_to(&parent);
        assert_eq!(
            narrowed.to_proto(),
            NetworkPolicy {
                allow: vec!["api.example.com:443".to_owned()],
                deny: vec!["bad.example.com".to_owned()],
            }
        );
        assert_eq!(
            narrowed.to_string(),
            r#"{"allow":["api.example.com:443"],"deny":["bad.example.com"]}"#
        );
        assert!(narrowed.clone().within(&parent).is_ok());
    }
}
