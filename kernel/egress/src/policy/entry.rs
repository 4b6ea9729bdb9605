//! One entry of a policy's lists: a host pattern (`api.github.com`,
//! `*.pypi.org`, or `*` for any name) or an address range, with an
//! optional port.

use std::fmt;
use std::net::IpAddr;

use super::range::{Range, RangeError};

/// The longest entry: a 253-byte name, `[`, `]`, a prefix and a port.
const MAX_ENTRY_BYTES: usize = 270;

/// One entry: what it names and on which port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rule {
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

/// Why an entry is neither a host pattern nor an address range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Longer than any entry can be.
    #[error("longer than {MAX_ENTRY_BYTES} bytes")]
    TooLong,
    /// `[fd00::/8` without its `]`.
    #[error("an opening [ without its ]")]
    Unclosed,
    /// Something other than `:port` after the `]`.
    #[error("after ] comes :port")]
    AfterBracket,
    /// A port that is not plain decimal from 1 to 65535.
    #[error("port {0:?} is not 1 to 65535")]
    Port(String),
    /// An empty name, or one too long.
    #[error("a host name is 1 to 253 bytes")]
    NameLength,
    /// A label that is not letters, digits and `-`.
    #[error(
        "{0:?} is not a host name's label (letters, digits and -, up to 63; `*.` only in front)"
    )]
    Label(String),
    /// An address range that is not one.
    #[error(transparent)]
    Range(#[from] RangeError),
}

impl Rule {
    pub(super) fn parse(text: &str) -> Result<Rule, EntryError> {
        if text.len() > MAX_ENTRY_BYTES {
            return Err(EntryError::TooLong);
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

    /// Whether it names an address range (which allows address literals,
    /// and the special addresses in it), not names.
    pub(super) fn is_range(&self) -> bool {
        matches!(self.target, Target::Range(_))
    }

    /// Whether a connection to `port` of `name` (lowercased, without a
    /// final dot), which resolved to `address`, is one it names.
    pub(super) fn matches(&self, name: &str, address: IpAddr, port: u16) -> bool {
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

    /// Whether it names `port` of the name `name` (not an address
    /// literal) by name, before the name is resolved.
    pub(super) fn names(&self, name: &str, port: u16) -> bool {
        self.port.is_none_or(|only| only == port)
            && match &self.target {
                Target::AnyName => true,
                Target::Name(exact) => name == exact,
                Target::Subdomains(domain) => is_subdomain(name, domain),
                Target::Range(_) => false,
            }
    }

    /// Whether everything `narrower` allows, this allows too.
    pub(super) fn covers(&self, narrower: &Rule) -> bool {
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
        match &self.target {
            Target::AnyName => write!(f, "*")?,
            Target::Name(name) => write!(f, "{name}")?,
            Target::Subdomains(domain) => write!(f, "*.{domain}")?,
            Target::Range(range) if range.is_v6() && self.port.is_some() => write!(f, "[{range}]")?,
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
fn split_port(text: &str) -> Result<(&str, Option<u16>), EntryError> {
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or(EntryError::Unclosed)?;
        return match after {
            "" => Ok((inside, None)),
            _ => {
                let number = after.strip_prefix(':').ok_or(EntryError::AfterBracket)?;
                Ok((inside, Some(port(number)?)))
            }
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

fn port(text: &str) -> Result<u16, EntryError> {
    match text.parse::<u16>() {
        Ok(port) if port > 0 && !text.starts_with('+') => Ok(port),
        _ => Err(EntryError::Port(text.to_owned())),
    }
}

/// `text` as a host name: lowercase letters, digits and `-` in labels of
/// 1 to 63, 253 bytes in all.
fn host_name(text: &str) -> Result<String, EntryError> {
    let name = text.trim_end_matches('.').to_ascii_lowercase();
    if name.is_empty() || name.len() > 253 {
        return Err(EntryError::NameLength);
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
            return Err(EntryError::Label(label.to_owned()));
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
