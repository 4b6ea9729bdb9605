//! What the kernel reads of a tool's JSON Schema: its properties in the
//! order the server gave them, which of them are required, and each one's
//! type, description and default. Schemas come from servers and may be
//! odd (`"required": "path"`, a property that is a string): what cannot be
//! read is left out, never an error.

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// An object schema, as far as it reads.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ObjectSchema {
    #[serde(deserialize_with = "lenient")]
    properties: Map<String, Value>,
    #[serde(deserialize_with = "lenient")]
    required: Vec<Value>,
}

/// One property of an object schema, as far as it reads.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Property {
    /// `type`, when it is one name (not a list of them).
    #[serde(rename = "type", deserialize_with = "lenient")]
    pub kind: Option<String>,
    /// `$ref`: the definition the property's type is.
    #[serde(rename = "$ref", deserialize_with = "lenient")]
    pub reference: Option<String>,
    #[serde(deserialize_with = "lenient")]
    pub description: Option<String>,
    /// `default`, when present (a `null` default is one).
    #[serde(deserialize_with = "present")]
    pub default: Option<Value>,
}

impl ObjectSchema {
    /// Reads `schema`; anything but an object reads as no properties.
    pub fn read(schema: &Value) -> ObjectSchema {
        ObjectSchema::deserialize(schema).unwrap_or_default()
    }

    /// The names `required` lists, in its order.
    pub fn required(&self) -> Vec<&str> {
        self.required.iter().filter_map(Value::as_str).collect()
    }

    /// The properties, in the schema's order.
    pub fn properties(&self) -> impl Iterator<Item = (&str, Property)> + '_ {
        self.properties
            .iter()
            .map(|(name, spec)| (name.as_str(), Property::read(spec)))
    }

    /// The property called `name`, if the schema has it.
    pub fn property(&self, name: &str) -> Option<Property> {
        self.properties.get(name).map(Property::read)
    }
}

impl Property {
    fn read(spec: &Value) -> Property {
        Property::deserialize(spec).unwrap_or_default()
    }
}

/// A field that does not read as `T` reads as `T`'s default.
fn lenient<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    deserializer: D,
) -> Result<T, D::Error> {
    let value = Value::deserialize(deserializer)?;
    Ok(T::deserialize(value).unwrap_or_default())
}

/// A field that is present, `null` included.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn odd_schemas_read_as_far_as_they_go() {
        let schema = ObjectSchema::read(&json!({
            "properties": {
                "b": {"type": "string", "description": "B", "default": null},
                "a": {"type": ["integer", "null"], "$ref": "#/$defs/A"},
                "c": "not a schema",
            },
            "required": ["a", 7],
        }));
        assert_eq!(schema.required(), ["a"]);
        let read: Vec<(&str, Property)> = schema.properties().collect();
        assert_eq!(
            read.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            ["b", "a", "c"]
        );
        assert_eq!(read[0].1.kind.as_deref(), Some("string"));
        assert_eq!(read[0].1.default, Some(Value::Null));
        assert_eq!(read[1].1.kind, None);
        assert_eq!(read[1].1.reference.as_deref(), Some("#/$defs/A"));
        assert_eq!(read[2].1.description, None);
        assert!(ObjectSchema::read(&json!("x"))
            .properties()
            .next()
            .is_none());
        assert!(ObjectSchema::read(&json!({"required": "a"}))
            .required()
            .is_empty());
    }
}
