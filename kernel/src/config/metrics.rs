//! Observability settings: the `[metrics]` table of the config file.

use serde::Deserialize;

use super::common::ConfigError;

/// Where the kernel serves its metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` or a Unix socket path serving `GET /metrics` in the
    /// Prometheus text format; none by default (`agentos metrics` works
    /// either way).
    pub listen: Option<String>,
}

impl MetricsConfig {
    /// Checks the address's form (binding it is the kernel's start).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let Some(listen) = &self.listen else {
            return Ok(());
        };
        let unix = listen.starts_with('/');
        let tcp = listen
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if unix || tcp {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                field: "metrics.listen",
                reason: format!(
                    "{listen:?}: give host:port (e.g. 127.0.0.1:9464) or an absolute socket path"
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_or_a_socket_path_is_accepted() {
        for good in ["127.0.0.1:9464", "[::1]:9464", "/run/agentos/metrics.sock"] {
            let config = MetricsConfig {
                listen: Some(good.into()),
            };
            assert!(config.validate().is_ok(), "{good}");
        }
        for bad in ["9464", "localhost", "relative/metrics.sock", "host:port"] {
            let config = MetricsConfig {
                listen: Some(bad.into()),
            };
            assert!(config.validate().is_err(), "{bad}");
        }
    }
}
