//! The MCP client: [`jsonrpc`] frames what goes to and from a server,
//! [`client`] keeps track of one server — its protocol revision, its
//! tools, its calls and their deadlines — without I/O; a server is reached
//! over its stdio (see `servers`) or over Streamable HTTP ([`http`], whose
//! event streams [`sse`] reads).

pub mod client;
pub mod http;
pub mod jsonrpc;
pub mod param_headers;
pub mod sse;

/// The largest message a server may send: a bigger one fails the call it
/// answers (or is dropped), and costs no more memory than this.
pub const MAX_MESSAGE: usize = 8 << 20;
