//! The proxy's own answers: a refusal's status, with its reason in a
//! header and as the body, for the sandbox's code to act on.

use std::io::{Read, Write};

use mio::net::TcpStream;

/// Answers `status` with `reason` (best effort: the socket is closed
/// next), and reads what the client sent on so that the close is not a
/// reset that would lose the answer.
pub fn reply(stream: &mut TcpStream, status: u16, reason: &str) {
    let _ = stream.write_all(&answer(status, reason));
    drain(stream);
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

/// Reads (and drops) what the client has sent and the proxy has not
/// read, up to 64 KiB: closing a socket with unread bytes resets it, and
/// a reset can lose the answer written just before.
pub fn drain(stream: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// The bytes of a refusal: `status` with `reason`, the connection's last.
pub fn answer(status: u16, reason: &str) -> Vec<u8> {
    let text = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    };
    let reason: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let body = format!("{reason}\n");
    format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-AgentOS-Refused: {reason}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
