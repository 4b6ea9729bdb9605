//! Connect's protocol as E2B's SDKs speak it: JSON only. A unary call is
//! a bare JSON message each way (`application/json`), its errors
//! `{"code": "not_found", "message"}` with the code's HTTP status. A
//! stream is `application/connect+json`: 5-byte envelopes (a flags byte,
//! a big-endian length) around each message, always 200, ending with an
//! end-stream envelope (flag 2) that carries the error if there is one.
//!
//! The SDKs encode proto3's JSON: names in lowerCamelCase, bytes as
//! base64, enums by name, defaults left out, unknown fields ignored. The
//! messages here are written to that mapping by hand (they are few and
//! small), so no protobuf runtime stands between the wire and the kernel.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use agentos_http::Body;
use agentos_http::RequestBody;
use bytes::{Buf, Bytes, BytesMut};
use http::{header, HeaderValue, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, Limited};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::answer::ApiError;

/// The largest message taken or sent: envd's own bound.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Messages a stream holds unsent before its producer waits.
const STREAM_BACKLOG: usize = 16;

/// The flag of an end-stream envelope.
const END_STREAM: u8 = 0x02;
/// The flag of a compressed message, which nothing here sends or takes.
const COMPRESSED: u8 = 0x01;

/// A Connect error: its code (snake_case, as the wire has it) and
/// message.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectError {
    pub code: &'static str,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: &'static str, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> ConnectError {
        ConnectError::new("invalid_argument", message)
    }

    /// The code's HTTP status, for a unary answer.
    pub fn status(&self) -> StatusCode {
        match self.code {
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            "permission_denied" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<ApiError> for ConnectError {
    /// The kernel's refusal, as the face words it, in Connect's codes.
    fn from(err: ApiError) -> ConnectError {
        let code = match err.status {
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "invalid_argument",
            StatusCode::UNAUTHORIZED => "unauthenticated",
            StatusCode::FORBIDDEN => "permission_denied",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::CONFLICT => "already_exists",
            StatusCode::TOO_MANY_REQUESTS => "resource_exhausted",
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => "unavailable",
            StatusCode::GATEWAY_TIMEOUT => "deadline_exceeded",
            StatusCode::NOT_IMPLEMENTED => "unimplemented",
            _ => "internal",
        };
        ConnectError::new(code, err.message)
    }
}

/// A unary answer: `value`, or the error with its status.
pub fn unary<T: Serialize>(answer: Result<T, ConnectError>) -> Response<Body> {
    let (status, body) = match answer {
        Ok(value) => (StatusCode::OK, serde_json::to_vec(&value)),
        Err(err) => (err.status(), serde_json::to_vec(&err)),
    };
    let mut response = Response::new(Full::new(Bytes::from(body.unwrap_or_default())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A unary request's message.
pub async fn unary_request<T: DeserializeOwned>(body: RequestBody) -> Result<T, ConnectError> {
    let bytes = Limited::new(body, MAX_MESSAGE_BYTES)
        .collect()
        .await
        .map_err(|err| ConnectError::invalid(format!("reading the request: {err}")))?
        .to_bytes();
    crate::answer::json_or_empty(&bytes)
        .map_err(|err| ConnectError::invalid(format!("the request message: {err}")))
}

/// A message's JSON read as `T`.
fn message_of<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(bytes)
        .map_err(|err| ConnectError::invalid(format!("the request message: {err}")))
}

/// One envelope around `payload`.
fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(5 + payload.len());
    framed.extend_from_slice(&[flags]);
    framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    framed.extend_from_slice(payload);
    framed.freeze()
}

/// Reads a stream request's envelopes as they come.
pub struct EnvelopeReader {
    body: RequestBody,
    buffered: BytesMut,
    ended: bool,
}

impl EnvelopeReader {
    pub fn new(body: RequestBody) -> EnvelopeReader {
        EnvelopeReader {
            body,
            buffered: BytesMut::new(),
            ended: false,
        }
    }

    /// The next message, or none once the client closed its side.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ConnectError> {
        loop {
            if self.buffered.len() >= 5 {
                let flags = self.buffered[0];
                let length = u32::from_be_bytes([
                    self.buffered[1],
                    self.buffered[2],
                    self.buffered[3],
                    self.buffered[4],
                ]) as usize;
                if flags & COMPRESSED != 0 {
                    return Err(ConnectError::invalid(
                        "a compressed message, but no compression was agreed",
                    ));
                }
                if length > MAX_MESSAGE_BYTES {
                    return Err(ConnectError::new(
                        "resource_exhausted",
                        format!("a message of {length} bytes; at most {MAX_MESSAGE_BYTES}"),
                    ));
                }
                if self.buffered.len() >= 5 + length {
                    self.buffered.advance(5);
                    let payload = self.buffered.split_to(length);
                    if flags & END_STREAM != 0 {
                        return Ok(None);
                    }
                    return message_of(&payload).map(Some);
                }
            }
            if self.ended {
                if self.buffered.is_empty() {
                    return Ok(None);
                }
                return Err(ConnectError::invalid("the request ended inside a message"));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffered.extend_from_slice(&data);
                    }
                }
                Some(Err(err)) => {
                    return Err(ConnectError::new(
                        "canceled",
                        format!("reading the request: {err}"),
                    ))
                }
                None => self.ended = true,
            }
        }
    }

    /// Reads what is left of a one-message request (its last chunk, most
    /// often), for at most `within`: a request read to its end leaves its
    /// connection to be used again.
    pub async fn finish(mut self, within: std::time::Duration) {
        let rest = async {
            while !self.ended && self.buffered.len() <= MAX_MESSAGE_BYTES {
                match self.body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            self.buffered.extend_from_slice(&data);
                        }
                    }
                    Some(Err(_)) | None => self.ended = true,
                }
            }
        };
        let _ = tokio::time::timeout(within, rest).await;
    }
}

