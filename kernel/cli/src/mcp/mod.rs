//! `agentos mcp`: AgentOS as an MCP server, over stdio or HTTP.
//!
//! An MCP client (Claude Code, Claude Desktop) starts `agentos mcp` and
//! talks JSON-RPC on its stdin and stdout, or reaches `agentos mcp --http`
//! over Streamable HTTP (see `http`, and `agentos_http` for what stands in
//! front of it); each tool call becomes one
//! request to agentosd on a connection of the caller's own, so the kernel
//! sees the same uid it would see from any other `agentos` command. The
//! server holds no identity or power of its own.
//!
//! The tools speak the kernel's protocol in proto's types: its requests,
//! and its replies, which are the tools' structured results; the input
//! schemas are derived from the argument types (`schema`).
//!
//! Tokio lives here and in the HTTP face only: the rest of the CLI, and
//! the kernel, are blocking or have their own runtime.

mod agents;
mod arguments;
mod catalogue;
mod exec;
mod http;
mod kernel;
mod kernel_check;
mod long_work;
mod prompt;
mod refusal;
mod resources;
mod results;
mod routing;
mod schema;
mod server;
mod sessions;
mod tasks;
mod think;
mod together;
mod tool_error;
mod trace;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;

use agentos_http::fleet::{join, secret as fleet_secret, FaceKind, JoinError};
use agentos_http::token::TokenError;
pub use agentos_http::HttpOptions;
use agentos_http::{HttpError, HttpPlan};
use http::{McpEndpoint, FACE};
use kernel::KernelError;
use server::AgentosServer;

/// How the server meets its client.
#[derive(Debug, Clone)]
pub enum Transport {
    /// JSON-RPC lines on stdin and stdout, until the client closes them.
    Stdio,
    /// Streamable HTTP, until SIGINT or SIGTERM; on a node of a fleet,
    /// with the fleet's secret from this file (else
    /// `$AGENTOS_FLEET_SECRET`), forwarding what other nodes hold.
    Http {
        options: HttpOptions,
        fleet_secret_file: Option<PathBuf>,
    },
}

/// Why the server stopped, or never started.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Fleet(#[from] JoinError),
    #[error("the fleet's secret")]
    FleetSecret(#[source] TokenError),
    /// A fleet's secret was given, but the kernel did not say which node
    /// it is.
    #[error("a fleet secret was given, but the kernel did not say which node it is")]
    NodeUnknown(#[source] KernelError),
    /// The runtime that drives the server could not be built.
    #[error(transparent)]
    Runtime(std::io::Error),
    /// The stdio client's `initialize` failed. Boxed: it can carry a
    /// whole message, and every other failure is small.
    #[error(transparent)]
    Initialize(Box<rmcp::service::ServerInitializeError>),
    /// The task serving the stdio client ended abnormally.
    #[error(transparent)]
    Serving(#[from] tokio::task::JoinError),
}

/// Serves MCP on `transport`, each tool call reaching the kernel at
/// `socket`.
pub fn serve(socket: PathBuf, transport: Transport) -> Result<(), ServeError> {
    // Flags are checked before anything starts.
    let plan = match &transport {
        Transport::Stdio => None,
        Transport::Http { options, .. } => Some(HttpPlan::new(FACE, options)?),
    };
    // A server outlives its peers: a client that hangs up mid-answer, or
    // a kernel connection closed under a call, is an EPIPE for the one
    // write, not a signal that ends every other client's calls. (The CLI
    // restores SIGPIPE's default for its one-shot commands.)
    // SAFETY: setting a signal's disposition touches no memory of ours,
    // and no other thread runs yet.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // One thread serves everything, which is light: each kernel request
    // is non-blocking I/O on it (kernel.rs), so a long EXEC holds up
    // nothing else, and no request hops between threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let kernel = kernel::link(socket);
    // A look at the kernel before the first client arrives, for
    // `initialize` to name a missing one; it never stops the start.
    let looked = runtime.block_on(kernel_check::look(&kernel));
    // A stdio client keeps the server's stderr in its log, where a person
    // setting the client up looks first. Over HTTP the first line of
    // stderr is the address served, which callers read, so the warning
    // stays in `instructions` there.
    if let (Err(err), Transport::Stdio) = (&looked, &transport) {
        eprintln!("agentos mcp: {err}");
    }
    let instructions = kernel_check::instructions(kernel.socket(), &looked);
    let fleet = match &transport {
        Transport::Stdio => None,
        Transport::Http {
            fleet_secret_file, ..
        } => {
            let secret =
                fleet_secret(fleet_secret_file.as_deref()).map_err(ServeError::FleetSecret)?;
            let node = match (looked, &secret) {
                (Ok(found), _) => found.node,
                (Err(err), Some(_)) => return Err(ServeError::NodeUnknown(err)),
                (Err(_), None) => None,
            };
            join(FaceKind::Mcp, node.as_deref(), secret, kernel.socket())?.map(Arc::new)
        }
    };
    let server = AgentosServer::new(kernel.clone(), instructions);
    let served = runtime.block_on(async move {
        match plan {
            None => serve_stdio(server).await,
            Some(plan) => {
                let plan = match &fleet {
                    Some(fleet) => plan.in_fleet(Arc::clone(fleet)),
                    None => plan,
                };
                let endpoint = |site: &_| McpEndpoint::new(server, kernel, site, fleet);
                Ok(agentos_http::serve(plan, endpoint).await?)
            }
        }
    });
    // A kernel call still blocking a thread (an EXEC run) does not hold
    // the exit up: the kernel finishes or ends the run on its own.
    runtime.shutdown_timeout(Duration::from_secs(1));
    served
}

/// The standard streams are driven as pipes on the reactor
/// (`stdio_pipes`) rather than through a blocking thread per read and
/// write. rmcp bounds a stdio line at 16 MiB and drops longer ones; a
/// shorter request too big for the kernel reaches it and is refused as a
/// tool error, which tells the client more than silence would.
async fn serve_stdio(server: AgentosServer) -> Result<(), ServeError> {
    let running = server
        .serve(rmcp::transport::stdio_pipes())
        .await
        .map_err(|err| ServeError::Initialize(Box::new(err)))?;
    running.waiting().await?;
    Ok(())
}
