//! The fleet's settings: the `[fleet]` table of the config file.
//!
//! With no `database`, the node is alone: nothing else here matters and no
//! database is needed.

use std::fmt;

use serde::{Deserialize, Deserializer};

use super::common::ConfigError;

/// How this node joins a fleet of nodes sharing one PostgreSQL database.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// The fleet's database, `postgresql://USER:PASSWORD@HOST:PORT/DB`
    /// (or `AGENTOS_FLEET_DATABASE`). Never logged with its password.
    pub database: Option<DatabaseUrl>,
    /// This node's name in the fleet. Default: the host name.
    pub node: Option<String>,
    /// Where other nodes reach this node's `agentos e2b` face
    /// (`http://HOST:PORT`).
    pub advertise: Option<String>,
    /// Where other nodes reach this node's `agentos mcp --http` face
    /// (`http://HOST:PORT`).
    pub advertise_mcp: Option<String>,
    /// How long a node's lease lasts unrenewed, in milliseconds: a node
    /// silent for longer is dead to the fleet, by the database's clock.
    pub lease_ms: u64,
    /// How long connecting to the database may take, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Fleet tasks this node runs at once.
    pub max_tasks: usize,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            database: None,
            node: None,
            advertise: None,
            advertise_mcp: None,
            lease_ms: 10_000,
            connect_timeout_ms: 5_000,
            max_tasks: 8,
        }
    }
}

impl FleetConfig {
    /// This node's name: the configured one, else the host name.
    pub fn node_name(&self) -> String {
        self.node.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|name| name.into_string().ok())
                .unwrap_or_else(|| "localhost".into())
        })
    }

    /// Checks every setting against its allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason: String| Err(ConfigError::Invalid { field, reason });
        if let Some(url) = &self.database {
            if !(url.0.starts_with("postgresql://") || url.0.starts_with("postgres://")) {
                return invalid("fleet.database", "must be a postgresql:// URL".into());
            }
        }
        if let Some(name) = &self.node {
            if !is_node_name(name) {
                return invalid(
                    "fleet.node",
                    format!("{name:?} is not 1-63 letters, digits, '-', '_' or '.'"),
                );
            }
        }
        for (field, url) in [
            ("fleet.advertise", &self.advertise),
            ("fleet.advertise_mcp", &self.advertise_mcp),
        ] {
            if let Some(url) = url {
                if !is_face_address(url) {
                    return invalid(field, format!("{url:?} is not http://HOST:PORT"));
                }
            }
        }
        if !(1_000..=600_000).contains(&self.lease_ms) {
            return invalid(
                "fleet.lease_ms",
                format!("{} is outside 1000..=600000", self.lease_ms),
            );
        }
        if !(100..=60_000).contains(&self.connect_timeout_ms) {
            return invalid(
                "fleet.connect_timeout_ms",
                format!("{} is outside 100..=60000", self.connect_timeout_ms),
            );
        }
        if !(1..=1024).contains(&self.max_tasks) {
            return invalid(
                "fleet.max_tasks",
                format!("{} is outside 1..=1024", self.max_tasks),
            );
        }
        Ok(())
    }
}

/// Whether `url` is where another node's face can reach this one's:
/// `http://HOST:PORT` (a path after it is ignored). The faces speak plain
/// HTTP to each other, proving themselves by the fleet's secret.
fn is_face_address(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or_default();
    authority
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// Whether `name` can name a node: it goes into ids and URLs unquoted.
pub fn is_node_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A database URL that may hold a password: shown with the password
/// replaced, so neither logs nor errors carry it.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// The URL, password included, for the database client alone.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl From<String> for DatabaseUrl {
    fn from(url: String) -> Self {
        DatabaseUrl(url)
    }
}

impl<'de> Deserialize<'de> for DatabaseUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(DatabaseUrl)
    }
}

