//! `agentos send AGENT MESSAGE`: puts a message in an agent's mailbox, as
//! SEND does. The message is JSON if it parses as JSON, else a string.
//! It comes from this command's own connection, which closes when it
//! returns: an answer sent to it is not kept.

use agentos_proto::payload::{SendReply, SendRequest};
use agentos_proto::{Client, Opcode};

use crate::error::CliError;

#[derive(Debug, clap::Args)]
pub struct SendArgs {
    /// Agent name (its SPAWN name, or one it registered), or id
    agent: String,
    /// The message: JSON (`{"task": 1}`, `42`), or else taken as a string
    message: String,
}

pub fn send(client: &mut Client, args: SendArgs, json: bool) -> Result<(), CliError> {
    let (to, to_name) = crate::agents::id_or_name(&args.agent);
    let message = serde_json::from_str(&args.message)
        .unwrap_or_else(|_| serde_json::Value::String(args.message.clone()));
    let request = SendRequest {
        message,
        to,
        to_name,
    };
    let reply: SendReply = client
        .call_json(Opcode::SEND, &serde_json::to_vec(&request)?)
        .map_err(|err| crate::failure::about_agent(&args.agent, err))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    } else {
        println!("sent to {}", reply.delivered_to);
    }
    Ok(())
}
