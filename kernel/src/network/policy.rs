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

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::Value;

/// At most this many entries in each list: a policy is read on every
/// connection, and it comes from a hostile caller.
pub const MAX_ENTRIES: usize = 256;

/// The longest entry: a 253-byte name, `[`, `]`, a prefix and a port.
const MAX_ENTRY_BYTES: usize = 270;

/// A network policy, as SPAWN's and EXEC's `network` object gives it (the
/// default allows nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    allow: Vec<Rule>,
    deny: Vec<Rule>,
}

/// One entry: what it names and on which port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    target: Target,
    /// `None`: every port.
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `*`: any name (addresses are still checked).
    AnyName,
    /// `api.github.com`: that name only.
    Name(String),
    /// `*.pypi.org`: names with one or more labels before `pypi.org`.
    Subdomains(String),
    /// An address range; an address alone is a range of one.
    Range(Range),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    network: IpAddr,
    prefix: u8,
}

/// How a connection was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Refused, and why, in words the sandbox's code can act on.
    Refused(String),
}

impl Policy {
    /// Reads a policy from `{"allow": [...], "deny": [...]}`; either list
    /// may be missing. An error names the field at fault.
    pub fn from_json(value: &Value) -> Result<Policy, String> {
        let Value::Object(fields) = value else {
            return Err("network: give false, true, or {\"allow\": [...], \"deny\": [...]}".into());
        };
        if let Some(unknown) = fields
            .keys()
            .find(|key| !matches!(key.as_str(), "allow" | "deny"))
        {
            return Err(format!(
                "network.{unknown}: unknown field (allow and deny are known)"
            ));
        }
        Ok(Policy {
            allow: rules(fields.get("allow"), "allow")?,
            deny: rules(fields.get("deny"), "deny")?,
        })
    }

