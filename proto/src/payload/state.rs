//! STORE (0x30), FETCH (0x31), DELETE (0x32) and KEYS (0x33): the state
//! store, a key-value store of JSON values, as the Clove SDK's `store`,
//! `fetch`, `delete_key` and `list_keys` send them.
//!
//! A key lives in a scope: `agent` (the caller's own; Clove's `session`
//! means the same) or `global` (shared by one operator's tree: the
//! operator and every agent it started, and theirs). What the kernel
//! checks of a value here, before any store is touched: its nesting
//! depth. Its size and the owner's quotas are the kernel's settings.

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, parse_empty_or_object, parse_json};
use crate::error::{ErrorCode, ErrorReply};

/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 256;
/// How deeply a value's arrays and objects may nest.
pub const MAX_VALUE_DEPTH: usize = 32;
/// The longest `ttl`: ten years, in seconds.
pub const MAX_TTL_SECS: f64 = 10.0 * 365.0 * 86_400.0;
/// The most keys one KEYS reply lists.
pub const MAX_KEYS_LISTED: usize = 1000;

/// Where a key lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The caller's own: an agent's, or an operator's uid's. No one else
    /// reads it.
    #[serde(alias = "session")]
    Agent,
    /// One operator's tree: the operator and every agent of it share it.
    #[default]
    Global,
}

impl Scope {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Agent => "agent",
            Scope::Global => "global",
        }
    }
}

/// A STORE request: `{"key": "...", "value": <any JSON>, "scope":
/// "global"|"agent"|"session", "ttl": seconds}`.
///
/// ```
/// use agentos_proto::payload::{Scope, StoreRequest};
/// let stored = StoreRequest::parse(br#"{"key":"k","value":{"a":[1]},"scope":"session","ttl":60}"#).unwrap();
/// assert_eq!((stored.scope, stored.ttl), (Scope::Agent, Some(60.0)));
/// assert!(StoreRequest::parse(br#"{"key":"k","value":1,"scope":"world"}"#).is_err());
/// assert!(StoreRequest::parse(br#"{"key":"k","value":1,"ttl":-1}"#).is_err());
/// assert!(StoreRequest::parse(br#"{"key":"k","value":1,"ttl":"60"}"#).is_err());
/// assert!(StoreRequest::parse(br#"{"key":"k","value":1,"tll":60}"#).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StoreRequest {
    /// The key: 1 to 256 bytes, no control characters.
    pub key: String,
    /// Any JSON value.
    pub value: serde_json::Value,
    /// `global` (the default) or `agent`.
    #[serde(default)]
    pub scope: Scope,
    /// Seconds until the key expires; none, never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<f64>,
}

impl StoreRequest {
    /// Parses a STORE payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: StoreRequest = parse_json("STORE", payload)?;
        check_key("STORE", &request.key)?;
        if let Some(ttl) = request.ttl {
            if !(ttl > 0.0 && ttl <= MAX_TTL_SECS) {
                return Err(bad_request(format!(
                    "STORE field `ttl`: {ttl} is not a number of seconds above 0 and at most \
                     {MAX_TTL_SECS}; leave it out for a key that does not expire"
                )));
            }
        }
        if depth(&request.value) > MAX_VALUE_DEPTH {
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "STORE field `value`: arrays and objects nest more than \
                     {MAX_VALUE_DEPTH} deep"
                ),
            ));
        }
        Ok(request)
    }

    /// `ttl` in milliseconds.
    pub fn ttl_ms(&self) -> Option<i64> {
        self.ttl.map(|secs| (secs * 1000.0).ceil() as i64)
    }
}

/// A FETCH or DELETE request: `{"key": "...", "scope": optional}`.
/// Without a scope the caller's own key is looked up first, then its
/// tree's.
///
/// ```
/// use agentos_proto::payload::KeyRequest;
/// assert!(KeyRequest::parse("FETCH", br#"{"key":"k"}"#).is_ok());
/// assert!(KeyRequest::parse("FETCH", br#"{"key":""}"#).is_err());
/// assert!(KeyRequest::parse("DELETE", br#"{"key":"a\u0007b"}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct KeyRequest {
    /// The key.
    pub key: String,
    /// Only this scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}

impl KeyRequest {
    /// Parses a FETCH or DELETE (`what`) payload.
    pub fn parse(what: &str, payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: KeyRequest = parse_json(what, payload)?;
        check_key(what, &request.key)?;
        Ok(request)
    }
}

/// A KEYS request: empty, or `{"prefix": "...", "scope": optional}`.
///
/// ```
/// use agentos_proto::payload::KeysRequest;
/// assert_eq!(KeysRequest::parse(b"").unwrap().prefix, "");
/// assert_eq!(KeysRequest::parse(br#"{"prefix":"test:"}"#).unwrap().prefix, "test:");
/// assert!(KeysRequest::parse(br#"{"prefx":"t"}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct KeysRequest {
    /// Only keys that start with it.
    #[serde(default)]
    pub prefix: String,
    /// Only this scope; none, both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}

