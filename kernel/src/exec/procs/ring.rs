//! A process's output as the kernel keeps it: chunks of its streams in
//! the order they were read, offsets counted over all of them (so
//! stdout and stderr keep their order as one reader sees it), at most a
//! fixed number of bytes, the oldest dropped and counted.

use std::collections::VecDeque;

use agentos_proto::payload::OutputStream;

/// A process's output, the latest `cap` bytes of it.
#[derive(Debug)]
pub struct Ring {
    chunks: VecDeque<(OutputStream, Vec<u8>)>,
    /// The offset of the first byte kept.
    start: u64,
    /// Bytes kept.
    held: usize,
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
    /// Empty, keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Ring {
        Ring {
            chunks: VecDeque::new(),
            start: 0,
            held: 0,
            cap: cap.max(1),
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

    /// Adds what `stream` printed, dropping the oldest bytes beyond the
    /// cap (of a chunk that alone is larger, all but its tail).
    pub fn push(&mut self, stream: OutputStream, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        match self.chunks.back_mut() {
            Some((last, held)) if *last == stream => held.extend_from_slice(bytes),
            _ => self.chunks.push_back((stream, bytes.to_vec())),
        }
        self.held += bytes.len();
        while self.held > self.cap {
            let over = self.held - self.cap;
            let Some((_, front)) = self.chunks.front_mut() else {
                break;
            };
            if front.len() <= over {
                self.held -= front.len();
                self.start += front.len() as u64;
                self.chunks.pop_front();
            } else {
                front.drain(..over);
                self.held -= over;
                self.start += over as u64;
            }
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
        let mut ring = Ring::new(4);
        ring.push(Stdout, b"abc");
        ring.push(Stderr, b"def");
        assert_eq!((ring.dropped(), ring.end()), (2, 6));
        let read = ring.read(0, 100);
        assert_eq!(joined(&read), b"cdef");
        assert_eq!((read.offset, read.dropped), (6, 2));
        ring.push(Stdout, b"0123456789");
        assert_eq!(joined(&ring.read(0, 100)), b"6789");
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
            pushes in proptest::collection::vec((any::<bool>(), proptest::collection::vec(any::<u8>(), 0..40)), 0..40),
            cap in 1usize..200,
            max in 1usize..50,
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
