//! Address ranges a policy's entries name (`10.1.2.0/24`, `fd00::/8`, an
//! address alone), and the kinds of address a sandbox reaches only when
//! its policy names their range.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address range; an address alone is a range of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Range {
    network: IpAddr,
    prefix: u8,
}

/// Why an entry that is written as an address range is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// What comes before the `/` is not an address.
    #[error("{0:?} is not an IP address")]
    NotAnAddress(String),
    /// The prefix is not plain decimal within the address's bits.
    #[error("prefix /{written} is not 0 to {bits}")]
    Prefix { written: String, bits: u8 },
    /// The address has bits set that the prefix leaves out.
    #[error("{network}/{prefix} has bits set past its prefix")]
    PastPrefix { network: IpAddr, prefix: u8 },
}

impl Range {
    /// `10.0.0.0/8`, `fd00::/8`, or an address alone; `None` when `text`
    /// is not an address (so a name).
    pub(super) fn parse(text: &str) -> Result<Option<Range>, RangeError> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let Ok(network) = address.parse::<IpAddr>() else {
            return match prefix {
                Some(_) => Err(RangeError::NotAnAddress(address.to_owned())),
                None => Ok(None),
            };
        };
        let bits = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            // Plain decimal only: no `+8`, no `08`.
            Some(written) => match written.parse::<u8>() {
                Ok(prefix) if prefix <= bits && prefix.to_string() == written => prefix,
                _ => {
                    return Err(RangeError::Prefix {
                        written: written.to_owned(),
                        bits,
                    })
                }
            },
        };
        let range = Range { network, prefix };
        if range.masked() != network {
            return Err(RangeError::PastPrefix { network, prefix });
        }
        Ok(Some(range))
    }

    /// Whether the range is of IPv6 addresses (written in brackets when a
    /// port follows it).
    pub(super) fn is_v6(&self) -> bool {
        self.network.is_ipv6()
    }

    pub(super) fn contains(&self, address: IpAddr) -> bool {
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

    /// Whether every address of `narrower` is in this range.
    pub(super) fn covers(&self, narrower: &Range) -> bool {
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
pub(super) fn special_range(address: IpAddr) -> Option<&'static str> {
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
