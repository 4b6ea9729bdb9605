//! `agentos think`: ask the kernel's LLM.

use agentos_proto::payload::ThinkRequest;
use agentos_proto::{Client, ClientError, ErrorCode};

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
    let reply = client.think(&request).map_err(in_think_terms)?;
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

/// A THINK failure in the CLI's words: `unavailable` from THINK means the
/// kernel's LLM provider could not answer (unreachable, refusing the key,
/// none configured), not that the kernel lacks THINK, so it is said with
/// the kernel's reason.
fn in_think_terms(err: ClientError) -> CliError {
    match err {
        ClientError::Remote(reply) if reply.code == ErrorCode::Unavailable => {
            CliError::LlmUnavailable {
                reason: reply.error,
            }
        }
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::process::ExitCode;

    use agentos_proto::ErrorReply;

    use super::*;
    use crate::failure::report;

    #[test]
    fn an_unavailable_provider_is_said_with_the_kernels_reason() {
        let refused = ClientError::Remote(ErrorReply::new(
            ErrorCode::Unavailable,
            "cannot connect to openai at 127.0.0.1:9: Connection Failed",
        ));
        let err = in_think_terms(refused);
        assert_eq!(
            err.to_string(),
            "the kernel's LLM provider cannot answer: cannot connect to openai at \
             127.0.0.1:9: Connection Failed (agentos hello shows its state)"
        );
        assert!(!err.to_string().contains("not available on this kernel"));
        assert_eq!(report(&err), ExitCode::FAILURE);
    }

    #[test]
    fn other_refusals_stay_the_kernels() {
        let busy = ClientError::Remote(ErrorReply::new(ErrorCode::Busy, "queue full"));
        let err = in_think_terms(busy);
        let reply = err.refusal().expect("still a refusal");
        assert_eq!(reply.code, ErrorCode::Busy);
    }
}
