//! Tools: MCP servers the kernel talks to, and its built-ins, for the TOOL
//! opcode and for code run by EXEC.
//!
//! [`mcp`] holds the MCP client: the JSON-RPC framing of a server's stdio
//! and the client's state machine, both without I/O. [`process`] starts a
//! server under the shared supervisor, [`view`] says what it sees, and
//! [`stderr`] reads its stderr for the log and its error; [`servers`] keeps every configured
//! server's pipes, client and calls on the reactor. [`builtin`] describes
//! the kernel's own tools. [`offer`] is the one list of tools on offer,
//! each with its name in Python, and [`signature`] its Python signature:
//! which arguments go by position, in what order. [`package`] writes the `tools` package EXEC
//! runs import. [`search`] ranks a TOOL search; [`reply`] makes a call's
//! outcome a TOOL reply, with [`secrets`] blotted out. Which tools a caller
//! may use is [`crate::permissions`]' to say.

pub mod builtin;
pub mod mcp;
pub mod offer;
pub mod package;
pub mod process;
pub mod reply;
pub mod schema;
pub mod search;
pub mod secrets;
pub mod servers;
pub mod signature;
pub mod stderr;
pub mod view;
