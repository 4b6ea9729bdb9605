//! A process's output as the kernel keeps it: chunks of its streams in
//! the order they were read, offsets counted over all of them (so
//! stdout and stderr keep their order as one reader sees it), at most a
//! fixed number of bytes, the oldest dropped and counted.

use std::collections::VecDeque;

use agentos_proto::payload::OutputStream;

/// Bytes one chunk holds at most: dropping the oldest bytes moves at
/// most this many.
const CHUNK_BYTES: usize = 16 << 10;
/// What a chunk costs beyond its bytes, as the cap counts it: output
/// written a byte at a time to each stream in turn costs its chunks, not
/// a byte each.
const CHUNK_COST: usize = 64;

/// A process's output: the latest of it, within a cap.
#[derive(Debug)]
pub struct Ring {
    chunks: VecDeque<(OutputStream, Vec<u8>)>,
    /// The offset of the first byte kept.
    start: u64,
    /// Bytes kept.
    held: usize,
    /// What the chunks may cost in all: their bytes, and [`CHUNK_COST`]
    /// each.
    cap: usize,
}

/// What a read of the ring found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Read {
    /// The chunks, in order.
    pub chunks: Vec<(OutputStream, Vec<u8>)>,
    /// The offset after the last one: the next read's `after`.
    pub offset: u64,
    /// Bytes between `after` and the first chunk that are no longer kept.
    pub dropped: u64,
}

impl Ring {
    /// Empty, its chunks costing at most `cap` (a chunk's worth at
    /// least).
    pub fn new(cap: usize) -> Ring {
        Ring {
            chunks: VecDeque::new(),
            start: 0,
            held: 0,
            cap: cap.max(CHUNK_BYTES + CHUNK_COST),
        }
    }

    /// The offset after the last byte: all the process has printed.
    pub fn end(&self) -> u64 {
        self.start + self.held as u64
    }

    /// Bytes dropped so far, oldest first.
    pub fn dropped(&self) -> u64 {
        self.start
    }

    /// What its chunks cost.
    fn cost(&self) -> usize {
        self.held + self.chunks.len() * CHUNK_COST
    }

    /// Adds what `stream` printed, dropping the oldest bytes beyond the
    /// cap.
    pub fn push(&mut self, stream: OutputStream, bytes: &[u8]) {
        for part in bytes.chunks(CHUNK_BYTES) {
            match self.chunks.back_mut() {
                Some((last, held)) if *last == stream && held.len() + part.len() <= CHUNK_BYTES => {
                    held.extend_from_slice(part);
                }
                _ => self.chunks.push_back((stream, part.to_vec())),
            }
            self.held += part.len();
        }
        while self.cost() > self.cap {
            let over = self.cost() - self.cap;
            let Some((_, front)) = self.chunks.front_mut() else {
                break;
            };
            let dropped = if front.len() <= over {
                let len = front.len();
                self.chunks.pop_front();
                len
            } else {
                front.drain(..over);
                over
            };
            self.held -= dropped;
            self.start += dropped as u64;
        }
    }

