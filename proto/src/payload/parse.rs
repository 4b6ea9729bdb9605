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
    let value = strictly(what, &mut de)?;
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
    strictly(what, value)
}

/// Reads the part of a request that decides how to read the rest (EXEC's
/// `op`), passing over the other fields, which the full parse that
/// follows checks.
pub(crate) fn peek<T: DeserializeOwned>(
    what: &str,
    value: serde_json::Value,
) -> Result<T, ErrorReply> {
    let mut track = serde_path_to_error::Track::new();
    T::deserialize(serde_path_to_error::Deserializer::new(value, &mut track))
        .map_err(|err| describe_at(what, track.path().to_string(), err))
}

/// Deserialises a request, refusing any field no type along the way
/// knows. The types a request shares with replies (`Limits`,
/// `NetworkPolicy`) accept unknown fields, so that a client reading a
/// newer kernel's reply does not fail; a request must not slip one past
/// them, so every field the deserialiser passes over is refused here,
/// at any depth, named by its path.
fn strictly<'de, D, T>(what: &str, deserializer: D) -> Result<T, ErrorReply>
where
    D: serde::Deserializer<'de, Error = serde_json::Error>,
    T: serde::Deserialize<'de>,
{
    let mut track = serde_path_to_error::Track::new();
    let mut unknown = None;
    let tracked = serde_path_to_error::Deserializer::new(deserializer, &mut track);
    let value = noting_unknown(tracked, &mut unknown)
        .map_err(|err| describe_at(what, track.path().to_string(), err))?;
    match unknown {
        // In the words serde uses for the fields a strict type refuses.
        Some(unknown) if unknown.parent().is_empty() => Err(bad_request(format!(
            "{what} payload: unknown field `{}`",
            unknown.name()
        ))),
        Some(unknown) => Err(bad_request(format!(
            "{what} field `{}`: unknown field `{}`",
            unknown.parent(),
            unknown.name()
        ))),
        None => Ok(value),
    }
}

/// Deserialises `T`, noting in `unknown` the first field that no type
/// along the way knows (which serde passes over unless the type refuses
/// it). A reader of requests refuses what this notes.
pub fn noting_unknown<'de, D, T>(
    deserializer: D,
    unknown: &mut Option<UnknownField>,
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    serde_ignored::deserialize(deserializer, |path| {
        unknown.get_or_insert_with(|| UnknownField::at(&path));
    })
}

/// A field no type knows, by its path from the top: `limits.memroy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownField {
    /// Map keys and list indices, outermost first.
    path: Vec<String>,
}

impl UnknownField {
    fn at(path: &serde_ignored::Path<'_>) -> UnknownField {
        let mut path_reversed = Vec::new();
        let mut at = path;
        loop {
            match at {
                serde_ignored::Path::Root => break,
                serde_ignored::Path::Seq { parent, index } => {
                    path_reversed.push(index.to_string());
                    at = parent;
                }
                serde_ignored::Path::Map { parent, key } => {
                    path_reversed.push(key.clone());
                    at = parent;
                }
                serde_ignored::Path::Some { parent }
                | serde_ignored::Path::NewtypeStruct { parent }
                | serde_ignored::Path::NewtypeVariant { parent } => at = parent,
            }
        }
        path_reversed.reverse();
        UnknownField {
            path: path_reversed,
        }
    }

    /// The field's own name.
    pub fn name(&self) -> &str {
        self.path.last().map_or("", String::as_str)
    }

    /// The path of the object it is in, empty at the top.
    pub fn parent(&self) -> String {
        self.path[..self.path.len().saturating_sub(1)].join(".")
    }
}

impl std::fmt::Display for UnknownField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.path.join("."))
    }
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
