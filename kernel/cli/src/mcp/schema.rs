//! The tools' JSON schemas, from the types' own derives: proto's for what
//! the kernel answers (and for the arguments that are its types), the
//! server's for the rest of its arguments.
//!
//! schemars writes each schema to stand alone; a tool list carries two
//! per tool, and every client reads all of them, so each says its piece
//! once:
//! - no `$schema` (MCP fixes the draft, 2020-12) and no `$defs` but for
//!   a type that contains itself: a subschema stands where it is used;
//! - no `format` (`uint64` and the like, which validate nothing: the type
//!   and `minimum` say it);
//! - a description ends where its doc comment's example begins;
//! - an enum of names is an `enum` of the names (what each means stays in
//!   proto's documentation).
//!
//! An output schema describes what the server writes, and further:
//! - no `success` or `code`: a reply that becomes a tool's result is no
//!   refusal (a refusal is a tool error, flagged `isError`), so the
//!   structured content leaves out the fields that would say it was
//!   (see `results`);
//! - no `default`: every field is written;
//! - an object inside one of the result's fields is described by its
//!   description and type alone: the tool's own fields are the contract a
//!   client checks, and the kernel's nested records (an agent's limits, a
//!   task's owner) are what the kernel reports, documented with proto.

use std::collections::BTreeSet;
use std::sync::Arc;

use rmcp::model::JsonObject;
use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::Value;

/// The fields by which a kernel reply says whether it is a refusal,
/// which a tool's structured content leaves out.
pub const REFUSAL_FIELDS: [&str; 2] = ["success", "code"];

/// The input schema of a tool whose arguments are `T`: what `T` reads.
///
/// # Panics
///
/// If `T`'s schema is not an object's: a tool's arguments are an object,
/// so such a type is a mistake in the tool modules, found by the first
/// tools/list (and the tests).
pub fn input<T: JsonSchema>() -> Arc<JsonObject> {
    let settings = SchemaSettings::draft2020_12().for_deserialize();
    let schema = root(generate::<T>(settings));
    assert_eq!(
        schema.get("type").and_then(Value::as_str),
        Some("object"),
        "a tool's arguments are an object"
    );
    Arc::new(schema)
}

/// The output schema of a tool whose structured content is `T`, as the
/// server writes it.
pub fn output<T: JsonSchema>() -> Arc<JsonObject> {
    let settings = SchemaSettings::draft2020_12().for_serialize();
    let mut schema = root(generate::<T>(settings));
    let definitions = match schema.get("$defs") {
        Some(Value::Object(definitions)) => definitions.clone(),
        _ => JsonObject::new(),
    };
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        for field in REFUSAL_FIELDS {
            properties.remove(field);
        }
        for property in properties.values_mut() {
            outline(property, &definitions);
        }
    }
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|name| {
            name.as_str()
                .is_none_or(|name| !REFUSAL_FIELDS.contains(&name))
        });
    }
    without_defaults(&mut schema);
    drop_unused_definitions(&mut schema);
    Arc::new(schema)
}

fn generate<T: JsonSchema>(settings: SchemaSettings) -> Value {
    let settings = settings.with(|settings| {
        settings.meta_schema = None;
        settings.inline_subschemas = true;
    });
    let mut schema = settings
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value();
    tidy(&mut schema);
    schema
}

/// The schema's object, without the type's own name and doc comment,
/// which the tool's name and description say better.
fn root(schema: Value) -> JsonObject {
    let Value::Object(mut schema) = schema else {
        // `true`, which only a type that holds any JSON derives: an empty
        // schema says the same.
        return JsonObject::new();
    };
    schema.remove("title");
    schema.remove("description");
    schema
}

