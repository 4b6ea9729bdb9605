//! Speaking the protocol: frames byte by byte over a bare socket, and
//! JSON requests over a client.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use agentos_proto::{encode_frame, Client, Header, Opcode, HEADER_LEN};

/// Writes one request frame.
pub fn send(stream: &mut UnixStream, opcode: Opcode, payload: &[u8]) {
    stream.write_all(&encode_frame(opcode, 0, payload)).unwrap();
}

/// Reads one reply frame.
pub fn recv(stream: &mut UnixStream) -> (Header, Vec<u8>) {
    let mut header = [0u8; HEADER_LEN];
    stream.read_exact(&mut header).unwrap();
    let header = Header::decode(&header).unwrap();
    let mut payload = vec![0u8; header.payload_len as usize];
    stream.read_exact(&mut payload).unwrap();
    (header, payload)
}

/// Reads one reply frame and parses its JSON payload.
pub fn recv_json(stream: &mut UnixStream) -> (Header, serde_json::Value) {
    let (header, payload) = recv(stream);
    let value = serde_json::from_slice(&payload).unwrap_or_else(|e| {
        panic!(
            "reply is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&payload)
        )
    });
    (header, value)
}

/// Reads one reply frame's JSON, or `None` once the kernel has closed the
/// connection.
pub fn try_recv_json(stream: &mut UnixStream) -> Option<serde_json::Value> {
    let mut header = [0u8; HEADER_LEN];
    stream.read_exact(&mut header).ok()?;
    let header = Header::decode(&header).ok()?;
    let mut payload = vec![0u8; header.payload_len as usize];
    stream.read_exact(&mut payload).ok()?;
    serde_json::from_slice(&payload).ok()
}

/// Sends a request and reads its JSON reply.
pub fn call_json(stream: &mut UnixStream, opcode: Opcode, payload: &[u8]) -> serde_json::Value {
    send(stream, opcode, payload);
    let (header, value) = recv_json(stream);
    assert_eq!(header.opcode, opcode, "reply opcode");
    value
}

/// Asserts the peer closed the connection (EOF, or a reset after the last reply).
pub fn assert_closed(stream: &mut UnixStream) {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => {}
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the kernel to close the connection, got {other:?}"),
    }
}

/// Asserts a connection is still served, with a NOOP.
pub fn assert_usable(stream: &mut UnixStream) {
    send(stream, Opcode::NOOP, b"still there?");
    let (header, payload) = recv(stream);
    assert_eq!(header.opcode, Opcode::NOOP);
    assert_eq!(payload, b"still there?");
}

/// Sends a JSON request and returns the JSON reply.
pub fn request(client: &mut Client, opcode: Opcode, body: &serde_json::Value) -> serde_json::Value {
    let reply = client
        .call(opcode, &serde_json::to_vec(body).unwrap())
        .unwrap();
    serde_json::from_slice(&reply.payload).unwrap()
}
