//! Parsing and validating payloads: the field at fault named in every
//! error, names checked, numbers kept in range.

use serde::de::DeserializeOwned;

use crate::error::{ErrorCode, ErrorReply};

/// The longest agent, session or task name.
pub const MAX_NAME_LEN: usize = 64;

/// Parses a JSON payload into `T`, naming the field at fault on error.
///
/// `what` is the payload's name for messages, e.g. `"SPAWN"`.
///
/// ```
/// use agentos_proto::payload::{parse_json, KillRequest};
/// let err = parse_json::<KillRequest>("KILL", br#"{"id":"seven"}"#).unwrap_err();
/// assert_eq!(err.code.as_str(), "bad_request");
/// assert!(err.error.contains("`id`"), "{}", err.error);
/// ```
pub fn parse_json<T: DeserializeOwned>(what: &str, payload: &[u8]) -> Result<T, ErrorReply> {
    let mut de = serde_json::Deserializer::from_slice(payload);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| describe(what, err))?;
    de.end()
        .map_err(|err| describe_at(what, String::from("."), err))?;
    Ok(value)
}

/// Deserialises `T` from an already parsed JSON value, naming the field at
/// fault on error.
pub fn from_value<T: DeserializeOwned>(
    what: &str,
    value: serde_json::Value,
) -> Result<T, ErrorReply> {
    serde_path_to_error::deserialize(value).map_err(|err| describe(what, err))
}

/// Parses a payload that may be empty or a JSON object (HELLO, LIST).
pub(crate) fn parse_empty_or_object<T: DeserializeOwned + Default>(
    what: &str,
    payload: &[u8],
) -> Result<T, ErrorReply> {
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    match parse_json::<serde_json::Value>(what, payload)? {
        object @ serde_json::Value::Object(_) => from_value(what, object),
        _ => Err(bad_request(format!(
            "{what} payload must be empty or a JSON object"
        ))),
    }
}

/// A `bad_request` reply.
pub fn bad_request(message: impl Into<String>) -> ErrorReply {
    ErrorReply::new(ErrorCode::BadRequest, message)
}

/// Checks an agent, session or task name: `[A-Za-z0-9_.-]{1,64}`, and not a
/// path trick (`.`, `..` or anything containing `..`).
///
/// ```
/// use agentos_proto::payload::validate_name;
/// assert!(validate_name("name", "worker-1.b_2").is_ok());
/// assert!(validate_name("name", "../etc").is_err());
/// ```
pub fn validate_name(field: &str, name: &str) -> Result<(), ErrorReply> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(bad_request(format!(
            "`{field}` must be 1 to {MAX_NAME_LEN} characters long (got {})",
            name.chars().count()
        )));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(bad_request(format!(
            "`{field}` may only contain A-Z a-z 0-9 _ . - (found {bad:?})"
        )));
    }
    if name == "." || name.contains("..") {
        return Err(bad_request(format!(
            "`{field}` must not be \".\" or contain \"..\""
        )));
    }
    Ok(())
}

/// Checks that an optional number lies in `min..=max`, naming the field and
/// the allowed range otherwise.
pub(crate) fn check_range(
    field: &str,
    value: Option<u64>,
    min: u64,
    max: u64,
) -> Result<(), ErrorReply> {
    match value {
        Some(v) if !(min..=max).contains(&v) => Err(ErrorReply::new(
            ErrorCode::LimitExceeded,
            format!("`{field}` is {v}, outside the allowed range {min}..={max}"),
        )),
        _ => Ok(()),
    }
}

fn describe(what: &str, err: serde_path_to_error::Error<serde_json::Error>) -> ErrorReply {
    let path = err.path().to_string();
    describe_at(what, path, err.into_inner())
}

fn describe_at(what: &str, path: String, inner: serde_json::Error) -> ErrorReply {
    let message = if inner.is_syntax() || inner.is_eof() {
        format!("{what} payload is not valid JSON: {inner}")
    } else if path == "." {
        format!("{what} payload: {inner}")
    } else {
        format!("{what} field `{path}`: {inner}")
    };
    bad_request(message)
}
