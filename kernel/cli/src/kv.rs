//! `agentos kv`: the state store — `set KEY VALUE`, `get KEY`, `rm KEY`,
//! `ls [PREFIX]` — your own (`--scope agent`) or your tree's keys.

use agentos_proto::payload::{
    DeleteReply, FetchReply, KeyRequest, KeysReply, KeysRequest, Scope, StoreReply, StoreRequest,
};
use agentos_proto::{Client, Opcode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::CliError;

#[derive(Debug, clap::Subcommand)]
pub enum KvCommand {
    /// Store VALUE under KEY: JSON, or else the text as a string
    Set {
        key: String,
        value: String,
        /// Where it lives: your tree's (shared with your operator and its
        /// agents) or your own
        #[arg(long, value_enum, default_value_t = ScopeArg::Global)]
        scope: ScopeArg,
        /// Seconds until it expires
        #[arg(long)]
        ttl: Option<f64>,
    },
    /// Print KEY's value as JSON (exit 1 if it is not there); without
    /// --scope, your own key first, then your tree's
    Get {
        key: String,
        #[arg(long, value_enum)]
        scope: Option<ScopeArg>,
    },
    /// Delete KEY (the one `get` would print)
    Rm {
        key: String,
        #[arg(long, value_enum)]
        scope: Option<ScopeArg>,
    },
    /// List the keys you see, sorted, that start with PREFIX
    Ls {
        prefix: Option<String>,
        #[arg(long, value_enum)]
        scope: Option<ScopeArg>,
    },
}

/// A scope, as the command line names it.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ScopeArg {
    /// Your tree's
    Global,
    /// Your own
    Agent,
}

impl From<ScopeArg> for Scope {
    fn from(scope: ScopeArg) -> Scope {
        match scope {
            ScopeArg::Global => Scope::Global,
            ScopeArg::Agent => Scope::Agent,
        }
    }
}

pub fn kv(client: &mut Client, command: KvCommand, json: bool) -> Result<(), CliError> {
    match command {
        KvCommand::Set {
            key,
            value,
            scope,
            ttl,
        } => {
            // Text that is not JSON is meant as a string.
            let value = serde_json::from_str(&value).unwrap_or(serde_json::Value::String(value));
            let request = StoreRequest {
                key,
                value,
                scope: scope.into(),
                ttl,
            };
            let reply: StoreReply = call(client, Opcode::STORE, &request)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reply)?);
            }
        }
        KvCommand::Get { key, scope } => {
            let request = KeyRequest {
                key: key.clone(),
                scope: scope.map(Scope::from),
            };
            let reply: FetchReply = call(client, Opcode::FETCH, &request)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reply)?);
            } else if reply.exists {
                println!("{}", serde_json::to_string_pretty(&reply.value)?);
            }
            if !reply.exists {
                return Err(CliError::NoKey(key));
            }
        }
        KvCommand::Rm { key, scope } => {
            let request = KeyRequest {
                key: key.clone(),
                scope: scope.map(Scope::from),
            };
            let reply: DeleteReply = call(client, Opcode::DELETE, &request)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reply)?);
            }
            if !reply.deleted {
                return Err(CliError::NoKey(key));
            }
        }
        KvCommand::Ls { prefix, scope } => {
            let request = KeysRequest {
                prefix: prefix.unwrap_or_default(),
                scope: scope.map(Scope::from),
            };
            let reply: KeysReply = call(client, Opcode::KEYS, &request)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reply)?);
            } else {
                for key in &reply.keys {
                    println!("{key}");
                }
                if reply.truncated {
                    eprintln!("(only the first {}: give a longer prefix)", reply.count);
                }
            }
        }
    }
    Ok(())
}

fn call<R: DeserializeOwned>(
    client: &mut Client,
    opcode: Opcode,
    request: &impl Serialize,
) -> Result<R, CliError> {
    Ok(client.call_json(opcode, &serde_json::to_vec(request)?)?)
}
