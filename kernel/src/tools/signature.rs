//! A tool as a Python function: which of its arguments code may pass by
//! position, in what order, and the signature that shows it —
//! `(path, head=None, tail=None)`. One reading of the input schema for
//! everything that shows or calls a tool: the prompt loop's tool list,
//! SKILL.md, and the catalog the `tools` runtime maps positional arguments
//! with, so what the model reads is what the call does.
//!
//! The order: the schema's `required` names in the order it lists them,
//! then its other `properties` in the order the schema has them (the
//! kernel keeps JSON objects in their order). Small models call
//! `read_text_file("/workspace/a.txt")`; required first makes the first
//! positions the ones every call needs.

use serde::Serialize;
use serde_json::Value;

use super::schema::ObjectSchema;
use crate::python_names::is_parameter_name;

/// Characters a string default may have and still be shown: a longer one
/// costs the model's context more than it tells it.
const SHOWN_DEFAULT_CHARS: usize = 24;

/// One parameter of a tool's function.
#[derive(Clone, Debug, PartialEq)]
pub struct Parameter {
    /// Its name: the schema's property, a Python parameter name.
    pub name: String,
    /// Whether the schema requires it.
    pub required: bool,
    /// The schema's default, when it is simple enough to show (a number,
    /// a bool, null or a short plain string); optional parameters without
    /// one show `=None`.
    pub default: Option<Value>,
}

/// A tool's parameters, in the order positional arguments fill them.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Signature {
    /// The parameters, required ones first.
    pub parameters: Vec<Parameter>,
    /// Whether the schema names arguments that cannot be Python parameters
    /// (`from`, `max-tokens`): passed as `**{"from": ...}`.
    pub more: bool,
}

/// A parameter as the catalog gives it to the `tools` runtime.
#[derive(Debug, Serialize)]
pub struct CatalogParameter<'a> {
    pub name: &'a str,
    pub required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<&'a Value>,
}

impl Signature {
    /// The signature `input_schema` gives a tool's function. Schemas come
    /// from servers and may be odd: what cannot be read is left out.
    pub fn of(input_schema: &Value) -> Signature {
        let schema = ObjectSchema::read(input_schema);
        let required = schema.required();
        let mut signature = Signature::default();
        let in_order = required
            .iter()
            .copied()
            .chain(schema.properties().map(|(name, _)| name));
        for name in in_order {
            if signature.parameters.iter().any(|p| p.name == name) {
                continue;
            }
            if !is_parameter_name(name) {
                signature.more = true;
                continue;
            }
            let is_required = required.contains(&name);
            let default = schema
                .property(name)
                .and_then(|property| property.default)
                .filter(|value| python_literal(value).is_some());
            signature.parameters.push(Parameter {
                name: name.to_owned(),
                required: is_required,
                default: if is_required { None } else { default },
            });
        }
        signature
    }

    /// As Python shows it: `(path, head=None, tail=None)`.
    pub fn render(&self) -> String {
        let mut shown: Vec<String> = self
            .parameters
            .iter()
            .map(|parameter| match (parameter.required, &parameter.default) {
                (true, _) => parameter.name.clone(),
                (false, Some(default)) => format!(
                    "{}={}",
                    parameter.name,
                    python_literal(default).unwrap_or_else(|| "None".to_owned())
                ),
                (false, None) => format!("{}=None", parameter.name),
            })
            .collect();
        if self.more {
            shown.push("**arguments".to_owned());
        }
        format!("({})", shown.join(", "))
    }

    /// The parameters as the catalog gives them to the `tools` runtime:
    /// `[{"name", "required", "default"?}]`, in order.
    pub fn to_catalog(&self) -> Vec<CatalogParameter<'_>> {
        self.parameters
            .iter()
            .map(|parameter| CatalogParameter {
                name: &parameter.name,
                required: parameter.required,
                default: parameter.default.as_ref(),
            })
            .collect()
    }
}

/// Keys of a structured result shown at most: a longer result is shown by
/// its first keys and `...`.
const SHOWN_RESULT_KEYS: usize = 6;

/// The one field of a structured result that is only text (the
/// filesystem server's `{"content": "..."}`), by its name: a call gives
/// back that text as a `str` (see runtime.py's `ToolText`).
pub fn text_field(output_schema: &Value) -> Option<String> {
    let schema = ObjectSchema::read(output_schema);
    let mut properties = schema.properties();
    match (properties.next(), properties.next()) {
        (Some((name, property)), None) if property.kind.as_deref() == Some("string") => {
            Some(name.to_owned())
        }
        _ => None,
    }
}

