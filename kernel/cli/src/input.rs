//! What the command line gives besides its flags: text as words or on
//! stdin, durations in seconds and sizes in bytes.

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

/// Why a size on the command line cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum BadSize {
    /// No number leads it.
    #[error("{0:?} is not a size (try 512M)")]
    NotANumber(String),
    /// Its unit is none of K, M, G.
    #[error("unknown unit in {0:?}: use K, M or G")]
    UnknownUnit(String),
    /// It does not fit in 64 bits.
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// `512`, `64K`, `50M`, `2G` to bytes.
pub fn parse_size(text: &str) -> Result<u64, BadSize> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| BadSize::NotANumber(text.to_owned()))?;
    let unit = unit.to_ascii_uppercase();
    let scale: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return Err(BadSize::UnknownUnit(text.to_owned())),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| BadSize::TooLarge(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("50MiB").unwrap(), 50 << 20);
        assert!(matches!(parse_size("2X"), Err(BadSize::UnknownUnit(_))));
        assert!(matches!(parse_size("M"), Err(BadSize::NotANumber(_))));
    }
}
