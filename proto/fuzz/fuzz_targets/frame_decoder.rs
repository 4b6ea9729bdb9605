//! Fuzzes the frame decoder the way the kernel uses it: bytes arrive in
//! arbitrary pieces, frames are taken out as they complete. The first two
//! input bytes choose the payload limit and the piece size; the decoder
//! must never panic, never buffer beyond one frame of the limit plus a read
//! window, and, once failed, stay failed.

#![no_main]

use agentos_proto::FrameDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [limit_seed, piece_seed, stream @ ..] = data else {
        return;
    };
    let limit = u64::from(*limit_seed) * 97;
    let piece = usize::from(*piece_seed).max(1);
    let mut decoder = FrameDecoder::new(limit);
    let mut failed = false;
    for chunk in stream.chunks(piece) {
        let window = decoder.read_buf();
        let n = window.len().min(chunk.len());
        window[..n].copy_from_slice(&chunk[..n]);
        decoder.advance(n);
        decoder.extend_from_slice(&chunk[n..]);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    assert!(!failed, "a frame after a fatal error");
                    assert_eq!(frame.payload.len() as u64, frame.header.payload_len);
                    assert!(frame.header.payload_len <= limit);
                }
                Ok(None) => break,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(decoder.capacity() <= 2 * (17 + limit as usize) + 64 * 1024);
    }
});
