//! The kernel's own event sources, and the mio tokens they are registered
//! under: each subsystem that watches descriptors of its own gets a range
//! of tokens, laid out one after another from the reactor's base, and an
//! event's token says whose it is.

use std::ops::Range;

use mio::Token;

use crate::exec;
use crate::sandbox::runtime;
use crate::tools::servers;

/// A subsystem with event sources of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The sandbox runtime: pidfds, status pipes, OOM watches, doors.
    Sandboxes,
    /// EXEC: exec hosts' channels, run children's sockets and pipes.
    Exec,
    /// The MCP servers' pipes.
    Tools,
}

/// Each source's range of tokens.
#[derive(Clone, Debug)]
pub struct TokenRanges {
    ranges: Vec<(Source, Range<usize>)>,
}

impl TokenRanges {
    /// The ranges of every source, from `base` on, each as wide as its
    /// subsystem asks.
    pub fn from(base: usize) -> TokenRanges {
        let spans = [
            (Source::Sandboxes, runtime::TOKEN_SPAN),
            (Source::Exec, exec::TOKEN_SPAN),
            (Source::Tools, servers::TOKEN_SPAN),
        ];
        let mut next = base;
        let ranges = spans
            .into_iter()
            .map(|(source, span)| {
                let range = next..next + span;
                next = range.end;
                (source, range)
            })
            .collect();
        TokenRanges { ranges }
    }

    /// The first token of `source`'s range.
    pub fn first(&self, source: Source) -> usize {
        self.ranges
            .iter()
            .find(|(s, _)| *s == source)
            .map_or(0, |(_, range)| range.start)
    }

    /// Whose source `token` is, if it is one of the kernel's.
    pub fn source_of(&self, token: Token) -> Option<Source> {
        self.ranges
            .iter()
            .find(|(_, range)| range.contains(&token.0))
            .map(|(source, _)| *source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_each_other_from_the_base_and_name_their_source() {
        let ranges = TokenRanges::from(10);
        assert_eq!(ranges.first(Source::Sandboxes), 10);
        assert_eq!(ranges.first(Source::Exec), 10 + runtime::TOKEN_SPAN);
        assert_eq!(
            ranges.first(Source::Tools),
            10 + runtime::TOKEN_SPAN + exec::TOKEN_SPAN
        );
        assert_eq!(ranges.source_of(Token(9)), None);
        assert_eq!(ranges.source_of(Token(10)), Some(Source::Sandboxes));
        let exec = ranges.first(Source::Exec);
        assert_eq!(ranges.source_of(Token(exec - 1)), Some(Source::Sandboxes));
        assert_eq!(ranges.source_of(Token(exec)), Some(Source::Exec));
        let tools = ranges.first(Source::Tools);
        assert_eq!(ranges.source_of(Token(tools)), Some(Source::Tools));
        assert_eq!(ranges.source_of(Token(tools + servers::TOKEN_SPAN)), None);
    }
}
