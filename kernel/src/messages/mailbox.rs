//! One mailbox: messages in the order they came, bounded by count and by
//! bytes, so a flood into it is refused (`busy`) instead of growing the
//! kernel's memory.

use std::collections::VecDeque;
use std::time::Instant;

use agentos_proto::payload::{ReceivedMessage, SenderKind};

/// The most messages one mailbox holds.
pub const MAX_MESSAGES: usize = 1000;
/// The most bytes one mailbox holds (messages as JSON, and what the
/// kernel keeps with each).
pub const MAX_BYTES: usize = 4 << 20;
/// What the kernel keeps with each message besides the message itself.
const LETTER_OVERHEAD: usize = 96;

/// Who sent a message, as the kernel knew it when it was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct From {
    /// Its id.
    pub id: u32,
    /// Its registered name, else an agent's SPAWN name.
    pub name: Option<String>,
    /// What it is.
    pub kind: SenderKind,
    /// For a run of an agent: the agent.
    pub run_of: Option<u32>,
}

/// A message waiting.
#[derive(Debug)]
struct Letter {
    from: From,
    message: serde_json::Value,
    bytes: usize,
    at: Instant,
}

/// A full mailbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full {
    /// Messages waiting.
    pub messages: usize,
    /// Bytes held.
    pub bytes: usize,
}

/// A mailbox.
#[derive(Debug, Default)]
pub struct Mailbox {
    letters: VecDeque<Letter>,
    bytes: usize,
}

impl Mailbox {
    /// Keeps `message` (`message_bytes` long as JSON) from `from`, unless
    /// that would take the mailbox over its bounds.
    pub fn put(
        &mut self,
        from: From,
        message: serde_json::Value,
        message_bytes: usize,
        now: Instant,
    ) -> Result<(), Full> {
        let bytes = message_bytes
            .saturating_add(from.name.as_ref().map_or(0, String::len))
            .saturating_add(LETTER_OVERHEAD);
        if self.letters.len() >= MAX_MESSAGES || self.bytes.saturating_add(bytes) > MAX_BYTES {
            return Err(Full {
                messages: self.letters.len(),
                bytes: self.bytes,
            });
        }
        self.bytes += bytes;
        self.letters.push_back(Letter {
            from,
            message,
            bytes,
            at: now,
        });
        Ok(())
    }

    /// Takes the oldest `max` messages.
    pub fn take(&mut self, max: usize, now: Instant) -> Vec<ReceivedMessage> {
        let n = max.min(self.letters.len());
        self.letters
            .drain(..n)
            .map(|letter| {
                self.bytes -= letter.bytes;
                ReceivedMessage {
                    from: letter.from.id,
                    from_id: letter.from.id,
                    from_name: letter.from.name,
                    from_kind: letter.from.kind,
                    run_of: letter.from.run_of,
                    message: letter.message,
                    age_ms: u64::try_from(now.saturating_duration_since(letter.at).as_millis())
                        .unwrap_or(u64::MAX),
                }
            })
            .collect()
    }

    /// How many messages are waiting.
    pub fn len(&self) -> usize {
        self.letters.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.letters.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from() -> From {
        From {
            id: 7,
            name: Some("w".into()),
            kind: SenderKind::Agent,
            run_of: None,
        }
    }

    #[test]
    fn a_full_mailbox_refuses_and_frees_room_as_it_is_read() {
        let now = Instant::now();
        let mut mailbox = Mailbox::default();
        for _ in 0..MAX_MESSAGES {
            mailbox.put(from(), serde_json::json!(1), 1, now).unwrap();
        }
        let full = mailbox
            .put(from(), serde_json::json!(1), 1, now)
            .unwrap_err();
        assert_eq!(full.messages, MAX_MESSAGES);
        let taken = mailbox.take(10, now);
        assert_eq!(taken.len(), 10);
        assert_eq!((taken[0].from, taken[0].from_id), (7, 7));
        assert!(mailbox.put(from(), serde_json::json!(1), 1, now).is_ok());
        assert_eq!(mailbox.len(), MAX_MESSAGES - 9);
    }

    #[test]
    fn bytes_are_bounded_too() {
        let now = Instant::now();
        let mut mailbox = Mailbox::default();
        let big = 64 << 10;
        let mut kept = 0;
        while mailbox.put(from(), serde_json::json!(0), big, now).is_ok() {
            kept += 1;
        }
        assert!(kept * big <= MAX_BYTES && kept < MAX_MESSAGES, "{kept}");
        let all = mailbox.take(usize::MAX, now);
        assert_eq!(all.len(), kept);
        assert_eq!(mailbox.bytes, 0);
        assert!(mailbox.is_empty());
    }
}
