//! Keeping a server's keys (the values of its configured environment) out
//! of everything the kernel shows: replies, errors and the log. Text from
//! a server passes through [`Secrets::redact`] (or [`Secrets::redact_value`]
//! for JSON) before anyone else sees it.
//!
//! A key is caught as written and in the encodings a server is likely to
//! echo it in by accident: base64 (standard and URL-safe, padded or not,
//! alone or inside a larger blob), hex and URL-encoding. A key cut in two
//! by a line or length limit is caught by its halves at the text's edges.
//! This is a safety net for accidental echoes, not a defence against a
//! server that means to leak its keys: it can always transform one in a way
//! no filter recognises.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::config::mcp::McpServerConfig;

/// What stands in for a secret.
const MASK: &str = "[secret]";
/// Values shorter than this are not treated as secrets (`1`, `true`, `en`
/// would blot out ordinary text).
const SHORTEST: usize = 4;
/// The fewest base64 characters looked for: enough to spell [`SHORTEST`]
/// bytes, so that a short secret's base64 is caught whole but a few
/// characters of it, which ordinary text may hold by chance, are not.
const SHORTEST_BASE64: usize = (SHORTEST * 8).div_ceil(6);

const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";
const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// How common URL encoders differ: the punctuation each leaves as it is
/// (letters and digits are left by all), and how it writes a space.
const URL_ENCODERS: [(&str, &str); 5] = [
    // RFC 3986's unreserved characters: Python's `quote(safe="")`.
    ("-._~", "%20"),
    // Python's `quote`, which keeps `/` by default.
    ("-._~/", "%20"),
    // Python's `quote_plus`, Go's `url.QueryEscape`.
    ("-._~", "+"),
    // JavaScript's `encodeURIComponent`.
    ("-._~!'()*", "%20"),
    // HTML forms, Java's `URLEncoder`.
    ("-._*", "+"),
];

/// Variables that configure where and how a program runs, never a key:
/// their values are paths, locales and settings, and blotting them out
/// would turn every path in an error into `[secret]`.
const NOT_SECRET_NAMES: [&str; 11] = [
    "HOME",
    "PATH",
    "LANG",
    "TZ",
    "TERM",
    "USER",
    "SHELL",
    "TMPDIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
];
/// Families of such variables, by prefix (`LC_ALL`, `NODE_OPTIONS`,
/// `npm_config_cache`, `PYTHONPATH`, `UV_CACHE_DIR`, `XDG_CACHE_HOME`).
const NOT_SECRET_PREFIXES: [&str; 6] = ["LC_", "NODE_", "npm_config_", "PYTHON", "UV_", "XDG_"];
/// Words that make a variable of those families a secret after all
/// (`NODE_AUTH_TOKEN`, `npm_config_//registry.example/:_authToken`,
/// `UV_INDEX_PASSWORD`), matched in any case.
const SECRET_WORDS: [&str; 6] = ["TOKEN", "KEY", "SECRET", "PASSWORD", "AUTH", "CREDENTIAL"];

