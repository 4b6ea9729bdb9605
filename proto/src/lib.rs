//! The AgentOS wire protocol.
//!
//! Every message in both directions is a 17-byte little-endian header
//! ([`Header`]) followed by a payload. This crate is the protocol's single
//! Rust implementation: the frame codec ([`FrameDecoder`], [`encode_frame`]),
//! the opcodes ([`Opcode`]), the error model ([`ErrorCode`], [`ErrorReply`]),
//! typed JSON payloads for every opcode ([`payload`]), the socket path rule
//! ([`socket_path`]), the W3C trace context a request's `trace` field
//! carries ([`TraceContext`]) and a small blocking [`Client`].
//!
//! It has no threads and no global state.

mod client;
mod error;
mod frame;
mod opcode;
pub mod payload;
pub mod socket_path;
mod trace_context;

pub use client::{Client, ClientError, Reply};
pub use error::{ErrorCode, ErrorReply};
pub use frame::{
    encode_frame, encode_frame_into, DecodeError, Frame, FrameDecoder, Header,
    DEFAULT_MAX_REQUEST_BYTES, HEADER_LEN, MAGIC, MAX_REPLY_BYTES,
};
pub use opcode::Opcode;
pub use trace_context::TraceContext;

/// The wire protocol version reported by HELLO.
pub const PROTOCOL_VERSION: u32 = 1;