/// What a tool's call returns when its `output_schema` says so: `str` for
/// a result that is one text field, else a Python dict of its keys'
/// types, `{'timezone': str, 'is_dst': bool}`. A small model that is not
/// told calls string methods on a dict, or makes keys up. `None` when the
/// schema names no properties.
pub fn returns(output_schema: &Value) -> Option<String> {
    if text_field(output_schema).is_some() {
        return Some("str".to_owned());
    }
    let schema = ObjectSchema::read(output_schema);
    let mut keys: Vec<String> = schema
        .properties()
        .take(SHOWN_RESULT_KEYS + 1)
        .map(|(name, property)| {
            let kind = match property.kind.as_deref() {
                Some("string") => "str",
                Some("integer") => "int",
                Some("number") => "float",
                Some("boolean") => "bool",
                Some("array") => "list",
                Some("object") => "dict",
                // A `$ref` is a definition of the schema's: an object.
                _ if property.reference.is_some() => "dict",
                _ => "object",
            };
            format!("'{name}': {kind}")
        })
        .collect();
    if keys.is_empty() {
        return None;
    }
    if keys.len() > SHOWN_RESULT_KEYS {
        keys.truncate(SHOWN_RESULT_KEYS);
        keys.push("...".to_owned());
    }
    Some(format!("{{{}}}", keys.join(", ")))
}

/// `value` as a Python literal the way Python's `repr` writes it, when it
/// is simple enough to show.
fn python_literal(value: &Value) -> Option<String> {
    match value {
        Value::Null => Some("None".to_owned()),
        Value::Bool(true) => Some("True".to_owned()),
        Value::Bool(false) => Some("False".to_owned()),
        Value::Number(number) => Some(number.to_string()),
        Value::String(text)
            if text.chars().count() <= SHOWN_DEFAULT_CHARS
                && text
                    .chars()
                    .all(|c| c == ' ' || (c.is_ascii_graphic() && c != '\'' && c != '\\')) =>
        {
            Some(format!("'{text}'"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names(signature: &Signature) -> Vec<&str> {
        signature
            .parameters
            .iter()
            .map(|p| p.name.as_str())
            .collect()
    }

    #[test]
    fn required_come_first_in_the_order_required_lists_them_then_the_rest_in_schema_order() {
        let schema = json!({
            "type": "object",
            "properties": {
                "tail": {"type": "number"},
                "path": {"type": "string"},
                "head": {"type": "number"},
                "mode": {"type": "string"},
            },
            "required": ["path", "mode"],
        });
        let signature = Signature::of(&schema);
        assert_eq!(names(&signature), ["path", "mode", "tail", "head"]);
        assert_eq!(signature.render(), "(path, mode, tail=None, head=None)");
    }

    #[test]
    fn simple_defaults_are_shown_and_others_are_none() {
        let schema = json!({
            "properties": {
                "prompt": {"type": "string", "default": "ignored: required"},
                "limit": {"type": "integer", "default": 10},
                "exact": {"type": "boolean", "default": false},
                "encoding": {"type": "string", "default": "utf-8"},
                "quoted": {"type": "string", "default": "it's"},
                "filters": {"type": "array", "default": ["a"]},
                "ratio": {"type": "number", "default": 0.5},
            },
            "required": ["prompt"],
        });
        assert_eq!(
            Signature::of(&schema).render(),
            "(prompt, limit=10, exact=False, encoding='utf-8', quoted=None, filters=None, \
             ratio=0.5)"
        );
    }

    #[test]
    fn names_that_cannot_be_parameters_are_keyword_only_and_said_so() {
        let schema = json!({
            "properties": {"from": {}, "to": {}, "max-tokens": {}, "type": {}},
            "required": ["from", "to", "missing"],
        });
        let signature = Signature::of(&schema);
        // A required name the properties lack is still an argument.
        assert_eq!(names(&signature), ["to", "missing", "type"]);
        assert!(signature.more);
        assert_eq!(signature.render(), "(to, missing, type=None, **arguments)");
    }

    #[test]
    fn a_structured_result_is_shown_as_its_keys_and_their_types() {
        let file = json!({"type": "object", "properties": {"content": {"type": "string"}}});
        assert_eq!(returns(&file).as_deref(), Some("str"));
        assert_eq!(text_field(&file).as_deref(), Some("content"));
        let list = json!({"properties": {"content": {"type": "array"}}});
        assert_eq!(returns(&list).as_deref(), Some("{'content': list}"));
        assert_eq!(text_field(&list), None);
        let time = json!({
            "properties": {
                "source": {"$ref": "#/$defs/TimeResult"},
                "difference": {"type": "number"},
                "dst": {"type": "boolean"},
                "tags": {"type": "array"},
                "odd": {"type": ["string", "null"]},
            },
        });
        assert_eq!(
            returns(&time).as_deref(),
            Some("{'source': dict, 'difference': float, 'dst': bool, 'tags': list, 'odd': object}")
        );
        let wide = json!({"properties": (0..9).map(|n| (format!("k{n}"), json!({"type": "integer"}))).collect::<serde_json::Map<_, _>>()});
        assert!(returns(&wide).unwrap().ends_with("'k5': int, ...}"));
        assert_eq!(returns(&json!({"type": "object"})), None);
        assert_eq!(returns(&json!("x")), None);
    }

    #[test]
    fn an_odd_schema_has_no_parameters() {
        for schema in [json!({}), json!({"properties": []}), json!("x")] {
            assert_eq!(Signature::of(&schema).render(), "()");
        }
        assert_eq!(
            serde_json::to_value(
                Signature::of(&json!({"properties": {"a": {}}, "required": "a"})).to_catalog()
            )
            .unwrap(),
            json!([{"name": "a", "required": false}])
        );
    }
}