impl fmt::Display for DatabaseUrl {
    /// `postgresql://user:***@host/db`: everything but the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = &self.0;
        let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
            return f.write_str("***");
        };
        // The last `@` ends the user's part, whatever the password holds
        // (an unescaped `/`, `?` or `@`): more is hidden, never less.
        let (user, rest) = match url[scheme_end..].rfind('@') {
            Some(at) => {
                let userinfo = &url[scheme_end..scheme_end + at];
                let name = userinfo.split(':').next().unwrap_or("");
                let hidden = if userinfo.contains(':') { ":***" } else { "" };
                (format!("{name}{hidden}"), &url[scheme_end + at..])
            }
            None => (String::new(), &url[scheme_end..]),
        };
        // A password may also come as a parameter.
        let rest = match rest.split_once('?') {
            Some((place, query)) => {
                let query: Vec<String> = query
                    .split('&')
                    .map(|pair| match pair.split_once('=') {
                        Some((key, _)) if key.eq_ignore_ascii_case("password") => {
                            format!("{key}=***")
                        }
                        _ => pair.to_owned(),
                    })
                    .collect();
                format!("{place}?{}", query.join("&"))
            }
            None => rest.to_owned(),
        };
        write!(f, "{}{user}{rest}", &url[..scheme_end])
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_url_is_shown_without_its_password() {
        let url = DatabaseUrl::from("postgresql://fleet:s3cret@10.0.0.1:5432/agentos".to_owned());
        assert_eq!(
            url.to_string(),
            "postgresql://fleet:***@10.0.0.1:5432/agentos"
        );
        assert!(!format!("{url:?}").contains("s3cret"));
        let no_password = DatabaseUrl::from("postgresql://fleet@db/agentos".to_owned());
        assert_eq!(no_password.to_string(), "postgresql://fleet@db/agentos");
        // An '@' in a password, left unescaped, still never shows.
        let odd = DatabaseUrl::from("postgres://u:p@ss@db:1/x?sslmode=disable".to_owned());
        assert!(!odd.to_string().contains("p@ss"), "{odd}");
        assert_eq!(DatabaseUrl::from("s3cret".to_owned()).to_string(), "***");
        for url in [
            "postgresql://u:pa/ss@db/x",
            "postgresql://u:pa?ss@db/x",
            "postgresql://db/x?user=u&password=s3cret&sslmode=disable",
            "postgresql://db/x?PASSWORD=s3cret",
        ] {
            let shown = DatabaseUrl::from(url.to_owned()).to_string();
            assert!(
                !shown.contains("s3cret") && !shown.contains("pa/ss") && !shown.contains("pa?ss"),
                "{shown}"
            );
        }
        assert_eq!(
            DatabaseUrl::from("postgresql://db/x?user=u&password=s3cret".to_owned()).to_string(),
            "postgresql://db/x?user=u&password=***"
        );
    }

    #[test]
    fn node_names_are_checked() {
        let mut config = FleetConfig {
            database: Some(DatabaseUrl::from("postgresql://db/x".to_owned())),
            ..FleetConfig::default()
        };
        assert!(config.validate().is_ok());
        for bad in ["", "a/b", "a b", &"n".repeat(64)] {
            config.node = Some(bad.into());
            assert!(config.validate().is_err(), "{bad:?}");
        }
        config.node = Some("node-1.eu_west".into());
        assert!(config.validate().is_ok());
        config.database = Some(DatabaseUrl::from("mysql://db/x".to_owned()));
        assert!(config.validate().is_err());
    }

    #[test]
    fn faces_are_advertised_as_plain_http_with_a_port() {
        let mut config = FleetConfig::default();
        for good in ["http://10.0.0.2:3000", "http://n2.internal:8765/mcp"] {
            config.advertise_mcp = Some(good.into());
            assert!(config.validate().is_ok(), "{good}");
        }
        for bad in [
            "https://10.0.0.2:3000",
            "http://10.0.0.2",
            "10.0.0.2:3000",
            "http://:80",
        ] {
            config.advertise = Some(bad.into());
            assert!(config.validate().is_err(), "{bad}");
            config.advertise = None;
            config.advertise_mcp = Some(bad.into());
            assert!(config.validate().is_err(), "{bad}");
        }
    }
}
