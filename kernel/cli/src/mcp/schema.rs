//! The tools' JSON schemas: every output schema is an object, and an
//! input schema is derived from the arguments' type (proto's, where the
//! arguments are its type, the server's for the rest).
//!
//! Every client reads the whole tool list, and many put all of it before
//! their model at every turn, so each schema says what a caller needs and
//! nothing twice. This file is the one place that decides how much.
//!
//! An input schema is each argument's type (and `enum`), and what is
//! `required`. The server reads every call strictly and refuses what does
//! not fit by name (`arguments::read`: an unknown argument at any depth, a
//! wrong type), as the kernel refuses a value out of its range, naming
//! the field: that tells a model more than a client's validator would,
//! so the schema leaves out what only a validator needs:
//! - no `additionalProperties` (`false` where a type refuses unknown
//!   fields, a map's value type), no `minimum` or `maximum`, no `default`
//!   (what a tool does with an argument left out is the kernel's, and a
//!   description says it where it matters: Python is `exec`'s language);
//! - no `$schema` (MCP fixes the draft, 2020-12), no `$defs` (every type
//!   is written where it is used), no `format` (`uint64` and the like);
//! - an optional argument is its type, not "its type or null": leaving it
//!   out is how a caller leaves it unset;
//! - an enum of names is an `enum` of the names (what each means stays in
//!   proto's documentation).
//!
//! Descriptions are few: the tool's own, one sentence, and an argument's
//! only where its name alone would mislead (`exec`'s `session`, a network
//! policy), from its field's doc comment, up to any example. No type's
//! doc comment (at the top, the tool's description says what the type
//! would; at an argument, its field says what it is for there), nothing
//! within an argument (a network policy's `allow` and `deny` are said by
//! the policy's one sentence), and none of proto's field doc comments
//! where the arguments are proto's type (`input_undescribed`): they are
//! written for the protocol's readers.
//!
//! An output schema is `{"type": "object"}` and no more. A model reads
//! the result itself, whose structured content is the kernel's reply as
//! proto documents it; naming its fields in every listing cost a third of
//! the list and told a model nothing the result does not. A reply that
//! becomes a tool's result is no refusal (a refusal is a tool error,
//! flagged `isError`), so the fields that would say it was (`success`,
//! `code`) are left out of the content (see `results`).

use std::collections::BTreeSet;
use std::sync::Arc;

use rmcp::model::JsonObject;
use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::Value;

/// The fields by which a kernel reply says whether it is a refusal,
/// which a tool's structured content leaves out.
pub const REFUSAL_FIELDS: [&str; 2] = ["success", "code"];

/// What an input schema leaves to the server's reading of the call.
const LEFT_TO_THE_SERVER: [&str; 4] = ["additionalProperties", "minimum", "maximum", "default"];

/// The input schema of a tool whose arguments are `T`: what `T` reads.
///
/// # Panics
///
/// If `T`'s schema is not an object's (a tool's arguments are an object),
/// or if an argument's type contains itself (which no caller could write
/// out briefly): a mistake in the tool modules, found by the first
/// tools/list (and the tests).
pub fn input<T: JsonSchema>() -> Arc<JsonObject> {
    let settings = SchemaSettings::draft2020_12()
        .for_deserialize()
        .with(|settings| settings.meta_schema = None);
    let generated = settings
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value();
    let Value::Object(mut schema) = generated else {
        // `true`, which only a type that holds any JSON derives.
        panic!("a tool's arguments are an object");
    };
    let definitions = match schema.remove("$defs") {
        Some(Value::Object(definitions)) => definitions,
        _ => JsonObject::new(),
    };
    inline(&mut schema, &definitions, &mut Vec::new());
    as_written(&mut schema);
    // The type's own name and doc comment: the tool's say them better.
    schema.remove("title");
    schema.remove("description");
    for_each_subschema(&mut schema, described_once);
    assert_eq!(
        schema.get("type").and_then(Value::as_str),
        Some("object"),
        "a tool's arguments are an object"
    );
    Arc::new(schema)
}

/// The input schema of a tool whose arguments are proto's type `T`, with
/// no argument described: proto's doc comments are written for readers
/// of the protocol, and the tool's description says what a caller needs.
pub fn input_undescribed<T: JsonSchema>() -> Arc<JsonObject> {
    let mut schema = input::<T>();
    for_each_subschema(Arc::make_mut(&mut schema), undescribed);
    schema
}

/// The output schema of every tool: an object, which is all it says.
pub fn output() -> Arc<JsonObject> {
    let mut schema = JsonObject::new();
    schema.insert("type".to_owned(), Value::String("object".to_owned()));
    Arc::new(schema)
}

/// Calls `visit` on each schema directly within `schema`, and on nothing
/// that only looks like one: the keys of `properties` are names, which
/// may be any word (`default`, `format`), and an `enum`'s or a
/// `default`'s values are values.
fn for_each_subschema(schema: &mut JsonObject, mut visit: impl FnMut(&mut Value)) {
    for (key, value) in schema.iter_mut() {
        match (key.as_str(), value) {
            ("properties", Value::Object(named)) => named.values_mut().for_each(&mut visit),
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(alternatives)) => {
                alternatives.iter_mut().for_each(&mut visit)
            }
            ("items" | "additionalProperties" | "not", value) => visit(value),
            _ => {}
        }
    }
}

