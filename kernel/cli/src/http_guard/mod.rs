//! What stands in front of every HTTP face of the CLI: the bearer token
//! each request must carry, which user is at the other end of a local
//! connection, and how many connections each client may hold.

mod connections;
pub mod peer;
mod token;

pub use connections::{Client, ConnectionLimit, Held, Place};
pub use token::{default_token_path, effective_uid, Origin as TokenOrigin, Token};