/// Whether the variable `name` is a well-known setting rather than a
/// possible key.
pub fn is_plain_setting(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if SECRET_WORDS.iter().any(|word| upper.contains(word)) {
        return false;
    }
    NOT_SECRET_NAMES.contains(&name) || NOT_SECRET_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// One server's secrets.
#[derive(Clone, Debug, Default)]
pub struct Secrets(Vec<Secret>);

/// One secret and the forms it is looked for in, worked out once when the
/// server is configured rather than on every text.
#[derive(Clone, Debug)]
struct Secret {
    /// The value as configured, also looked for cut at a text's edges.
    literal: String,
    /// Every form blotted out wherever it appears, the literal included,
    /// longest first: a longer form may hold a shorter one (padded base64
    /// holds its unpadded self), and replacing the shorter first would
    /// leave the rest of the longer showing.
    forms: Vec<String>,
}

impl Secrets {
    /// The secrets of a server's environment `env`: every value long enough
    /// to be a key, except those of well-known settings
    /// ([`is_plain_setting`]).
    pub fn of_env(env: &BTreeMap<String, String>) -> Secrets {
        Secrets::new(
            env.iter()
                .filter(|(name, _)| !is_plain_setting(name))
                .map(|(_, value)| value),
        )
    }

    /// The secrets of a server's configuration: those of its environment
    /// ([`Secrets::of_env`]), every value of its `headers` — with the
    /// credential after an authorization scheme (`Bearer <token>`) also on
    /// its own, since a server that echoes it echoes it bare — and the
    /// values of its URL's query, where some services take their keys
    /// (`?api_key=...`).
    pub fn of_server(config: &McpServerConfig) -> Secrets {
        let mut values: Vec<String> = config
            .env
            .iter()
            .filter(|(name, _)| !is_plain_setting(name))
            .map(|(_, value)| value.clone())
            .collect();
        for value in config.headers.values() {
            values.push(value.clone());
            if let Some((_, credential)) = value.trim().split_once(' ') {
                values.push(credential.trim().to_owned());
            }
        }
        let query = config.url.as_deref().and_then(|url| url.split_once('?'));
        if let Some((_, query)) = query {
            let query = query.split('#').next().unwrap_or(query);
            values.extend(
                query
                    .split('&')
                    .filter_map(|pair| pair.split_once('='))
                    .map(|(_, value)| value.to_owned()),
            );
        }
        Secrets::new(&values)
    }

    /// The values of a server's environment that are long enough to be
    /// keys.
    pub fn new<'a>(values: impl IntoIterator<Item = &'a String>) -> Secrets {
        Secrets(
            values
                .into_iter()
                .filter(|v| v.len() >= SHORTEST)
                .map(|v| Secret::new(v))
                .collect(),
        )
    }

    /// `text` with every secret, in any of its forms, and any part of one
    /// at its start or end (where a limit may have cut it), replaced.
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.0 {
            for form in &secret.forms {
                // Most text holds no secret; looking first spares a copy.
                if text.contains(form.as_str()) {
                    text = text.replace(form.as_str(), MASK);
                }
            }
            secret.redact_cut_literal(&mut text);
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

impl Secret {
    fn new(literal: &str) -> Secret {
        let bytes = literal.as_bytes();
        let mut forms = vec![literal.to_owned()];
        forms.extend([HEX_LOWER, HEX_UPPER].map(|digits| hex(bytes, digits)));
        forms.extend(url_encoded_forms(bytes));
        forms.extend(base64_forms(bytes));
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        Secret {
            literal: literal.to_owned(),
            forms,
        }
    }

    /// Replaces the literal's head at the end of `text`, or its tail at the
    /// start. Encoded forms are not looked for cut: an encoding's pieces
    /// are short runs of letters and digits, too easily ordinary text.
    fn redact_cut_literal(&self, text: &mut String) {
        let literal = self.literal.as_str();
        if let Some(head) = (SHORTEST..literal.len())
            .rev()
            .filter(|n| literal.is_char_boundary(*n))
            .map(|n| &literal[..n])
            .find(|head| text.ends_with(head))
        {
            text.truncate(text.len() - head.len());
            text.push_str(MASK);
        }
        if let Some(tail) = (1..=literal.len() - SHORTEST)
            .filter(|n| literal.is_char_boundary(*n))
            .map(|n| &literal[n..])
            .find(|tail| text.starts_with(tail))
        {
            text.replace_range(..tail.len(), MASK);
        }
    }
}

/// `bytes` as two hex digits each.
fn hex(bytes: &[u8], digits: &[u8; 16]) -> String {
    let mut out = String::with_capacity(2 * bytes.len());
    for &byte in bytes {
        push_hex(&mut out, byte, digits);
    }
    out
}

fn push_hex(out: &mut String, byte: u8, digits: &[u8; 16]) {
    out.push(char::from(digits[usize::from(byte >> 4)]));
    out.push(char::from(digits[usize::from(byte & 0xf)]));
}

/// `bytes` as each of [`URL_ENCODERS`] writes them, with upper- and
/// lower-case hex digits.
fn url_encoded_forms(bytes: &[u8]) -> impl Iterator<Item = String> + '_ {
    URL_ENCODERS.into_iter().flat_map(move |(kept, space)| {
        [HEX_UPPER, HEX_LOWER].map(|digits| {
            let mut out = String::with_capacity(3 * bytes.len());
            for &byte in bytes {
                if byte == b' ' {
                    out.push_str(space);
                } else if byte.is_ascii_alphanumeric() || kept.as_bytes().contains(&byte) {
                    out.push(char::from(byte));
                } else {
                    out.push('%');
                    push_hex(&mut out, byte, digits);
                }
            }
            out
        })
    })
}

/// The runs of base64 characters that spell `secret`, in both alphabets,
/// wherever it lies in what was encoded.
///
/// Base64 writes 3 bytes as 4 characters of 6 bits each, so how `secret`
/// is spelt depends on how many bytes came before it, mod 3. For each of
/// the three offsets, the characters whose 6 bits all come from `secret`
/// are the same whatever surrounds it; those between its first whole
/// character and its last whole one are looked for anywhere (`secret` in
/// the middle of a blob). When `secret` ends the blob, its last character
/// (part `secret`, part zero bits) and any padding are known too, so the
/// run to the end, padded and not, is looked for as well. Runs too short
/// to tell from chance ([`SHORTEST_BASE64`]) are left out.
fn base64_forms(secret: &[u8]) -> Vec<String> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    use base64::Engine;
    let mut forms = Vec::new();
    for alphabet in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
        for offset in 0..3 {
            let mut shifted = vec![0; offset];
            shifted.extend_from_slice(secret);
            let encoded = alphabet.encode(&shifted);
            let first = (8 * offset).div_ceil(6);
            let last_whole = 8 * shifted.len() / 6;
            let padding = "=".repeat((4 - encoded.len() % 4) % 4);
            let to_end = &encoded[first..];
            for form in [
                format!("{to_end}{padding}"),
                to_end.to_owned(),
                encoded[first..last_whole].to_owned(),
            ] {
                if form.trim_end_matches('=').len() >= SHORTEST_BASE64 {
                    forms.push(form);
                }
            }
        }
    }
    forms
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

    #[test]
    fn a_remote_servers_headers_and_url_query_values_are_secrets() {
        let config = McpServerConfig {
            url: Some("https://mcp.example.com/mcp?tenant=acme-corp&api_key=qk-5150#x".into()),
            headers: BTreeMap::from([
                ("Authorization".into(), "Bearer tk-0a1b2c3d".into()),
                ("X-Api-Key".into(), "xk-998877".into()),
            ]),
            ..McpServerConfig::default()
        };
        let secrets = Secrets::of_server(&config);
        assert_eq!(
            secrets.redact("Bearer tk-0a1b2c3d | tk-0a1b2c3d | xk-998877 | qk-5150 | acme-corp"),
            "[secret] | [secret] | [secret] | [secret] | [secret]"
        );
        assert_eq!(secrets.redact("Bearer and mcp"), "Bearer and mcp");
    }

    fn secrets() -> Secrets {
        Secrets::new(&["sk-abcdef123".to_owned(), "1".to_owned()])
    }

    #[test]
    fn a_key_is_blotted_out_but_a_home_path_and_other_settings_are_not() {
        let env: BTreeMap<String, String> = [
            ("API_KEY", "sk-live-0123456789"),
            ("HOME", "/var/lib/agentos/mcp/github/home"),
            ("PATH", "/usr/local/bin:/usr/bin"),
            ("LC_ALL", "C.UTF-8"),
            ("NODE_OPTIONS", "--max-old-space-size=512"),
            ("NODE_AUTH_TOKEN", "npm-token-abcdef"),
            ("npm_config_cache", "/srv/npm-cache"),
            (
                "npm_config_//registry.example/:_authToken",
                "tok-registry-99",
            ),
            ("PYTHONPATH", "/srv/lib/python"),
            ("UV_CACHE_DIR", "/srv/uv-cache"),
            ("UV_INDEX_PASSWORD", "hunter22"),
            ("XDG_CACHE_HOME", "/srv/cache"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let secrets = Secrets::of_env(&env);
        let all: Vec<&str> = env.values().map(String::as_str).collect();
        let redacted = secrets.redact(&all.join(" "));
        assert_eq!(
            redacted,
            "[secret] /var/lib/agentos/mcp/github/home C.UTF-8 [secret] --max-old-space-size=512 \
             /usr/local/bin:/usr/bin /srv/lib/python /srv/uv-cache [secret] /srv/cache \
             [secret] /srv/npm-cache"
        );
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
    fn a_secret_is_caught_in_base64_hex_and_url_encoded_forms() {
        let secrets = Secrets::new(&["sk-live>?~x".to_owned()]);
        for (form, encoded) in [
            ("standard base64", "c2stbGl2ZT4/fng="),
            ("standard base64 unpadded", "c2stbGl2ZT4/fng"),
            ("URL-safe base64", "c2stbGl2ZT4_fng="),
            ("URL-safe base64 unpadded", "c2stbGl2ZT4_fng"),
            ("lower-case hex", "736b2d6c6976653e3f7e78"),
            ("upper-case hex", "736B2D6C6976653E3F7E78"),
            ("URL-encoded", "sk-live%3E%3F~x"),
            ("URL-encoded, lower-case", "sk-live%3e%3f~x"),
            ("URL-encoded by a form", "sk-live%3E%3F%7Ex"),
        ] {
            assert_eq!(
                secrets.redact(&format!("auth failed for {encoded} (1 try)")),
                "auth failed for [secret] (1 try)",
                "{form}"
            );
        }
    }

    #[test]
    fn a_secret_is_caught_as_each_common_url_encoder_writes_it() {
        let secrets = Secrets::new(&["p@ss/w0rd 42!".to_owned()]);
        for (encoder, encoded) in [
            ("quote(safe='')", "p%40ss%2Fw0rd%2042%21"),
            ("quote", "p%40ss/w0rd%2042%21"),
            ("quote_plus", "p%40ss%2Fw0rd+42%21"),
            ("encodeURIComponent", "p%40ss%2Fw0rd%2042!"),
            ("lower-case hex digits", "p%40ss%2fw0rd%2042%21"),
        ] {
            assert_eq!(
                secrets.redact(&format!("GET /login?password={encoded}&next=/")),
                "GET /login?password=[secret]&next=/",
                "{encoder}"
            );
        }
    }

    #[test]
    fn base64_of_a_secret_inside_a_larger_blob_is_caught_at_any_alignment() {
        let secrets = Secrets::new(&["sk-abcdef123".to_owned()]);
        // `{"k":"sk-abcdef123","region":"eu"}` with 6, 7 and 8 bytes before
        // the key. What is left either side holds at most a few of its bits.
        assert_eq!(
            secrets.redact("eyJrIjoic2stYWJjZGVmMTIzIiwicmVnaW9uIjoiZXUifQ=="),
            "eyJrIjoi[secret]IiwicmVnaW9uIjoiZXUifQ=="
        );
        assert_eq!(
            secrets.redact("eyJreSI6InNrLWFiY2RlZjEyMyIsInJlZ2lvbiI6ImV1In0="),
            "eyJreSI6In[secret]yIsInJlZ2lvbiI6ImV1In0="
        );
        assert_eq!(
            secrets.redact("eyJrZXkiOiJzay1hYmNkZWYxMjMiLCJyZWdpb24iOiJldSJ9"),
            "eyJrZXkiOiJ[secret]iLCJyZWdpb24iOiJldSJ9"
        );
    }

    #[test]
    fn base64_of_a_secret_ending_a_blob_is_caught_to_its_last_character() {
        let secrets = Secrets::new(&["sk-abcdef123".to_owned()]);
        // HTTP basic auth, `user:key`, with users of 2, 3 and 4 letters.
        assert_eq!(
            secrets.redact("Authorization: Basic YWw6c2stYWJjZGVmMTIz"),
            "Authorization: Basic YWw6[secret]"
        );
        assert_eq!(
            secrets.redact("Authorization: Basic Ym9iOnNrLWFiY2RlZjEyMw=="),
            "Authorization: Basic Ym9iOn[secret]"
        );
        assert_eq!(
            secrets.redact("Authorization: Basic Y2FybDpzay1hYmNkZWYxMjM="),
            "Authorization: Basic Y2FybDp[secret]"
        );
    }

    #[test]
    fn a_short_secret_is_caught_whole_in_base64_but_ordinary_text_is_left_alone() {
        // "jZah" is "alphaA==" in base64. Five characters of it are too
        // few to tell from chance, so the word alone is not taken for it.
        let secrets = Secrets::new(&["jZah".to_owned()]);
        assert_eq!(
            secrets.redact("token alphaA== refused"),
            "token [secret] refused"
        );
        assert_eq!(
            secrets.redact("the alphabet of an alpha release"),
            "the alphabet of an alpha release"
        );
    }

    #[test]
    fn an_encoded_secret_is_caught_in_every_string_of_a_value() {
        let mut value = json!({
            "auth": "Basic Ym9iOnNrLWFiY2RlZjEyMw==",
            "c2stYWJjZGVmMTIz": ["736b2d616263646566313233", 1],
        });
        secrets().redact_value(&mut value);
        assert_eq!(
            value,
            json!({"auth": "Basic Ym9iOn[secret]", "[secret]": ["[secret]", 1]})
        );
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
