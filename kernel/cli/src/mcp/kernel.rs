//! The MCP server's way to agentosd ([`agentos_http::kernel_link`]), and
//! how its client points it at another socket.

use std::path::PathBuf;

pub use agentos_http::kernel_link::{KernelError, KernelLink, Refusal, Wait};

/// How an MCP client points this server at the kernel. MCP clients start
/// a server with a minimal environment, so the `AGENTOS_SOCKET` of the
/// user's shell does not reach it: the client's configuration must say.
pub const SOCKET_HINT: &str = "Start agentosd, or if it listens on another socket, \
     give this server that path in the MCP client's configuration: \
     `agentos mcp --socket PATH` as the server's command and args, or \
     AGENTOS_SOCKET=PATH in the server's `env` (MCP clients start servers with a \
     minimal environment, so a shell's AGENTOS_SOCKET does not reach them)";

/// The server's link to the kernel at `socket`.
pub fn link(socket: PathBuf) -> KernelLink {
    KernelLink::new(socket, SOCKET_HINT)
}
