//! W3C Trace Context: the `traceparent` a request carries (its `trace`
//! field), a run's environment holds (`TRACEPARENT`), and a TOOL or MCP
//! call passes on — `00-{trace id}-{parent id}-{flags}`.
//!
//! Parsing follows the specification's rules for a receiver: lowercase
//! hex only, neither id all zeros, version `ff` invalid, a higher version
//! read by its first four fields; anything invalid is ignored whole (the
//! kernel then starts a trace of its own).

use std::fmt;

/// A span's place in a trace: the ids to pass on, and whether it is
/// sampled.
///
/// ```
/// use agentos_proto::TraceContext;
///
/// let value = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// let context = TraceContext::parse(value).expect("a valid traceparent");
/// assert!(context.sampled);
/// assert_eq!(context.to_string(), value);
/// // Uppercase hex is not a traceparent a receiver may use.
/// assert_eq!(TraceContext::parse(&value.to_uppercase()), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// The trace every span of it shares.
    pub trace_id: [u8; 16],
    /// The span this context names (the parent of what continues it).
    pub span_id: [u8; 8],
    /// Whether the trace is recorded (flag bit 0).
    pub sampled: bool,
}

impl TraceContext {
    /// Reads a `traceparent` header value; `None` when it is not one a
    /// receiver may use.
    pub fn parse(value: &str) -> Option<TraceContext> {
        let value = value.trim();
        let mut fields = value.split('-');
        let version = fields.next()?;
        let trace_id = fields.next()?;
        let span_id = fields.next()?;
        let flags = fields.next()?;
        if version.len() != 2 || !is_lower_hex(version) || version == "ff" {
            return None;
        }
        // Version 00 has exactly four fields; a later one may add more.
        if version == "00" && fields.next().is_some() {
            return None;
        }
        if trace_id.len() != 32 || span_id.len() != 16 || flags.len() != 2 {
            return None;
        }
        let trace_id: [u8; 16] = hex_bytes(trace_id)?;
        let span_id: [u8; 8] = hex_bytes(span_id)?;
        let [flags] = hex_bytes::<1>(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// A context for a new span under this one: the same trace, `span_id`
    /// its own.
    pub fn child(&self, span_id: [u8; 8]) -> TraceContext {
        TraceContext { span_id, ..*self }
    }
}

/// The `traceparent` value, always as version 00.
impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for byte in self.trace_id {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("-")?;
        for byte in self.span_id {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "-{:02x}", u8::from(self.sampled))
    }
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != N * 2 || !is_lower_hex(text) {
        return None;
    }
    let mut out = [0u8; N];
    for (index, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[index * 2..index * 2 + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips() {
        let context = TraceContext::parse(EXAMPLE).unwrap();
        assert!(context.sampled);
        assert_eq!(
            context.span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(context.to_string(), EXAMPLE);
        let unsampled = TraceContext::parse(&EXAMPLE.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled);
        // Flags are bits: 03 is sampled (and random).
        assert!(
            TraceContext::parse(&EXAMPLE.replace("-01", "-03"))
                .unwrap()
                .sampled
        );
    }

    #[test]
    fn what_a_receiver_must_ignore_is_ignored() {
        for bad in [
            "",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bg-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields_and_passed_on_as_00() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert_eq!(TraceContext::parse(later).unwrap().to_string(), EXAMPLE);
    }
}
