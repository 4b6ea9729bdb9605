//! A run's output streams, each captured in fixed memory however much is
//! printed: the first half of the cap is kept as it arrives, the last half
//! as a ring of the latest bytes, and what fell between them is counted and
//! named by one marker line.

use std::collections::VecDeque;

/// Which of a run's output streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    /// Both, in index order.
    pub const BOTH: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    /// Its place in per-stream arrays.
    pub fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

/// One captured stream.
#[derive(Debug)]
pub struct Capture {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    /// Bytes received in all.
    total: u64,
}

/// A finished stream: its text, and the bytes dropped from its middle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Captured {
    /// The head, the marker line if anything was dropped, and the tail.
    pub text: String,
    /// Bytes dropped between head and tail.
    pub dropped: u64,
}

impl Capture {
    /// A stream keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Capture {
        let head_cap = cap / 2;
        Capture {
            head_cap,
            tail_cap: cap - head_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Takes in bytes as they arrive.
    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let taken = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..taken]);
            bytes = &bytes[taken..];
        }
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    /// Bytes received so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The last `max` bytes received so far (invalid UTF-8 replaced): what
    /// a task's progress shows while it runs.
    pub fn latest(&self, max: usize) -> String {
        let from_tail = self.tail.len().min(max);
        let from_head = (max - from_tail).min(self.head.len());
        let mut bytes = self.head[self.head.len() - from_head..].to_vec();
        bytes.extend(self.tail.iter().skip(self.tail.len() - from_tail));
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The stream as the reply gives it (invalid UTF-8 replaced).
    pub fn finish(self) -> Captured {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let dropped = self.total - kept;
        let mut bytes = self.head;
        if dropped > 0 {
            if bytes.last().is_some_and(|b| *b != b'\n') {
                bytes.push(b'\n');
            }
            bytes.extend_from_slice(format!("[... {dropped} bytes dropped ...]\n").as_bytes());
        }
        bytes.extend(self.tail);
        Captured {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_under_the_cap_is_kept_whole() {
        let mut capture = Capture::new(64);
        capture.push(b"hello ");
        capture.push(b"world\n");
        assert_eq!(
            capture.finish(),
            Captured {
                text: "hello world\n".into(),
                dropped: 0
            }
        );
    }

    #[test]
    fn output_over_the_cap_keeps_head_and_tail_and_says_what_was_dropped() {
        let mut capture = Capture::new(20);
        let lines: String = (0..100).map(|n| format!("{n:03}\n")).collect();
        // In uneven pieces, as a pipe delivers them.
        for piece in lines.as_bytes().chunks(7) {
            capture.push(piece);
        }
        let captured = capture.finish();
        assert_eq!(captured.dropped, 400 - 20);
        assert_eq!(
            captured.text,
            "000\n001\n00\n[... 380 bytes dropped ...]\n7\n098\n099\n"
        );
    }

    #[test]
    fn one_huge_write_keeps_its_own_tail() {
        let mut capture = Capture::new(10);
        capture.push(&[b'a'; 1000]);
        capture.push(b"xyz");
        let captured = capture.finish();
        assert_eq!(captured.dropped, 1003 - 10);
        assert!(captured
            .text
            .starts_with("aaaaa\n[... 993 bytes dropped ...]\n"));
        assert!(captured.text.ends_with("aaxyz"), "{}", captured.text);
    }

    #[test]
    fn memory_stays_within_the_cap_however_much_is_printed() {
        let mut capture = Capture::new(1024);
        for _ in 0..10_000 {
            capture.push(&[b'x'; 4096]);
        }
        assert!(capture.head.capacity() <= 1024);
        assert!(capture.tail.len() <= 512);
        assert_eq!(capture.total(), 10_000 * 4096);
    }

    #[test]
    fn the_latest_bytes_come_from_head_and_tail_alike() {
        let mut capture = Capture::new(8);
        capture.push(b"ab");
        assert_eq!(capture.latest(3), "ab");
        capture.push(b"cdefghij");
        assert_eq!(capture.latest(3), "hij");
        assert_eq!(capture.latest(100), "abcdghij");
    }

    #[test]
    fn invalid_utf8_is_replaced_not_refused() {
        let mut capture = Capture::new(64);
        capture.push(&[0xff, b'o', b'k']);
        assert_eq!(capture.finish().text, "\u{fffd}ok");
    }
}
