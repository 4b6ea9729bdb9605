//! The egress proxy end to end on the host's loopback: a real `Proxy`
//! serving a listener, real upstream servers, and a client that speaks
//! CONNECT, TLS and HTTP/1.1 to it. No sandbox and no root: what a
//! sandbox adds (the listener inside its namespace) is the kernel's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bounds;
mod control;
mod credentials;
mod framing;
mod plain;
mod support;
mod tunnels;
