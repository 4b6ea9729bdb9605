//! The state store's settings: the `[state]` table of the config file.

use serde::Deserialize;

use super::common::ConfigError;

/// What one owner may keep in the state store (STORE, FETCH, DELETE,
/// KEYS). An owner is an operator's uid: the operator's own keys, its
/// tree's shared keys and the own keys of every agent in its tree count
/// together, so no tree can fill the disk for the others.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateConfig {
    /// Keys one owner may hold.
    pub max_keys_per_owner: u64,
    /// Bytes (keys and values, as JSON) one owner may hold.
    pub max_bytes_per_owner: u64,
    /// Bytes of one value, as JSON.
    pub max_value_bytes: u64,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            max_keys_per_owner: 10_000,
            max_bytes_per_owner: 64 << 20,
            max_value_bytes: 1 << 20,
        }
    }
}

impl StateConfig {
    /// Checks every setting against its allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: &str| {
            Err(ConfigError::Invalid {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.max_keys_per_owner == 0 {
            return invalid("state.max_keys_per_owner", "must be at least 1");
        }
        if self.max_value_bytes == 0 {
            return invalid("state.max_value_bytes", "must be at least 1");
        }
        if self.max_bytes_per_owner < self.max_value_bytes {
            return invalid(
                "state.max_bytes_per_owner",
                "must be at least state.max_value_bytes",
            );
        }
        Ok(())
    }
}
