//! Tool arguments mirrored into HTTP headers, as protocol 2026-07-28 has
//! a tool ask with `x-mcp-header` in its input schema: the argument at an
//! annotated property goes with a call over Streamable HTTP as
//! `Mcp-Param-{name}`, so that gateways can route on it without reading
//! the body.
//!
//! An annotation must name a header (a non-empty token), be unique among
//! the schema's (in any case), sit on a property of type `string`,
//! `integer` or `boolean`, and be reachable from the schema's root through
//! `properties` alone (not `items`, `oneOf`, `$ref`...). A tool whose
//! schema breaks any of these is left out of the listing over HTTP, as the
//! specification requires; over stdio annotations mean nothing.

use std::collections::HashSet;

use base64::Engine;
use serde_json::Value;

/// One annotated argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamHeader {
    /// The chain of `properties` keys from the schema's root to it.
    path: Vec<String>,
    /// The header's name after `Mcp-Param-`.
    name: String,
}

/// The largest integer JavaScript holds exactly (2^53 - 1), which bounds
/// an integer argument mirrored into a header.
const SAFE_INTEGER: i64 = (1 << 53) - 1;

/// Why a tool's `x-mcp-header` annotations are invalid (and the tool is
/// left out over HTTP).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadAnnotation {
    /// Two annotations name the same header, in any case.
    #[error("x-mcp-header {name:?} is given twice")]
    Twice {
        /// The header's name, as the second annotation gives it.
        name: String,
    },
    /// An annotation is on a schema the root's `properties` alone do not
    /// reach.
    #[error("x-mcp-header is on a schema not reached through `properties` alone")]
    Unreachable,
    /// An annotation that is not a header name (a non-empty token).
    #[error("x-mcp-header {annotation} is not a header name")]
    NotAName {
        /// The annotation, as the schema gives it.
        annotation: Value,
    },
    /// An annotation on a property that is not a string, integer or
    /// boolean.
    #[error("x-mcp-header {name:?} is on a property that is not a string, integer or boolean")]
    Type {
        /// The header's name.
        name: String,
    },
}

/// The annotated arguments of a tool's input schema, or why its
/// annotations are invalid.
pub fn of_schema(schema: &Value) -> Result<Vec<ParamHeader>, BadAnnotation> {
    let mut found = Vec::new();
    walk(schema, Some(&mut Vec::new()), &mut found)?;
    let mut names = HashSet::new();
    for header in &found {
        if !names.insert(header.name.to_ascii_lowercase()) {
            return Err(BadAnnotation::Twice {
                name: header.name.clone(),
            });
        }
    }
    Ok(found)
}