    /// The policy as JSON, in the form it was read (names lowercased).
    pub fn to_json(&self) -> Value {
        let entries = |rules: &[Rule]| {
            rules
                .iter()
                .map(|rule| rule.to_string())
                .collect::<Vec<_>>()
        };
        serde_json::json!({ "allow": entries(&self.allow), "deny": entries(&self.deny) })
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
        let named_range = self.allow.iter().any(|rule| {
            matches!(rule.target, Target::Range(_)) && rule.matches(&name, address, port)
        });
        if let Some(kind) = special_range(address).filter(|_| !named_range) {
            return Decision::Refused(format!(
                "{name} resolves to {address}, a {kind} address: allow its range to reach it"
            ));
        }
        let allowed = if literal {
            named_range
        } else {
            self.allow.iter().any(|rule| {
                !matches!(rule.target, Target::Range(_)) && rule.matches(&name, address, port)
            })
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
        let by_name = |rule: &&Rule| {
            !matches!(rule.target, Target::Range(_))
                && rule.port.is_none_or(|only| only == port)
                && match &rule.target {
                    Target::AnyName => true,
                    Target::Name(exact) => &name == exact,
                    Target::Subdomains(domain) => is_subdomain(&name, domain),
                    Target::Range(_) => false,
                }
        };
        if let Some(rule) = self.deny.iter().find(by_name) {
            return Some(Decision::Refused(format!(
                "{name}:{port} is denied by the policy's \"{rule}\""
            )));
        }
        if !self.allow.iter().any(|rule| by_name(&rule)) {
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
        match self {
            NotWithin::Allow { index, .. } => format!("network.allow[{index}]"),
            NotWithin::TooManyDenials { .. } => "network.deny".to_owned(),
        }
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

impl Policy {
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

/// The entries of list `field`.
fn rules(value: Option<&Value>, field: &str) -> Result<Vec<Rule>, String> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let Value::Array(entries) = value else {
        return Err(format!("network.{field}: must be a list of strings"));
    };
    if entries.len() > MAX_ENTRIES {
        return Err(format!("network.{field}: at most {MAX_ENTRIES} entries"));
    }
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let Value::String(text) = entry else {
                return Err(format!("network.{field}[{index}]: must be a string"));
            };
            Rule::parse(text).map_err(|why| format!("network.{field}[{index}] {text:?}: {why}"))
        })
        .collect()
}

impl Rule {
    fn parse(text: &str) -> Result<Rule, String> {
        if text.len() > MAX_ENTRY_BYTES {
            return Err(format!("longer than {MAX_ENTRY_BYTES} bytes"));
        }
        let (target, port) = split_port(text)?;
        let target = if target == "*" {
            Target::AnyName
        } else if let Some(range) = Range::parse(target)? {
            Target::Range(range)
        } else if let Some(domain) = target.strip_prefix("*.") {
            Target::Subdomains(host_name(domain)?)
        } else {
            Target::Name(host_name(target)?)
        };
        Ok(Rule { target, port })
    }

    fn matches(&self, name: &str, address: IpAddr, port: u16) -> bool {
        if self.port.is_some_and(|only| only != port) {
            return false;
        }
        match &self.target {
            Target::AnyName => name.parse::<IpAddr>().is_err(),
            Target::Name(exact) => name == exact,
            Target::Subdomains(domain) => is_subdomain(name, domain),
            Target::Range(range) => range.contains(address),
        }
    }

    /// Whether everything `narrower` allows, this allows too.
    fn covers(&self, narrower: &Rule) -> bool {
        let ports = match (self.port, narrower.port) {
            (None, _) => true,
            (Some(mine), Some(theirs)) => mine == theirs,
            (Some(_), None) => false,
        };
        let targets = match (&self.target, &narrower.target) {
            (Target::AnyName, Target::AnyName | Target::Name(_) | Target::Subdomains(_)) => true,
            (Target::Name(mine), Target::Name(theirs)) => mine == theirs,
            (Target::Subdomains(mine), Target::Name(theirs)) => is_subdomain(theirs, mine),
            (Target::Subdomains(mine), Target::Subdomains(theirs)) => {
                theirs == mine || is_subdomain(theirs, mine)
            }
            (Target::Range(mine), Target::Range(theirs)) => mine.covers(theirs),
            _ => false,
        };
        ports && targets
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bracketed = matches!(
            self.target,
            Target::Range(Range {
                network: IpAddr::V6(_),
                ..
            })
        );
        match &self.target {
            Target::AnyName => write!(f, "*")?,
            Target::Name(name) => write!(f, "{name}")?,
            Target::Subdomains(domain) => write!(f, "*.{domain}")?,
            Target::Range(range) if bracketed && self.port.is_some() => write!(f, "[{range}]")?,
            Target::Range(range) => write!(f, "{range}")?,
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// An entry's target and port: `host:443`, `10.0.0.0/8:5432`, and for
/// IPv6 with a port, `[fd00::/8]:443` (an IPv6 range without brackets
/// takes no port: its colons are the address's).
fn split_port(text: &str) -> Result<(&str, Option<u16>), String> {
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or("an opening [ without its ]")?;
        return match after {
            "" => Ok((inside, None)),
            _ => Ok((
                inside,
                Some(port(after.strip_prefix(':').ok_or("after ] comes :port")?)?),
            )),
        };
    }
    if text.matches(':').count() > 1 {
        return Ok((text, None));
    }
    match text.rsplit_once(':') {
        Some((target, number)) => Ok((target, Some(port(number)?))),
        None => Ok((text, None)),
    }
}

fn port(text: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(port) if port > 0 && !text.starts_with('+') => Ok(port),
        _ => Err(format!("port {text:?} is not 1 to 65535")),
    }
}

/// `text` as a host name: lowercase letters, digits and `-` in labels of
/// 1 to 63, 253 bytes in all.
fn host_name(text: &str) -> Result<String, String> {
    let name = text.trim_end_matches('.').to_ascii_lowercase();
    if name.is_empty() || name.len() > 253 {
        return Err("a host name is 1 to 253 bytes".into());
    }
    for label in name.split('.') {
        let valid = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid {
            return Err(format!(
                "{label:?} is not a host name's label (letters, digits and -, up to 63; `*.` only in front)"
            ));
        }
    }
    Ok(name)
}

/// Whether `name` is `domain` with one or more labels in front.
fn is_subdomain(name: &str, domain: &str) -> bool {
    name.len() > domain.len() + 1
        && name.ends_with(domain)
        && name.as_bytes()[name.len() - domain.len() - 1] == b'.'
}

impl Range {
    /// `10.0.0.0/8`, `fd00::/8`, or an address alone; `None` when `text`
    /// is not an address (so a name).
    fn parse(text: &str) -> Result<Option<Range>, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let Ok(network) = address.parse::<IpAddr>() else {
            return match prefix {
                Some(_) => Err(format!("{address:?} is not an IP address")),
                None => Ok(None),
            };
        };
        let bits = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            // Plain decimal only: no `+8`, no `08`.
            Some(written) => match written.parse::<u8>() {
                Ok(prefix) if prefix <= bits && prefix.to_string() == written => prefix,
                _ => return Err(format!("prefix /{written} is not 0 to {bits}")),
            },
        };
        let range = Range { network, prefix };
        if range.masked() != network {
            return Err(format!("{network}/{prefix} has bits set past its prefix"));
        }
        Ok(Some(range))
    }

    fn contains(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        match (self.network, address) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                mask_v4(u32::from(address), self.prefix) == u32::from(network)
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                mask_v6(u128::from(address), self.prefix) == u128::from(network)
            }
            _ => false,
        }
    }

    fn covers(&self, narrower: &Range) -> bool {
        self.prefix <= narrower.prefix && self.contains(narrower.network)
    }

    fn masked(&self) -> IpAddr {
        match self.network {
            IpAddr::V4(address) => {
                IpAddr::V4(Ipv4Addr::from(mask_v4(u32::from(address), self.prefix)))
            }
            IpAddr::V6(address) => {
                IpAddr::V6(Ipv6Addr::from(mask_v6(u128::from(address), self.prefix)))
            }
        }
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = if self.network.is_ipv4() { 32 } else { 128 };
        if self.prefix == bits {
            write!(f, "{}", self.network)
        } else {
            write!(f, "{}/{}", self.network, self.prefix)
        }
    }
}

