//! `agentos think`: ask the kernel's LLM.

use agentos_proto::payload::ThinkRequest;
use agentos_proto::Client;

use crate::error::CliError;
use crate::format::print_json;
use crate::input::words_or_stdin;

#[derive(Debug, clap::Args)]
pub struct ThinkArgs {
    /// The prompt (its words are joined by spaces); `-` reads it from stdin
    #[arg(required = true)]
    prompt: Vec<String>,
    /// A system instruction
    #[arg(long)]
    system: Option<String>,
    /// A model other than the kernel's default
    #[arg(long)]
    model: Option<String>,
    /// Upper bound on the answer's tokens
    #[arg(long, value_name = "N")]
    max_tokens: Option<u32>,
    /// Sampling temperature, 0 to 2
    #[arg(long)]
    temperature: Option<f64>,
}

pub fn think(client: &mut Client, args: ThinkArgs, json: bool) -> Result<(), CliError> {
    let prompt = words_or_stdin(&args.prompt)?;
    let request = ThinkRequest {
        prompt: Some(prompt),
        system: args.system,
        model: args.model,
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        ..ThinkRequest::default()
    };
    let reply = client.think(&request)?;
    if json {
        return print_json(&reply);
    }
    println!("{}", reply.content.trim_end());
    eprintln!(
        "({} tokens, {}, {} ms queued, {} ms at the model)",
        reply.tokens,
        reply.model.as_deref().unwrap_or("unknown model"),
        reply.queue_ms.unwrap_or(0),
        reply.latency_ms.unwrap_or(0),
    );
    Ok(())
}
