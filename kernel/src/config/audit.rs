//! The audit log's settings: the `[audit]` table of the config file.

use serde::Deserialize;

use super::common::ConfigError;

/// How much the audit log keeps, and whether it records TOOL calls.
/// Security and lifecycle entries are always recorded.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditSettings {
    /// The most entries kept; the oldest go first. SET_AUDIT_CONFIG may
    /// lower it, never raise it above this.
    pub max_entries: u64,
    /// Record every TOOL call (category `SYSCALL`).
    pub log_syscalls: bool,
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            max_entries: 100_000,
            log_syscalls: false,
        }
    }
}

impl AuditSettings {
    /// Checks every setting against its allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_entries == 0 {
            return Err(ConfigError::Invalid {
                field: "audit.max_entries",
                reason: "must be at least 1".to_owned(),
            });
        }
        Ok(())
    }
}
