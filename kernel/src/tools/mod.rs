//! Tools: MCP servers the kernel talks to, for the TOOL opcode and for
//! code run by EXEC.
//!
//! [`mcp`] holds the MCP client: the JSON-RPC framing of a server's stdio
//! and the client's state machine, both without I/O. [`catalog`] names
//! tools for Python, matches agents' `permissions.tools` patterns and
//! ranks searches.

pub mod catalog;
pub mod mcp;
