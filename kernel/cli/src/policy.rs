//! A network policy given on the command line, as `spawn` and `exec`
//! take it.

use agentos_proto::payload::{Network, NetworkPolicy};

/// A network policy given on the command line.
#[derive(Debug, clap::Args)]
pub struct PolicyArgs {
    /// Reach this through the kernel's egress proxy (host, *.domain or
    /// CIDR, each with an optional :port); repeat for more
    #[arg(long, value_name = "ENTRY")]
    allow: Vec<String>,
    /// With --allow: never reach this
    #[arg(long, value_name = "ENTRY", requires = "allow")]
    deny: Vec<String>,
}

impl PolicyArgs {
    /// The request's `network`, if a policy was given.
    pub fn network(&self) -> Option<Network> {
        (!self.allow.is_empty()).then(|| {
            Network::Policy(Box::new(NetworkPolicy {
                allow: self.allow.clone(),
                deny: self.deny.clone(),
            }))
        })
    }
}