impl KeysRequest {
    /// Parses a KEYS payload.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let request: KeysRequest = parse_empty_or_object("KEYS", payload)?;
        if request.prefix.len() > MAX_KEY_LEN {
            return Err(bad_request(format!(
                "KEYS field `prefix`: at most {MAX_KEY_LEN} bytes"
            )));
        }
        Ok(request)
    }
}

/// A key: 1 to [`MAX_KEY_LEN`] bytes, no control characters.
fn check_key(what: &str, key: &str) -> Result<(), ErrorReply> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(bad_request(format!(
            "{what} field `key`: 1 to {MAX_KEY_LEN} bytes (got {})",
            key.len()
        )));
    }
    if let Some(bad) = key.chars().find(|c| c.is_control()) {
        return Err(bad_request(format!(
            "{what} field `key`: no control characters (found {bad:?})"
        )));
    }
    Ok(())
}

/// How deeply `value`'s arrays and objects nest (a scalar: 0), without
/// recursion.
fn depth(value: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0)];
    while let Some((value, at)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &serde_json::Value>> = match value {
            serde_json::Value::Array(items) => Box::new(items.iter()),
            serde_json::Value::Object(fields) => Box::new(fields.values()),
            _ => continue,
        };
        deepest = deepest.max(at + 1);
        stack.extend(children.map(|child| (child, at + 1)));
    }
    deepest
}

/// STORE's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StoreReply {
    /// Always true.
    pub success: bool,
    /// The key stored.
    pub key: String,
    /// Its scope.
    pub scope: Scope,
    /// When it expires (RFC 3339), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// FETCH's reply: `exists` false (and `value` null) for a key that is not
/// there, or has expired.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FetchReply {
    /// Always true.
    pub success: bool,
    /// Whether the key is there.
    pub exists: bool,
    /// Its value.
    pub value: serde_json::Value,
    /// The scope it was found in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// When it expires (RFC 3339), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// DELETE's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DeleteReply {
    /// Always true.
    pub success: bool,
    /// Whether a key was there to delete.
    pub deleted: bool,
    /// The scope it was deleted from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}

/// KEYS' reply: the keys, sorted, each once, at most
/// [`MAX_KEYS_LISTED`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct KeysReply {
    /// Always true.
    pub success: bool,
    /// The keys.
    pub keys: Vec<String>,
    /// How many are listed.
    pub count: usize,
    /// Whether there were more than are listed (ask with a longer
    /// `prefix`).
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_measured_without_recursion_and_capped() {
        let nested = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let at_cap = format!(r#"{{"key":"k","value":{}}}"#, nested(MAX_VALUE_DEPTH));
        assert!(StoreRequest::parse(at_cap.as_bytes()).is_ok());
        let over = format!(r#"{{"key":"k","value":{}}}"#, nested(MAX_VALUE_DEPTH + 1));
        let err = StoreRequest::parse(over.as_bytes()).unwrap_err();
        assert_eq!(err.code, ErrorCode::LimitExceeded);
        assert!(err.error.contains("`value`"), "{}", err.error);
        assert_eq!(depth(&serde_json::json!({"a": [{"b": 1}], "c": 2})), 3);
    }

    #[test]
    fn keys_are_bounded_and_printable_and_scopes_are_known_words() {
        let long = format!(r#"{{"key":"{}"}}"#, "k".repeat(MAX_KEY_LEN + 1));
        assert!(KeyRequest::parse("FETCH", long.as_bytes()).is_err());
        let at_cap = format!(r#"{{"key":"{}"}}"#, "k".repeat(MAX_KEY_LEN));
        assert!(KeyRequest::parse("FETCH", at_cap.as_bytes()).is_ok());
        assert!(KeyRequest::parse("FETCH", br#"{"key":"a\nb"}"#).is_err());
        assert!(KeyRequest::parse("FETCH", br#"{"key":"k","scope":"tree"}"#).is_err());
        let global = KeyRequest::parse("FETCH", br#"{"key":"k","scope":"global"}"#).unwrap();
        assert_eq!(global.scope, Some(Scope::Global));
        for refused in ["0", "-5", "true", r#""soon""#] {
            let payload = format!(r#"{{"key":"k","value":1,"ttl":{refused}}}"#);
            let err = StoreRequest::parse(payload.as_bytes()).unwrap_err();
            assert_eq!(err.code, ErrorCode::BadRequest, "{payload}");
        }
        let lasting = StoreRequest::parse(br#"{"key":"k","value":null,"ttl":null}"#).unwrap();
        assert_eq!((lasting.scope, lasting.ttl_ms()), (Scope::Global, None));
        let short = StoreRequest::parse(br#"{"key":"k","value":1,"ttl":0.25}"#).unwrap();
        assert_eq!(short.ttl_ms(), Some(250));
    }
}
