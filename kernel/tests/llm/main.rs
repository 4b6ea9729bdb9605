//! THINK against a stand-in provider: the exact requests each wire format
//! sends, what is retried and what is not, timeouts, fairness between
//! callers, and a reactor that stays responsive while THINKs queue.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod answering;
mod context;
mod metrics;
mod providers;
mod reachability;
mod scheduling;

use agentos_test_support::llm_stub::Stub;
use agentos_test_support::Daemon;

const KEY: &str = "sk-test-0123456789abcdef";

/// A daemon whose THINK goes to `stub` as `provider`, with extra `[llm]`
/// settings.
fn daemon_for(provider: &str, stub: &Stub, extra: &str) -> Daemon {
    let base = match provider {
        "openai" => format!("{}/v1", stub.url()),
        _ => stub.url(),
    };
    Daemon::start_with(&format!(
        "[llm]\nprovider = \"{provider}\"\nbase_url = \"{base}\"\napi_key = \"{KEY}\"\n\
         model = \"stub-model\"\n{extra}"
    ))
}