    /// At most `max` bytes from offset `after` on (the oldest kept if it
    /// is older, counting what was dropped between; the end if later).
    pub fn read(&self, after: u64, max: usize) -> Read {
        let from = after.clamp(self.start, self.end());
        let dropped = from - after.min(from);
        let mut read = Read {
            chunks: Vec::new(),
            offset: from,
            dropped,
        };
        let mut at = self.start;
        let mut room = max;
        for (stream, bytes) in &self.chunks {
            let chunk_end = at + bytes.len() as u64;
            if chunk_end > from && room > 0 {
                let skip = from.saturating_sub(at) as usize;
                let take = (bytes.len() - skip).min(room);
                read.chunks
                    .push((*stream, bytes[skip..skip + take].to_vec()));
                read.offset += take as u64;
                room -= take;
            }
            at = chunk_end;
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use OutputStream::{Stderr, Stdout};

    fn joined(read: &Read) -> Vec<u8> {
        read.chunks.iter().flat_map(|(_, b)| b.clone()).collect()
    }

    #[test]
    fn streams_keep_their_order_and_a_stream_run_is_one_chunk() {
        let mut ring = Ring::new(100);
        ring.push(Stdout, b"a");
        ring.push(Stdout, b"b");
        ring.push(Stderr, b"E");
        ring.push(Stdout, b"c");
        let read = ring.read(0, 100);
        let streams: Vec<_> = read.chunks.iter().map(|(s, b)| (*s, b.clone())).collect();
        assert_eq!(
            streams,
            vec![
                (Stdout, b"ab".to_vec()),
                (Stderr, b"E".to_vec()),
                (Stdout, b"c".to_vec())
            ]
        );
        assert_eq!((read.offset, read.dropped), (4, 0));
        assert_eq!(
            ring.read(2, 100).chunks,
            vec![(Stderr, b"E".to_vec()), (Stdout, b"c".to_vec())]
        );
        assert_eq!(
            ring.read(4, 100),
            Read {
                chunks: vec![],
                offset: 4,
                dropped: 0
            }
        );
        assert_eq!(
            ring.read(99, 100).offset,
            4,
            "a later offset reads from the end"
        );
    }

    #[test]
    fn the_oldest_bytes_go_beyond_the_cap_and_are_counted() {
        let cap = CHUNK_BYTES + CHUNK_COST;
        let mut ring = Ring::new(cap);
        ring.push(Stdout, &vec![b'a'; CHUNK_BYTES - 2]);
        ring.push(Stderr, b"def");
        // Two chunks: the first gives up what the second costs.
        assert_eq!(ring.end(), CHUNK_BYTES as u64 + 1);
        assert_eq!(ring.dropped(), 1 + CHUNK_COST as u64);
        let read = ring.read(0, 1 << 20);
        assert_eq!(read.dropped, ring.dropped());
        assert!(joined(&read).ends_with(b"aadef"));
        ring.push(Stdout, &vec![b'z'; 3 * CHUNK_BYTES]);
        let all = joined(&ring.read(0, 1 << 20));
        assert_eq!(all, vec![b'z'; CHUNK_BYTES]);
        assert!(ring.cost() <= cap);
    }

    #[test]
    fn a_byte_at_a_time_to_each_stream_costs_its_chunks() {
        let cap = 4 * (CHUNK_BYTES + CHUNK_COST);
        let mut ring = Ring::new(cap);
        for i in 0..100_000u32 {
            ring.push(if i % 2 == 0 { Stdout } else { Stderr }, b"x");
        }
        assert!(ring.cost() <= cap);
        assert_eq!(ring.chunks.len() * (1 + CHUNK_COST), ring.cost());
        assert_eq!(ring.end(), 100_000);
    }

    #[test]
    fn a_read_takes_at_most_its_bytes() {
        let mut ring = Ring::new(100);
        ring.push(Stdout, b"0123456789");
        let read = ring.read(3, 4);
        assert_eq!((joined(&read), read.offset), (b"3456".to_vec(), 7));
    }

    proptest! {
        #[test]
        fn reads_in_turn_give_back_the_input_less_what_was_dropped(
            pushes in proptest::collection::vec((any::<bool>(), proptest::collection::vec(any::<u8>(), 0..5_000)), 0..24),
            cap in 1usize..(3 * CHUNK_BYTES),
            max in 1usize..50_000,
        ) {
            let mut ring = Ring::new(cap);
            let mut all = Vec::new();
            for (err, bytes) in &pushes {
                ring.push(if *err { Stderr } else { Stdout }, bytes);
                all.extend_from_slice(bytes);
            }
            let mut after = 0;
            let mut got = Vec::new();
            let mut dropped = 0;
            loop {
                let read = ring.read(after, max);
                dropped += read.dropped;
                if read.chunks.is_empty() {
                    prop_assert_eq!(read.offset, ring.end());
                    break;
                }
                got.extend(joined(&read));
                after = read.offset;
            }
            prop_assert_eq!(dropped, ring.dropped());
            prop_assert_eq!(&got[..], &all[dropped as usize..]);
        }
    }
}