/// The rules every schema follows, at every level.
fn tidy(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            object.remove("format");
            if let Some(Value::String(description)) = object.get_mut("description") {
                shorten(description);
            }
            for value in object.values_mut() {
                tidy(value);
            }
            names_as_enum(object);
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

/// A doc comment as a description: up to its first example, its lines
/// joined.
fn shorten(description: &mut String) {
    if let Some(example) = description.find("```") {
        description.truncate(example);
    }
    *description = description.split_whitespace().collect::<Vec<_>>().join(" ");
}

/// `oneOf` a list of documented constants (an enum whose variants have
/// doc comments) as the `enum` of those constants.
fn names_as_enum(object: &mut JsonObject) {
    let Some(Value::Array(alternatives)) = object.get("oneOf") else {
        return;
    };
    let mut names = Vec::new();
    let mut kinds = BTreeSet::new();
    for alternative in alternatives {
        let Value::Object(alternative) = alternative else {
            return;
        };
        let only_a_constant = alternative
            .keys()
            .all(|key| matches!(key.as_str(), "const" | "type" | "description"));
        match alternative.get("const") {
            Some(name) if only_a_constant => names.push(name.clone()),
            _ => return,
        }
        if let Some(Value::String(kind)) = alternative.get("type") {
            kinds.insert(kind.clone());
        }
    }
    object.remove("oneOf");
    if let (Some(kind), 1) = (kinds.first(), kinds.len()) {
        object.insert("type".to_owned(), Value::String(kind.clone()));
    }
    object.insert("enum".to_owned(), Value::Array(names));
}

/// An output field's schema with what it holds described by type and
/// description: an object's fields, and the shapes a union's
/// alternatives take, are left to the documentation.
fn outline(field: &mut Value, definitions: &JsonObject) {
    let Value::Object(object) = field else {
        return;
    };
    if let Some(name) = object
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|reference| reference.strip_prefix("#/$defs/"))
    {
        let kinds = definitions
            .get(name)
            .and_then(Value::as_object)
            .map(kinds_of)
            .unwrap_or_default();
        object.remove("$ref");
        set_kinds(object, kinds);
        return;
    }
    object.remove("properties");
    object.remove("required");
    for key in ["items", "additionalProperties"] {
        if let Some(inner) = object.get_mut(key) {
            outline(inner, definitions);
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        let Some(Value::Array(alternatives)) = object.get_mut(key) else {
            continue;
        };
        alternatives
            .iter_mut()
            .for_each(|alternative| outline(alternative, definitions));
        let plain = alternatives.iter().all(|alternative| {
            alternative.as_object().is_some_and(|alternative| {
                alternative
                    .keys()
                    .all(|key| matches!(key.as_str(), "type" | "description"))
            })
        });
        if plain {
            let kinds = kinds_of(object);
            object.remove(key);
            set_kinds(object, kinds);
        }
    }
}

/// The JSON types a schema allows: its `type`, or its alternatives'.
fn kinds_of(object: &JsonObject) -> BTreeSet<String> {
    let mut kinds = BTreeSet::new();
    let own = object.get("type").into_iter();
    let alternatives = ["anyOf", "oneOf", "allOf"]
        .into_iter()
        .filter_map(|key| object.get(key).and_then(Value::as_array))
        .flatten()
        .filter_map(|alternative| alternative.get("type"));
    for kind in own.chain(alternatives) {
        match kind {
            Value::String(kind) => {
                kinds.insert(kind.clone());
            }
            Value::Array(list) => {
                kinds.extend(list.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            _ => {}
        }
    }
    kinds
}

/// Sets `type` to `kinds` (one, or a list with `null` last, as schemars
/// writes an `Option`'s), unless there are none.
fn set_kinds(object: &mut JsonObject, kinds: BTreeSet<String>) {
    let (nulls, mut kinds): (Vec<String>, Vec<String>) =
        kinds.into_iter().partition(|kind| kind == "null");
    kinds.extend(nulls);
    let mut kinds: Vec<Value> = kinds.into_iter().map(Value::String).collect();
    let kinds = match kinds.len() {
        0 => return,
        1 => kinds.remove(0),
        _ => Value::Array(kinds),
    };
    object.insert("type".to_owned(), kinds);
}

/// An output's schema without `default`s: the server writes every field.
fn without_defaults(schema: &mut JsonObject) {
    schema.remove("default");
    for value in schema.values_mut() {
        match value {
            Value::Object(object) => without_defaults(object),
            Value::Array(items) => items.iter_mut().for_each(|item| {
                if let Value::Object(object) = item {
                    without_defaults(object);
                }
            }),
            _ => {}
        }
    }
}

/// `$defs` that nothing refers to any more (an outlined field's type).
fn drop_unused_definitions(schema: &mut JsonObject) {
    let Some(Value::Object(mut definitions)) = schema.remove("$defs") else {
        return;
    };
    let mut used = BTreeSet::new();
    references(&Value::Object(schema.clone()), &mut used);
    // A kept definition may name others.
    loop {
        let before = used.len();
        for (name, definition) in &definitions {
            if used.contains(name) {
                references(definition, &mut used);
            }
        }
        if used.len() == before {
            break;
        }
    }
    definitions.retain(|name, _| used.contains(name));
    if !definitions.is_empty() {
        schema.insert("$defs".to_owned(), Value::Object(definitions));
    }
}

/// The names of the `$defs` that `schema` refers to.
fn references(schema: &Value, used: &mut BTreeSet<String>) {
    match schema {
        Value::Object(object) => {
            if let Some(name) = object
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|reference| reference.strip_prefix("#/$defs/"))
            {
                used.insert(name.to_owned());
            }
            object.values().for_each(|value| references(value, used));
        }
        Value::Array(items) => items.iter().for_each(|item| references(item, used)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use agentos_proto::payload::{HelloReply, TaskKind};
    use agentos_proto::ErrorCode;
    use serde::Serialize;
    use serde_json::json;

    use super::*;

    /// A reply with what an output schema makes brief.
    #[derive(Serialize, JsonSchema)]
    struct Reply {
        /// Always true.
        success: bool,
        /// Why not.
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<ErrorCode>,
        /// How many.
        count: u64,
        /// What it held.
        inner: Option<Inner>,
        /// Which kind.
        kind: TaskKind,
    }

    /// Something nested.
    ///
    /// ```
    /// let x = 1;
    /// ```
    #[derive(Serialize, JsonSchema)]
    struct Inner {
        /// A figure.
        figure: u32,
    }

    #[test]
    fn an_output_says_its_fields_once_and_briefly() {
        let schema = Value::Object(output::<Reply>().as_ref().clone());
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "count": {"description": "How many.", "type": "integer", "minimum": 0},
                    "inner": {"description": "What it held.", "type": ["object", "null"]},
                    "kind": {
                        "description": "Which kind.",
                        "type": "string",
                        "enum": ["exec", "think", "prompt"]
                    }
                },
                "required": ["count", "inner", "kind"]
            })
        );
    }

    #[test]
    fn an_input_keeps_its_objects_and_loses_examples_and_formats() {
        let schema = Value::Object(input::<Inner>().as_ref().clone());
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "figure": {"description": "A figure.", "type": "integer", "minimum": 0}
                },
                "required": ["figure"]
            })
        );
        let mut described = json!({"description": "Something nested.\n\n```\nlet x = 1;\n```"});
        tidy(&mut described);
        assert_eq!(described, json!({"description": "Something nested."}));
    }

    #[test]
    fn a_recursive_type_outlined_leaves_no_definition_behind() {
        let schema = output::<HelloReply>();
        assert!(!schema.contains_key("$defs"), "{schema:?}");
        let principal = schema
            .get("properties")
            .and_then(|properties| properties.get("principal"))
            .expect("a principal");
        assert_eq!(principal.get("type"), Some(&json!(["object", "null"])));
    }
}
