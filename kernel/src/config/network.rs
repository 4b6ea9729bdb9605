//! Network egress settings: the `[network]` table of the config file.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use agentos_egress::policy::Policy;
use agentos_egress::proxy::{Credential, ProxySettings};
use agentos_proto::payload::NetworkPolicy;
use serde::Deserialize;

use super::common::ConfigError;

/// What sandboxes may reach, and how the egress proxy serves them.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkConfig {
    /// The policy a SPAWN or EXEC that leaves out `network` gets (within
    /// its caller's own); empty with `default_deny`: loopback only.
    pub default_allow: Vec<String>,
    /// Its deny list.
    pub default_deny: Vec<String>,
    /// Connections one sandbox may have open through the proxy at once.
    pub max_connections: usize,
    /// A client must send its whole request head (and a tunnel its TLS
    /// ClientHello) within this time, in milliseconds.
    pub head_timeout_ms: u64,
    /// Resolving and connecting upstream must finish within this time.
    pub connect_timeout_ms: u64,
    /// A PEM file of certificates the proxy trusts upstream besides the
    /// public roots (for intercepted hosts).
    pub extra_ca: Option<PathBuf>,
    /// Names the proxy answers without DNS: `{"name" = "address"}` or a
    /// list of addresses. For tests and private names.
    pub resolve: BTreeMap<String, Addresses>,
    /// Headers the proxy adds to requests for a host; the sandbox never
    /// holds them.
    pub credentials: Vec<CredentialConfig>,
}

/// One address or several.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Addresses {
    One(IpAddr),
    Many(Vec<IpAddr>),
}

/// A `[[network.credentials]]` entry.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// The host (exact name) whose requests get the header.
    pub host: String,
    /// The header's name, e.g. `Authorization`.
    pub header: String,
    /// The header's value, e.g. `Bearer sk-...`.
    pub value: Option<String>,
    /// ... or the kernel's environment variable that holds it.
    pub from_env: Option<String>,
    /// Put before `from_env`'s value, e.g. `Bearer ` (an API key variable
    /// holds the key alone).
    #[serde(default)]
    pub prefix: String,
}

impl fmt::Debug for CredentialConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialConfig")
            .field("host", &self.host)
            .field("header", &self.header)
            .field("from_env", &self.from_env)
            .finish_non_exhaustive()
    }
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            default_allow: Vec::new(),
            default_deny: Vec::new(),
            max_connections: 256,
            head_timeout_ms: 10_000,
            connect_timeout_ms: 10_000,
            extra_ca: None,
            resolve: BTreeMap::new(),
            credentials: Vec::new(),
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

impl NetworkConfig {
    /// The default policy, if there is one (`None`: loopback only).
    pub fn default_policy(&self) -> Result<Option<Policy>, ConfigError> {
        if self.default_allow.is_empty() {
            return Ok(None);
        }
        let lists = NetworkPolicy {
            allow: self.default_allow.clone(),
            deny: self.default_deny.clone(),
        };
        Policy::from_proto(&lists)
            .map(Some)
            .map_err(|why| invalid("network.default_allow", why.under("network.default_")))
    }