/// The sending side of a streamed answer.
pub struct StreamSender {
    sender: mpsc::Sender<Bytes>,
}

/// The end-stream message.
#[derive(Serialize)]
struct EndStream<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a ConnectError>,
}

impl StreamSender {
    /// Sends one message; false once the client has gone.
    pub async fn send(&self, message: &impl Serialize) -> bool {
        let Ok(payload) = serde_json::to_vec(message) else {
            return false;
        };
        self.sender.send(envelope(0, &payload)).await.is_ok()
    }

    /// Ends the stream, with `error` if it failed.
    pub async fn end(&self, error: Option<ConnectError>) {
        let end = EndStream {
            error: error.as_ref(),
        };
        let payload = serde_json::to_vec(&end).unwrap_or_else(|_| b"{}".to_vec());
        let _ = self.sender.send(envelope(END_STREAM, &payload)).await;
    }

    /// Resolves once the client has gone.
    pub async fn closed(&self) {
        self.sender.closed().await;
    }
}

/// A streamed answer, and the sender its producer writes to.
pub fn stream() -> (StreamSender, Response<Body>) {
    let (sender, receiver) = mpsc::channel(STREAM_BACKLOG);
    let mut response = Response::new(ChannelBody { receiver }.boxed());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    (StreamSender { sender }, response)
}

/// A stream answered with `error` alone (Connect streams are 200 even
/// when they fail).
pub fn stream_error(error: ConnectError) -> Response<Body> {
    let payload = serde_json::to_vec(&EndStream {
        error: Some(&error),
    })
    .unwrap_or_default();
    let mut response = Response::new(Full::new(envelope(END_STREAM, &payload)).boxed());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    response
}

/// A response body of what comes on `receiver`, each part flushed as it
/// comes; it ends when the sender goes.
pub fn channel_body(receiver: mpsc::Receiver<Bytes>) -> Body {
    ChannelBody { receiver }.boxed()
}

/// A response body fed by a channel: each message flushed as it comes.
struct ChannelBody {
    receiver: mpsc::Receiver<Bytes>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.receiver
            .poll_recv(context)
            .map(|bytes| bytes.map(|bytes| Ok(Frame::data(bytes))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_is_flags_a_big_endian_length_and_the_message() {
        let framed = envelope(END_STREAM, b"{}");
        assert_eq!(&framed[..], b"\x02\x00\x00\x00\x02{}");
    }

    #[test]
    fn a_kernel_refusal_keeps_its_meaning_in_connects_codes() {
        let gone = ConnectError::from(ApiError::new(StatusCode::NOT_FOUND, "no process 7"));
        assert_eq!(
            (gone.code, gone.status()),
            ("not_found", StatusCode::NOT_FOUND)
        );
        let busy = ConnectError::from(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy"));
        assert_eq!(busy.code, "resource_exhausted");
        let paused = ConnectError::from(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "x"));
        assert_eq!(paused.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