fn mask_v4(bits: u32, prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        bits & (u32::MAX << (32 - u32::from(prefix)))
    }
}

fn mask_v6(bits: u128, prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        bits & (u128::MAX << (128 - u32::from(prefix)))
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is the IPv4 address it
/// carries: a policy on `10.0.0.0/8` must not be bypassed by writing it so.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        IpAddr::V4(_) => address,
    }
}

/// What kind of address a sandbox may reach only when its policy names
/// the range: `None` for a public address.
fn special_range(address: IpAddr) -> Option<&'static str> {
    match canonical(address) {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_loopback() {
                Some("loopback")
            } else if v4.is_private() {
                Some("private")
            } else if v4.is_link_local() {
                Some("link-local (cloud metadata)")
            } else if a == 100 && (64..128).contains(&b) {
                Some("shared (carrier-grade NAT)")
            } else if v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast() || a == 0 {
                Some("non-unicast")
            } else if (a == 192 && b == 0 && v4.octets()[2] == 0)
                || (a == 198 && (b & 0xfe) == 18)
                || a >= 240
            {
                Some("reserved (IETF protocol, benchmarking or future use)")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() || v6.is_multicast() {
                Some("non-unicast")
            } else if first & 0xfe00 == 0xfc00 {
                Some("unique-local (private)")
            } else if first & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
                || v6.segments()[..3] == [0x64, 0xff9b, 1]
                || v6.segments()[..6] == [0, 0, 0, 0, 0, 0]
                || first == 0x2002
            {
                // NAT64 and 6to4 carry an IPv4 address a gateway may
                // reach (64:ff9b::a9fe:a9fe is 169.254.169.254 on a NAT64
                // host): treated as special whatever address they carry.
                Some("IPv4-embedding (NAT64, IPv4-compatible or 6to4)")
            } else if v6.segments()[..2] == [0x2001, 0] {
                Some("Teredo (IPv4-embedding)")
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(value: Value) -> Policy {
        Policy::from_json(&value).unwrap()
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
            (json!({"allow": "x"}), "network.allow"),
            (json!({"allow": [1]}), "network.allow[0]"),
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
            (json!({"allow": [], "proxy": "x"}), "network.proxy"),
            (json!({"allow": ["x".repeat(300)]}), "network.allow[0]"),
            (
                json!({"allow": vec!["a.example"; MAX_ENTRIES + 1]}),
                "network.allow",
            ),
            (json!(["a.example"]), "network"),
        ];
        for (value, field) in cases {
            let error = Policy::from_json(&value).unwrap_err();
            assert!(error.starts_with(field), "{value}: {error}");
        }
    }

    #[test]
    fn ipv6_ranges_take_ports_in_brackets() {
        let p = policy(json!({"allow": ["[fd00::/8]", "[fd12::1]:8443", "2001:db8::/32"]}));
        assert_eq!(
            p.to_json()["allow"],
            json!(["fd00::/8", "[fd12::1]:8443", "2001:db8::/32"])
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
        Policy::from_json(&serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn a_narrowed_policy_keeps_only_what_its_parent_still_allows() {
        let child = policy(r#"{"allow":["api.example.com:443","files.example.org"]}"#);
        let parent = policy(r#"{"allow":["*.example.com"],"deny":["bad.example.com"]}"#);
        let narrowed = child.narrowed_to(&parent);
        assert_eq!(
            narrowed.to_json(),
            serde_json::json!({"allow": ["api.example.com:443"], "deny": ["bad.example.com"]})
        );
        assert!(narrowed.clone().within(&parent).is_ok());
    }
}