/// `schema` with every reference to a type's definition replaced by the
/// definition, but for the type's name and doc comment (see the module's
/// documentation). `open` holds the definitions being written, in which
/// a reference to one of them would never end.
fn inline(schema: &mut JsonObject, definitions: &JsonObject, open: &mut Vec<String>) {
    let referred = match schema.remove("$ref") {
        Some(Value::String(reference)) => reference.strip_prefix("#/$defs/").map(str::to_owned),
        _ => None,
    };
    if let Some(name) = &referred {
        assert!(
            !open.contains(name),
            "an argument's type {name} contains itself"
        );
        let definition = definitions.get(name).and_then(Value::as_object);
        for (key, value) in definition.into_iter().flatten() {
            // The field's own keys (its description) win over its type's.
            if !matches!(key.as_str(), "title" | "description") {
                schema.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
        open.push(name.clone());
    }
    for_each_subschema(schema, |subschema| {
        if let Value::Object(subschema) = subschema {
            inline(subschema, definitions, open);
        }
    });
    if referred.is_some() {
        open.pop();
    }
}

/// The rules every input schema follows, at every level: an optional
/// argument as its own type, an enum of names as an `enum`, a description
/// up to its example, and nothing of what is left to the server.
fn as_written(schema: &mut JsonObject) {
    // First, as an `Option`'s schema brings its type's keys up.
    without_null(schema);
    for left_out in LEFT_TO_THE_SERVER.into_iter().chain(["format"]) {
        schema.remove(left_out);
    }
    if let Some(Value::String(description)) = schema.get_mut("description") {
        shorten(description);
    }
    for_each_subschema(schema, |subschema| {
        if let Value::Object(subschema) = subschema {
            as_written(subschema);
        }
    });
    names_as_enum(schema);
}

/// An argument's schema with its own description and none within.
fn described_once(argument: &mut Value) {
    if let Value::Object(argument) = argument {
        for_each_subschema(argument, undescribed);
    }
}

/// `schema` without any description, at any level.
fn undescribed(schema: &mut Value) {
    if let Value::Object(object) = schema {
        object.remove("description");
        for_each_subschema(object, undescribed);
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

/// An `Option`'s schema without its `null`: `"type": ["string", "null"]`
/// as `"type": "string"`, and `anyOf` a schema or `null` as that schema,
/// whose keys the outer ones (the field's own description) override.
fn without_null(object: &mut JsonObject) {
    if let Some(Value::Array(kinds)) = object.get_mut("type") {
        kinds.retain(|kind| kind != "null");
        if let [kind] = kinds.as_slice() {
            let kind = kind.clone();
            object.insert("type".to_owned(), kind);
        }
    }
    let Some(Value::Array(alternatives)) = object.get("anyOf") else {
        return;
    };
    let mut kept = alternatives
        .iter()
        .filter(|alternative| !is_null(alternative));
    let (Some(Value::Object(only)), None) = (kept.next(), kept.next()) else {
        return;
    };
    let only = only.clone();
    object.remove("anyOf");
    for (key, value) in only {
        object.entry(key).or_insert(value);
    }
}

/// Whether `schema` allows `null` alone.
fn is_null(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("null")
}

#[cfg(test)]
mod tests {
    use agentos_proto::payload::{Language, TaskKind};
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    /// Something nested, whose doc comment no schema repeats.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        /// A figure, said by the argument that holds it if at all.
        #[schemars(range(min = 1, max = 9))]
        figure: u32,
    }

    /// Arguments with what an input schema writes briefly.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Arguments {
        /// Which one.
        ///
        /// ```
        /// let x = 1;
        /// ```
        name: Option<String>,
        #[serde(default)]
        language: Language,
        kind: Option<TaskKind>,
        #[serde(default)]
        all: bool,
        #[serde(default)]
        words: Vec<String>,
        #[serde(default)]
        env: std::collections::BTreeMap<String, String>,
        /// Held within.
        inner: Option<Inner>,
        // Names that are keywords elsewhere.
        default: Option<String>,
        format: Option<String>,
    }

    #[test]
    fn an_input_says_each_thing_once() {
        let schema = Value::Object(input::<Arguments>().as_ref().clone());
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "Which one."},
                    "language": {"type": "string", "enum": ["python", "bash"]},
                    "kind": {"type": "string", "enum": ["exec", "think", "prompt"]},
                    "all": {"type": "boolean"},
                    "words": {"type": "array", "items": {"type": "string"}},
                    "env": {"type": "object"},
                    "inner": {
                        "type": "object",
                        "description": "Held within.",
                        "properties": {"figure": {"type": "integer"}},
                        "required": ["figure"]
                    },
                    "default": {"type": "string"},
                    "format": {"type": "string"}
                }
            })
        );
    }

    #[test]
    fn proto_arguments_are_undescribed() {
        /// A type from elsewhere.
        #[derive(Deserialize, JsonSchema)]
        #[allow(dead_code)]
        struct Elsewhere {
            /// Written for another reader.
            prompt: String,
        }
        let schema = Value::Object(input_undescribed::<Elsewhere>().as_ref().clone());
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {"prompt": {"type": "string"}},
                "required": ["prompt"]
            })
        );
    }

    /// A type that contains itself.
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Tree {
        children: Vec<Tree>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Planting {
        tree: Tree,
    }

    #[test]
    #[should_panic(expected = "contains itself")]
    fn an_argument_that_contains_itself_is_a_mistake_found_at_once() {
        input::<Planting>();
    }

    #[test]
    fn every_output_says_only_that_it_is_an_object() {
        assert_eq!(
            Value::Object(output().as_ref().clone()),
            json!({"type": "object"})
        );
    }
}
