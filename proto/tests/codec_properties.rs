//! Property tests of the frame codec: whatever the frames and however the
//! byte stream is split, decoding gives back exactly what was encoded, and no
//! byte sequence makes the decoder panic or buffer beyond one frame.

use agentos_proto::{encode_frame, DecodeError, FrameDecoder, Header, Opcode, HEADER_LEN};
use proptest::prelude::*;

const LIMIT: u64 = 4096;

#[derive(Clone, Debug)]
struct TestFrame {
    agent_id: u32,
    opcode: u8,
    payload: Vec<u8>,
}

fn frame_strategy() -> impl Strategy<Value = TestFrame> {
    (
        any::<u32>(),
        any::<u8>(),
        prop::collection::vec(any::<u8>(), 0..=LIMIT as usize),
    )
        .prop_map(|(agent_id, opcode, payload)| TestFrame {
            agent_id,
            opcode,
            payload,
        })
}

fn decode_all(decoder: &mut FrameDecoder, out: &mut Vec<TestFrame>) -> Result<(), DecodeError> {
    while let Some(frame) = decoder.next_frame()? {
        out.push(TestFrame {
            agent_id: frame.header.agent_id,
            opcode: frame.header.opcode.0,
            payload: frame.payload.to_vec(),
        });
    }
    Ok(())
}

proptest! {
    #[test]
    fn header_round_trips(agent_id in any::<u32>(), opcode in any::<u8>(), len in any::<u64>()) {
        let header = Header { agent_id, opcode: Opcode(opcode), payload_len: len };
        prop_assert_eq!(Header::decode(&header.encode()), Ok(header));
    }

    #[test]
    fn frames_survive_arbitrary_splits(
        frames in prop::collection::vec(frame_strategy(), 1..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let stream: Vec<u8> = frames
            .iter()
            .flat_map(|f| encode_frame(Opcode(f.opcode), f.agent_id, &f.payload))
            .collect();
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
        points.push(0);
        points.push(stream.len());
        points.sort_unstable();

        let mut decoder = FrameDecoder::new(LIMIT);
        let mut decoded = Vec::new();
        for pair in points.windows(2) {
            decoder.extend_from_slice(&stream[pair[0]..pair[1]]);
            decode_all(&mut decoder, &mut decoded).unwrap();
        }
        prop_assert_eq!(decoded.len(), frames.len());
        for (got, want) in decoded.iter().zip(&frames) {
            prop_assert_eq!(got.agent_id, want.agent_id);
            prop_assert_eq!(got.opcode, want.opcode);
            prop_assert_eq!(&got.payload, &want.payload);
        }
        prop_assert!(!decoder.is_mid_frame());
    }

    #[test]
    fn reading_through_read_buf_matches_extend(
        frames in prop::collection::vec(frame_strategy(), 1..6),
        chunk in 1usize..5000,
    ) {
        let stream: Vec<u8> = frames
            .iter()
            .flat_map(|f| encode_frame(Opcode(f.opcode), f.agent_id, &f.payload))
            .collect();
        let mut decoder = FrameDecoder::new(LIMIT);
        let mut decoded = Vec::new();
        let mut rest = &stream[..];
        while !rest.is_empty() {
            let window = decoder.read_buf();
            let n = window.len().min(chunk).min(rest.len());
            window[..n].copy_from_slice(&rest[..n]);
            decoder.advance(n);
            rest = &rest[n..];
            decode_all(&mut decoder, &mut decoded).unwrap();
        }
        prop_assert_eq!(decoded.len(), frames.len());
    }

    #[test]
    fn arbitrary_bytes_never_panic_or_overallocate(
        bytes in prop::collection::vec(any::<u8>(), 0..20_000),
        chunk in 1usize..3000,
    ) {
        let mut decoder = FrameDecoder::new(LIMIT);
        let mut decoded = Vec::new();
        for piece in bytes.chunks(chunk) {
            decoder.extend_from_slice(piece);
            if decode_all(&mut decoder, &mut decoded).is_err() {
                break;
            }
            // One frame of the limit plus a read window, never more.
            prop_assert!(decoder.capacity() <= 2 * (HEADER_LEN + LIMIT as usize) + 64 * 1024);
        }
    }

    #[test]
    fn any_wrong_magic_is_rejected(magic in any::<u32>().prop_filter("not magic", |m| *m != agentos_proto::MAGIC)) {
        let mut decoder = FrameDecoder::new(LIMIT);
        decoder.extend_from_slice(&magic.to_le_bytes());
        prop_assert_eq!(decoder.next_frame(), Err(DecodeError::BadMagic { found: magic }));
    }

    #[test]
    fn any_length_over_the_limit_is_rejected_before_payload(len in (LIMIT + 1)..=u64::MAX) {
        let header = Header { agent_id: 0, opcode: Opcode::NOOP, payload_len: len };
        let mut decoder = FrameDecoder::new(LIMIT);
        decoder.extend_from_slice(&header.encode());
        let is_too_large = matches!(decoder.next_frame(), Err(DecodeError::PayloadTooLarge { .. }));
        prop_assert!(is_too_large);
    }
}
