//! How the CLI writes figures and JSON: shared by every command.

use serde::Serialize;

use crate::error::CliError;

/// Prints `value` as pretty JSON on stdout: what `--json` gives.
pub fn print_json<T: Serialize + ?Sized>(value: &T) -> Result<(), CliError> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints one item as itself and several as an array: what a command
/// that acts on several agents gives with `--json`.
pub fn print_one_or_all<T: Serialize>(items: &[T]) -> Result<(), CliError> {
    match items {
        [one] => print_json(one),
        all => print_json(all),
    }
}

/// Bytes in binary units as `top` writes them: `512B`, `12.3M`, `256M`, `1.5G`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut value = bytes as f64;
    let mut unit = "B";
    for next in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    if value.fract() == 0.0 || value >= 100.0 {
        format!("{value:.0}{unit}")
    } else {
        format!("{value:.1}{unit}")
    }
}

/// `text` cut to `width` characters, the last one `…` when cut.
pub fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        out.push('…');
    }
    out
}

/// A time in milliseconds since the Unix epoch as `HH:MM:SS` (UTC).
pub fn clock_ms(at_ms: u64) -> String {
    let secs = at_ms / 1000;
    format!(
        "{:02}:{:02}:{:02}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units_like_top() {
        assert_eq!(human_size(512), "512B");
        assert_eq!(human_size(1536), "1.5K");
        assert_eq!(human_size(256 << 20), "256M");
        assert_eq!(human_size(12_900_000), "12.3M");
    }

    #[test]
    fn text_is_cut_with_an_ellipsis() {
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("abc", 4), "abc");
    }
}
