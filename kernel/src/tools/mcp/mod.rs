//! The MCP client, stdio transport: [`jsonrpc`] frames what goes to and
//! from a server, [`client`] keeps track of one server — its handshake,
//! its tools, its calls and their deadlines.

pub mod client;
pub mod jsonrpc;
