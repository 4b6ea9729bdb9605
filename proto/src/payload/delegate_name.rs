//! A delegate principal's name (see DELEGATE): safe in a path and in
//! the kernel's text forms, and kept inline.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, ErrorReply};

/// The longest delegate name.
pub const MAX_DELEGATE_NAME_LEN: usize = 48;

/// A delegate's name: 1 to 48 of `A-Z a-z 0-9 _ . -`, not starting with
/// `.` and never holding `..`, so that it is safe in a path and in the
/// kernel's text forms. Kept inline, so the principals that carry it stay
/// `Copy`.
///
/// ```
/// use agentos_proto::payload::DelegateName;
/// assert_eq!(DelegateName::new("e2b.alice").unwrap().as_str(), "e2b.alice");
/// for bad in ["", ".hidden", "a..b", "a/b", "a~b", "é", &"x".repeat(49)] {
///     assert!(DelegateName::new(bad).is_err(), "{bad:?}");
/// }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DelegateName {
    bytes: [u8; MAX_DELEGATE_NAME_LEN],
    len: u8,
}

impl DelegateName {
    /// `name`, if it is a delegate's name; else why not.
    pub fn new(name: &str) -> Result<DelegateName, ErrorReply> {
        let refuse = |why: &str| {
            ErrorReply::new(
                ErrorCode::BadRequest,
                format!("delegate name {name:?}: {why}"),
            )
        };
        if name.is_empty() || name.len() > MAX_DELEGATE_NAME_LEN {
            return Err(refuse("it must be 1 to 48 characters long"));
        }
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-');
        if !name.bytes().all(allowed) {
            return Err(refuse("only A-Z, a-z, 0-9, `_`, `.` and `-` may be used"));
        }
        if name.starts_with('.') || name.contains("..") {
            return Err(refuse("it may not start with `.` or hold `..`"));
        }
        let mut bytes = [0; MAX_DELEGATE_NAME_LEN];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Ok(DelegateName {
            bytes,
            len: name.len() as u8,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored (see `new`).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl fmt::Debug for DelegateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for DelegateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for DelegateName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for DelegateName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        DelegateName::new(&name).map_err(|refused| serde::de::Error::custom(refused.error))
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for DelegateName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DelegateName".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // Not starting with `.`, and without `..`, besides.
        let mut schema = String::json_schema(generator);
        schema.insert("pattern".into(), "^[A-Za-z0-9_.-]{1,48}$".into());
        schema
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn a_name_that_passes_is_safe_in_a_path_and_round_trips(name in "\\PC{0,60}") {
            if let Ok(delegate) = DelegateName::new(&name) {
                prop_assert_eq!(delegate.as_str(), name.as_str());
                prop_assert!(name.len() <= MAX_DELEGATE_NAME_LEN);
                prop_assert!(!name.contains('/') && !name.contains("..") && !name.contains('~'));
                prop_assert!(!name.starts_with('.'));
                let json = serde_json::to_string(&delegate).unwrap();
                prop_assert_eq!(serde_json::from_str::<DelegateName>(&json).unwrap(), delegate);
            }
        }

        #[test]
        fn every_name_of_the_allowed_characters_passes(name in "[A-Za-z0-9_-][A-Za-z0-9_-]{0,47}") {
            prop_assert!(DelegateName::new(&name).is_ok());
        }
    }
}
