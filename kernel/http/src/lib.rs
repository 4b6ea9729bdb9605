//! The HTTP faces of the CLI (`agentos mcp --http`): what stands in front
//! of what a face serves.
//!
//! A face is a service of its own (MCP's Streamable HTTP, say) that this
//! crate serves on a TCP address: it owns the listening socket, the
//! bearer token, the one path answered, the size of a request body, how
//! many connections each client holds, and stopping on SIGINT or SIGTERM.
//! The service checks the `Host` and `Origin` headers itself, as its
//! protocol says how to refuse them; [`Site`] tells it which to accept.
//!
//! Whoever reaches a face acts as the uid that runs it, so every request
//! needs a token: one given (`--token-file`, the face's environment
//! variable), which its holders may share and which a bind other machines
//! can reach requires; or one the server makes and keeps for its user,
//! with which it serves that user's own connections only.
//!
//! ```no_run
//! use std::convert::Infallible;
//! use std::future::{ready, Ready};
//! use std::task::{Context, Poll};
//!
//! use agentos_http::{serve, Body, Face, HttpOptions, HttpPlan};
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//!
//! /// Answers every request that passes the gate with its own body.
//! #[derive(Clone)]
//! struct Echo;
//!
//! impl tower_service::Service<Request<Full<Bytes>>> for Echo {
//!     type Response = Response<Body>;
//!     type Error = Infallible;
//!     type Future = Ready<Result<Response<Body>, Infallible>>;
//!
//!     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
//!         Poll::Ready(Ok(()))
//!     }
//!
//!     fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
//!         ready(Ok(Response::new(request.into_body().boxed())))
//!     }
//! }
//!
//! const ECHO: Face = Face {
//!     name: "echo",
//!     path: "/echo",
//!     token_env: "AGENTOS_ECHO_TOKEN",
//!     max_body_bytes: 1 << 20,
//! };
//!
//! # async fn run() -> Result<(), agentos_http::HttpError> {
//! let options = HttpOptions {
//!     listen: "8080".into(),
//!     token_file: None,
//!     allow_origins: Vec::new(),
//!     allow_hosts: Vec::new(),
//! };
//! serve(HttpPlan::new(ECHO, &options)?, |_site| Echo).await
//! # }
//! ```

pub mod connections;
pub mod fleet;
pub mod forward;
mod gate;
mod guard;
pub mod kernel_link;
pub mod peer;
mod plan;
pub mod random;
mod request_body;
mod serve;
pub mod token;

pub use gate::{plain, Body};
pub use plan::{parse_listen_address, Face, HttpError, HttpOptions, HttpPlan, KeyedPlan, Site};
pub use request_body::RequestBody;
pub use serve::{serve, serve_keyed};
