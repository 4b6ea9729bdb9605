//! Keeping a server's keys (the values of its configured environment) out
//! of everything the kernel shows: replies, errors and the log. Text from
//! a server passes through [`Secrets::redact`] (or [`Secrets::redact_value`]
//! for JSON) before anyone else sees it; a secret cut in two by a line or
//! length limit is caught by its halves at the text's edges.

use serde_json::Value;

/// What stands in for a secret.
const MASK: &str = "[secret]";
/// Values shorter than this are not treated as secrets (`1`, `true`, `en`
/// would blot out ordinary text).
const SHORTEST: usize = 4;

/// One server's secrets.
#[derive(Clone, Debug, Default)]
pub struct Secrets(Vec<String>);

impl Secrets {
    /// The values of a server's environment that are long enough to be
    /// keys.
    pub fn new<'a>(values: impl IntoIterator<Item = &'a String>) -> Secrets {
        Secrets(
            values
                .into_iter()
                .filter(|v| v.len() >= SHORTEST)
                .cloned()
                .collect(),
        )
    }

    /// `text` with every secret, and any part of one at its start or end
    /// (where a limit may have cut it), replaced.
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.0 {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), MASK);
            }
            // A secret's head at the end of the text, or its tail at the start.
            if let Some(head) = (SHORTEST..secret.len())
                .rev()
                .filter(|n| secret.is_char_boundary(*n))
                .map(|n| &secret[..n])
                .find(|head| text.ends_with(head))
            {
                text.truncate(text.len() - head.len());
                text.push_str(MASK);
            }
            if let Some(tail) = (1..=secret.len() - SHORTEST)
                .filter(|n| secret.is_char_boundary(*n))
                .map(|n| &secret[n..])
                .find(|tail| text.starts_with(tail))
            {
                text.replace_range(..tail.len(), MASK);
            }
        }
        text
    }

    /// Every string in `value` (keys included) redacted.
    pub fn redact_value(&self, value: &mut Value) {
        if self.0.is_empty() {
            return;
        }
        match value {
            Value::String(text) => *text = self.redact(text),
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_value(v)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (key, mut v) in entries {
                    self.redact_value(&mut v);
                    map.insert(self.redact(&key), v);
                }
            }
            _ => {}
        }
    }
}

/// Cuts `text` to at most `max` bytes, at a character boundary.
pub fn truncate_text(text: &mut String, max: usize) {
    if text.len() > max {
        let cut = (0..=max)
            .rev()
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        text.truncate(cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secrets() -> Secrets {
        Secrets::new(&["sk-abcdef123".to_owned(), "1".to_owned()])
    }

    #[test]
    fn secrets_are_blotted_out_whole_and_cut() {
        let secrets = secrets();
        assert_eq!(
            secrets.redact("auth failed for sk-abcdef123 (1 try)"),
            "auth failed for [secret] (1 try)"
        );
        // Cut by a length limit, or split between two lines.
        assert_eq!(secrets.redact("the key is sk-abcd"), "the key is [secret]");
        assert_eq!(secrets.redact("ef123 was refused"), "[secret] was refused");
        // Too short a piece to tell from ordinary text.
        assert_eq!(secrets.redact("see sk-"), "see sk-");
    }

    #[test]
    fn every_string_of_a_value_is_redacted() {
        let mut value =
            json!({"env": {"KEY": "sk-abcdef123"}, "sk-abcdef123": [1, "x sk-abcdef123"]});
        secrets().redact_value(&mut value);
        assert_eq!(
            value,
            json!({"env": {"KEY": "[secret]"}, "[secret]": [1, "x [secret]"]})
        );
    }
}