/// `schema`'s annotations; `path` is its chain of `properties` keys when it
/// is statically reachable from the root, else `None`.
fn walk(
    schema: &Value,
    path: Option<&mut Vec<String>>,
    found: &mut Vec<ParamHeader>,
) -> Result<(), BadAnnotation> {
    match schema {
        Value::Object(object) => {
            let mut path = path;
            if let Some(annotation) = object.get("x-mcp-header") {
                let at = path
                    .as_deref()
                    .filter(|p| !p.is_empty())
                    .ok_or(BadAnnotation::Unreachable)?;
                found.push(annotated(annotation, object.get("type"), at)?);
            }
            for (key, child) in object {
                match (key.as_str(), child, path.as_deref_mut()) {
                    ("properties", Value::Object(properties), Some(path)) => {
                        for (property, sub) in properties {
                            path.push(property.clone());
                            let walked = walk(sub, Some(path), found);
                            path.pop();
                            walked?;
                        }
                    }
                    _ => walk(child, None, found)?,
                }
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(|item| walk(item, None, found)),
        _ => Ok(()),
    }
}

/// One annotation, checked.
fn annotated(
    annotation: &Value,
    kind: Option<&Value>,
    path: &[String],
) -> Result<ParamHeader, BadAnnotation> {
    let name = annotation.as_str().unwrap_or("");
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        return Err(BadAnnotation::NotAName {
            annotation: annotation.clone(),
        });
    }
    match kind.and_then(Value::as_str) {
        Some("string" | "integer" | "boolean") => Ok(ParamHeader {
            path: path.to_vec(),
            name: name.to_owned(),
        }),
        _ => Err(BadAnnotation::Type {
            name: name.to_owned(),
        }),
    }
}

/// The headers a call with `arguments` carries: one per annotated
/// argument present (and not null) at its path.
pub fn for_call(headers: &[ParamHeader], arguments: &Value) -> Vec<(String, String)> {
    headers
        .iter()
        .filter_map(|header| {
            let value = header
                .path
                .iter()
                .try_fold(arguments, |value, key| value.get(key))?;
            let text = match value {
                Value::String(text) => header_value(text),
                Value::Bool(flag) => flag.to_string(),
                Value::Number(number) => {
                    let integer = number.as_i64().filter(|n| n.abs() <= SAFE_INTEGER)?;
                    integer.to_string()
                }
                _ => return None,
            };
            Some((format!("Mcp-Param-{}", header.name), text))
        })
        .collect()
}

/// `text` as a header value: as it is when it is printable ASCII with no
/// space at its ends (and does not look encoded), else in the base64 form
/// 2026-07-28 gives for the rest.
pub fn header_value(text: &str) -> String {
    let printable = text.bytes().all(|b| (0x20..0x7f).contains(&b));
    let spaced = text.starts_with(' ') || text.ends_with(' ');
    let looks_encoded = text.starts_with("=?base64?") && text.ends_with("?=");
    let plain = printable && !spaced && !looks_encoded;
    if plain {
        text.to_owned()
    } else {
        let encoded = base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
        format!("=?base64?{encoded}?=")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn header_values_are_plain_or_base64_as_the_spec_says() {
        assert_eq!(header_value("get_weather"), "get_weather");
        assert_eq!(
            header_value("Hello, 世界"),
            "=?base64?SGVsbG8sIOS4lueVjA==?="
        );
        assert_eq!(header_value(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(header_value("line1\nline2"), "=?base64?bGluZTEKbGluZTI=?=");
        assert_eq!(
            header_value("=?base64?literal?="),
            "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="
        );
    }

    #[test]
    fn annotated_arguments_become_headers_nested_ones_too() {
        let schema = json!({
            "type": "object",
            "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "query": {"type": "string"},
                "options": {"type": "object", "properties": {
                    "dry": {"type": "boolean", "x-mcp-header": "Dry-Run"},
                    "limit": {"type": "integer", "x-mcp-header": "Limit"}
                }}
            }
        });
        let headers = of_schema(&schema).unwrap();
        let call = json!({"region": "Hello, 世界", "options": {"dry": true, "limit": 42}});
        let mut got = for_call(&headers, &call);
        got.sort();
        assert_eq!(
            got,
            [
                ("Mcp-Param-Dry-Run".into(), "true".into()),
                ("Mcp-Param-Limit".into(), "42".into()),
                (
                    "Mcp-Param-Region".into(),
                    "=?base64?SGVsbG8sIOS4lueVjA==?=".into()
                ),
            ]
        );
        // Absent or null: no header.
        assert!(for_call(&headers, &json!({"region": null})).is_empty());
    }

    #[test]
    fn invalid_annotations_are_refused() {
        let bad = [
            json!({"properties": {"a": {"type": "number", "x-mcp-header": "A"}}}),
            json!({"properties": {"a": {"type": "string", "x-mcp-header": ""}}}),
            json!({"properties": {"a": {"type": "string", "x-mcp-header": "Bad Name"}}}),
            json!({"properties": {
                "a": {"type": "string", "x-mcp-header": "Same"},
                "b": {"type": "string", "x-mcp-header": "same"}
            }}),
            json!({"properties": {"list": {"type": "array", "items": {
                "type": "string", "x-mcp-header": "Item"
            }}}}),
            json!({"properties": {"a": {"oneOf": [{"type": "string", "x-mcp-header": "A"}]}}}),
            json!({"type": "string", "x-mcp-header": "Root"}),
        ];
        for schema in bad {
            assert!(of_schema(&schema).is_err(), "{schema}");
        }
        assert_eq!(of_schema(&json!({"type": "object"})), Ok(Vec::new()));
    }
}
