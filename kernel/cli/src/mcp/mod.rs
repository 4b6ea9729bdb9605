//! `agentos mcp`: AgentOS as an MCP server over stdio.
//!
//! An MCP client (Claude Code, Claude Desktop) starts `agentos mcp` and
//! talks JSON-RPC on its stdin and stdout; each tool call becomes one
//! request to agentosd on a connection of the caller's own, so the kernel
//! sees the same uid it would see from any other `agentos` command. The
//! server holds no identity or power of its own.
//!
//! Tokio lives here only: the rest of the CLI, and the kernel, are
//! blocking or have their own runtime.

/// The input schema of a tool whose arguments are `T`; a type that has no
/// schema is a mistake in the tool modules, found by the first tools/list.
macro_rules! input_schema {
    ($arguments:ty) => {
        schema_for_input::<$arguments>()
            .expect(concat!(stringify!($arguments), " has an object schema"))
    };
}

mod arguments;
mod catalogue;
mod kernel;
mod resources;
mod results;
mod server;
mod sessions;
mod tasks;

use std::path::PathBuf;

use rmcp::ServiceExt;

use kernel::KernelLink;
use server::AgentosServer;

/// Serves MCP on stdin and stdout until the client closes them.
///
/// One thread serves the JSON-RPC traffic, which is light: a kernel
/// request runs on tokio's blocking pool, so a long EXEC holds up nothing
/// else, and no request hops between runtime threads on its way. The
/// standard streams are driven as pipes on the reactor (`stdio_pipes`)
/// rather than through a blocking thread per read and write.
pub fn serve(socket: PathBuf) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let server = AgentosServer::new(KernelLink::new(socket));
        let running = server.serve(rmcp::transport::stdio_pipes()).await?;
        running.waiting().await?;
        anyhow::Ok(())
    })
}