    /// Checks every setting (a credential's environment variable must be
    /// set only when the kernel starts: see [`NetworkConfig::proxy_settings`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.default_policy()?;
        if self.max_connections == 0 {
            return Err(invalid("network.max_connections", "must be at least 1"));
        }
        for (field, ms) in [
            ("network.head_timeout_ms", self.head_timeout_ms),
            ("network.connect_timeout_ms", self.connect_timeout_ms),
        ] {
            if !(100..=600_000).contains(&ms) {
                return Err(invalid(field, "must be between 100 and 600000"));
            }
        }
        for name in self.resolve.keys() {
            if name.is_empty() || name.len() > 253 || name.contains(|c: char| c.is_whitespace()) {
                return Err(invalid(
                    "network.resolve",
                    format!("{name:?} is not a host name"),
                ));
            }
        }
        self.credentials(|_| Some(String::new()))?;
        Ok(())
    }

    /// The credentials, each `from_env` value read with `env` (checking a
    /// file reads none: the variable is the running kernel's business).
    fn credentials(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<Credential>, ConfigError> {
        self.credentials
            .iter()
            .map(|entry| {
                let bad = |why: &str| {
                    invalid(
                        "network.credentials",
                        format!("host {:?}: {why}", entry.host),
                    )
                };
                if entry.host.is_empty() || entry.host.contains(['/', ':', ' ', '*']) {
                    return Err(bad("`host` must be a plain host name"));
                }
                let header_ok = !entry.header.is_empty()
                    && entry
                        .header
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
                if !header_ok {
                    return Err(bad("`header` must be an HTTP header name"));
                }
                let value = match (&entry.value, &entry.from_env) {
                    (Some(value), None) => value.clone(),
                    (None, Some(var)) => {
                        let key = env(var).ok_or_else(|| {
                            bad(&format!(
                                "`from_env`: the kernel's environment has no {var}"
                            ))
                        })?;
                        format!("{}{key}", entry.prefix)
                    }
                    _ => return Err(bad("give `value` or `from_env`, one of them")),
                };
                if entry.value.is_some() && !entry.prefix.is_empty() {
                    return Err(bad("`prefix` goes with `from_env`; put it in `value`"));
                }
                if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                    return Err(bad("the value may not hold line breaks"));
                }
                Ok(Credential {
                    host: entry.host.to_ascii_lowercase(),
                    header: entry.header.clone(),
                    value,
                })
            })
            .collect()
    }

    /// The names answered without DNS (lower case, no trailing dot).
    pub fn resolved_names(&self) -> HashMap<String, Vec<IpAddr>> {
        self.resolve
            .iter()
            .map(|(name, addresses)| {
                let list = match addresses {
                    Addresses::One(one) => vec![*one],
                    Addresses::Many(many) => many.clone(),
                };
                (name.trim_end_matches('.').to_ascii_lowercase(), list)
            })
            .collect()
    }

    /// The extra roots, as PEM (empty without `extra_ca`).
    pub fn extra_roots_pem(&self) -> Result<Vec<u8>, ConfigError> {
        match &self.extra_ca {
            Some(path) => std::fs::read(path)
                .map_err(|err| invalid("network.extra_ca", format!("{}: {err}", path.display()))),
            None => Ok(Vec::new()),
        }
    }

    /// What the egress proxy is started with.
    pub fn proxy_settings(&self) -> Result<ProxySettings, ConfigError> {
        let extra_roots_pem = self.extra_roots_pem()?;
        let resolve = self.resolved_names();
        Ok(ProxySettings {
            resolve,
            extra_roots_pem,
            credentials: self.credentials(|var| std::env::var(var).ok())?,
            max_connections: self.max_connections,
            head_timeout: Duration::from_millis(self.head_timeout_ms),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> NetworkConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_default_policy_and_resolver_entries_are_read_and_checked() {
        let config = parse(
            r#"
            default_allow = ["*.pypi.org:443", "files.pythonhosted.org:443"]
            resolve = { "allowed.test" = "127.0.0.1", "two.test" = ["127.0.0.1", "::1"] }
            "#,
        );
        assert!(config.validate().is_ok());
        assert!(config.default_policy().unwrap().is_some());
        let settings = config.proxy_settings().unwrap();
        assert_eq!(settings.resolve["two.test"].len(), 2);
        let bad = parse(r#"default_allow = ["*.pypi.org:99999"]"#);
        let Err(ConfigError::Invalid { reason, .. }) = bad.validate() else {
            panic!("a port out of range was accepted");
        };
        assert!(reason.contains("default_allow[0]"), "{reason}");
        // The field is named under `network.default_`; the entry, as written.
        let bad = parse(
            r#"
            default_allow = ["a.example"]
            default_deny = ["network.example:0"]
            "#,
        );
        let Err(ConfigError::Invalid { reason, .. }) = bad.validate() else {
            panic!("a port out of range was accepted");
        };
        assert_eq!(
            reason,
            r#"network.default_deny[0] "network.example:0": port "0" is not 1 to 65535"#
        );
    }

    #[test]
    fn credentials_need_one_value_and_never_show_it() {
        let both = parse(
            r#"
            [[credentials]]
            host = "api.example.com"
            header = "Authorization"
            value = "Bearer secret-value"
            from_env = "X"
            "#,
        );
        assert!(both.validate().is_err());
        let good = parse(
            r#"
            [[credentials]]
            host = "API.example.com"
            header = "Authorization"
            value = "Bearer secret-value"
            "#,
        );
        assert!(good.validate().is_ok());
        assert!(!format!("{good:?}").contains("secret-value"));
        let settings = good.proxy_settings().unwrap();
        assert_eq!(settings.credentials[0].host, "api.example.com");
        assert!(!format!("{settings:?}").contains("secret-value"));
        let missing = parse(
            r#"
            [[credentials]]
            host = "api.example.com"
            header = "Authorization"
            from_env = "UNSET_VARIABLE_OF_A_CONFIG_TEST"
            "#,
        );
        assert!(missing.validate().is_ok(), "checked as a file");
        let Err(ConfigError::Invalid { reason, .. }) = missing.proxy_settings() else {
            panic!("a kernel started without the credential's variable");
        };
        assert!(
            reason.contains("UNSET_VARIABLE_OF_A_CONFIG_TEST"),
            "{reason}"
        );
    }
}
