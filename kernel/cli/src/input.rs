//! What the command line gives besides its flags: text as words or on
//! stdin, and durations in seconds.

use std::time::Duration;

use crate::error::CliError;
use crate::failure::usage;

/// Text given as words on the command line (joined by spaces), or `-`
/// for all of stdin.
pub fn words_or_stdin(words: &[String]) -> std::io::Result<String> {
    if words == ["-"] {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)?;
        Ok(text)
    } else {
        Ok(words.join(" "))
    }
}

/// Seconds as a positive duration, for a flag named `flag`.
pub fn seconds(flag: &str, secs: f64) -> Result<Duration, CliError> {
    if !(secs > 0.0 && secs.is_finite() && secs < 1e9) {
        return Err(usage(format!(
            "{flag} must be a positive number of seconds"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Seconds as the whole milliseconds a request's `timeout_ms` takes.
pub fn millis(secs: f64) -> u64 {
    (secs * 1e3).round() as u64
}

/// A word of the protocol's (`on-failure`, `running`) read as the
/// protocol's type, for a command-line option: a word it does not take is
/// refused here, with the words it takes.
pub fn protocol_word<T: serde::de::DeserializeOwned>(word: &str) -> Result<T, serde_json::Error> {
    serde_json::from_value(serde_json::Value::String(word.to_owned()))
}
