//! What a face is, the flags that place it, and everything decided from
//! them before the socket opens: a bad flag fails here, before anything
//! listens.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::fleet::FleetFace;
use crate::token::{default_token_path, effective_uid, Origin, Token, TokenError};

/// One HTTP face of the CLI (`agentos mcp --http`): what its messages,
/// its token and its endpoint are called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Face {
    /// The command's name (`mcp`): its messages start `agentos mcp:`,
    /// the token it makes is kept as `mcp-token`, and its bearer realm is
    /// `agentos mcp`.
    pub name: &'static str,
    /// The one path it answers on (`/mcp`); `/` for a face that routes
    /// every path itself.
    pub path: &'static str,
    /// The environment variable that may give the token (or, for a face
    /// with keys, a key). A token is never taken on the command line:
    /// argv is visible to every user in `ps`.
    pub token_env: &'static str,
    /// The largest request body passed on; a longer one is answered 413.
    pub max_body_bytes: usize,
}

/// `--http` and the flags that go with it.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `host:port`, `:port` or `port`.
    pub listen: String,
    pub token_file: Option<PathBuf>,
    /// Browser origins allowed besides the loopback ones.
    pub allow_origins: Vec<String>,
    /// `Host` header values allowed besides the defaults.
    pub allow_hosts: Vec<String>,
}

/// Why a face does not serve.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// `--http` is not an address to listen on.
    #[error("--http {0}: give host:port, :port or port (host an IP address or localhost)")]
    ListenAddress(String),
    /// An `--allow-origin` that would match nothing.
    #[error("--allow-origin {0}: give scheme://host, scheme://host:port or scheme://host:*")]
    Origin(String),
    /// A bind other machines can reach, with no token given.
    #[error(
        "--http {listen}: a bind other machines can reach needs a token: give --token-file PATH \
         or set {token_env}"
    )]
    NeedsToken {
        listen: String,
        token_env: &'static str,
    },
    /// A bind other machines can reach, with no keys to prove callers.
    #[error(
        "--listen {listen}: a bind other machines can reach needs keys: give --keys-file PATH \
         or set {keys_env}"
    )]
    NeedsKeys {
        listen: String,
        keys_env: &'static str,
    },
    #[error(transparent)]
    Token(#[from] TokenError),
    /// SIGINT and SIGTERM could not be caught.
    #[error(transparent)]
    Signals(std::io::Error),
    #[error("--http: cannot listen on {address}")]
    Listen {
        address: SocketAddr,
        #[source]
        error: std::io::Error,
    },
    /// The bound socket's own address could not be read.
    #[error(transparent)]
    BoundAddress(std::io::Error),
}

/// Everything decided before the socket opens, for a face whose every
/// request carries one bearer token.
#[derive(Debug)]
pub struct HttpPlan {
    pub(crate) listening: Listening,
    pub(crate) token: Token,
    pub(crate) token_origin: Origin,
    /// The face's part in a fleet: its gate answers other nodes'
    /// greetings ([`crate::fleet::GREETING_PATH`]).
    pub(crate) fleet: Option<Arc<FleetFace>>,
}

/// Everything decided before the socket opens, for a face that proves
/// its callers itself (API keys it knows, in headers of its protocol's):
/// every path and every request reaches its service.
#[derive(Debug)]
pub struct KeyedPlan {
    pub(crate) listening: Listening,
}

/// Where a face listens, whom it serves, and what its service accepts.
#[derive(Debug)]
pub(crate) struct Listening {
    pub(crate) face: Face,
    pub(crate) address: SocketAddr,
    allowed_origins: Vec<String>,
    /// Empty means any `Host`: only for a wildcard bind, which requires a
    /// given token or keys.
    allowed_hosts: Vec<String>,
    /// With a token this server made, or no keys, the one uid whose
    /// connections are served: given credentials may be shared, a made
    /// token is its user's.
    pub(crate) only_uid: Option<u32>,
}

/// What a face's service is told of the server it runs in: which `Host`
/// and `Origin` headers it is to accept (it checks them, as the protocol
/// it speaks says how to refuse them), and when the server stops.
#[derive(Debug, Clone)]
pub struct Site {
    /// Browser origins allowed: `scheme://host`, `scheme://host:port`,
    /// `scheme://host:*` or `null`.
    pub allowed_origins: Vec<String>,
    /// `Host` header values allowed; empty for any (a wildcard bind,
    /// which requires a given token).
    pub allowed_hosts: Vec<String>,
    /// The largest request body the service is given.
    pub max_body_bytes: usize,
    /// Cancelled when the server stops: responses still streaming end.
    pub stopping: CancellationToken,
}

impl HttpPlan {
    pub fn new(face: Face, options: &HttpOptions) -> Result<HttpPlan, HttpError> {
        let address = parse_listen_address(&options.listen)?;
        let loopback = address.ip().is_loopback();
        let given = match &options.token_file {
            Some(path) => Some(Token::from_file(path, "--token-file")?),
            None => match std::env::var_os(face.token_env) {
                Some(value) => Some(Token::new(
                    value.into_encoded_bytes(),
                    &format!("${}", face.token_env),
                )?),
                None => None,
            },
        };
        let (token, token_origin) = match given {
            Some(token) => (token, Origin::Given),
            None if !loopback => {
                return Err(HttpError::NeedsToken {
                    listen: options.listen.clone(),
                    token_env: face.token_env,
                })
            }
            // A loopback port is open to every local user, and to
            // sandboxes through the egress proxy: never without a token.
            None => Token::made_or_kept(&default_token_path(face.name)?)?,
        };
        let only_uid = (token_origin != Origin::Given).then(effective_uid);
        Ok(HttpPlan {
            listening: Listening::new(face, options, address, only_uid)?,
            token,
            token_origin,
            fleet: None,
        })
    }

    /// The face as a node's, in a fleet: other nodes' faces greet it
    /// before they forward to it.
    pub fn in_fleet(self, fleet: Arc<FleetFace>) -> HttpPlan {
        HttpPlan {
            fleet: Some(fleet),
            ..self
        }
    }
}

impl KeyedPlan {
    /// A face on `options.listen` that checks `keyed` callers' keys
    /// itself. Without keys it serves its own user's connections only,
    /// and a bind other machines can reach is refused.
    pub fn new(face: Face, options: &HttpOptions, keyed: bool) -> Result<KeyedPlan, HttpError> {
        let address = parse_listen_address(&options.listen)?;
        if !keyed && !address.ip().is_loopback() {
            return Err(HttpError::NeedsKeys {
                listen: options.listen.clone(),
                keys_env: face.token_env,
            });
        }
        let only_uid = (!keyed).then(effective_uid);
        Ok(KeyedPlan {
            listening: Listening::new(face, options, address, only_uid)?,
        })
    }
}

impl Listening {
    fn new(
        face: Face,
        options: &HttpOptions,
        address: SocketAddr,
        only_uid: Option<u32>,
    ) -> Result<Listening, HttpError> {
        for origin in &options.allow_origins {
            check_origin(origin)?;
        }
        let mut allowed_origins = Vec::new();
        if address.ip().is_loopback() {
            // Pages served from this machine; the port is any, as a local
            // development server's is.
            for scheme in ["http", "https"] {
                for host in ["localhost", "127.0.0.1", "[::1]"] {
                    allowed_origins.push(format!("{scheme}://{host}:*"));
                }
            }
        }
        allowed_origins.extend(options.allow_origins.iter().cloned());

        let mut allowed_hosts = Vec::new();
        if !address.ip().is_unspecified() || !options.allow_hosts.is_empty() {
            allowed_hosts.extend(["localhost", "127.0.0.1", "::1"].map(String::from));
            if !address.ip().is_unspecified() {
                allowed_hosts.push(address.ip().to_string());
            }
            allowed_hosts.extend(options.allow_hosts.iter().cloned());
        }
        Ok(Listening {
            face,
            address,
            allowed_origins,
            allowed_hosts,
            only_uid,
        })
    }

    /// What the face's service is told, `stopping` cancelled when the
    /// server stops.
    pub(crate) fn site(&self, stopping: CancellationToken) -> Site {
        Site {
            allowed_origins: self.allowed_origins.clone(),
            allowed_hosts: self.allowed_hosts.clone(),
            max_body_bytes: self.face.max_body_bytes,
            stopping,
        }
    }
}

/// `8080`, `:8080` and `localhost:8080` mean 127.0.0.1; otherwise an IP
/// address and a port (`[::1]:8080` for IPv6).
pub fn parse_listen_address(text: &str) -> Result<SocketAddr, HttpError> {
    let invalid = || HttpError::ListenAddress(text.to_owned());
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port = port.parse::<u16>().map_err(|_| invalid())?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse::<SocketAddr>().map_err(|_| invalid())
}

/// An allowed origin is `scheme://host[:port]` (port `*` for any) or
/// `null`; anything else would silently match nothing.
fn check_origin(origin: &str) -> Result<(), HttpError> {
    if origin == "null" {
        return Ok(());
    }
    let uri = origin
        .strip_suffix(":*")
        .unwrap_or(origin)
        .parse::<http::Uri>()
        .ok();
    let valid = uri.is_some_and(|uri| {
        matches!(uri.scheme_str(), Some("http" | "https"))
            && uri.authority().is_some()
            && uri.path_and_query().is_none_or(|path| path.as_str() == "/")
            && !origin.ends_with('/')
    });
    if !valid {
        return Err(HttpError::Origin(origin.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_alone_means_loopback() {
        for text in ["8080", ":8080", "localhost:8080"] {
            assert_eq!(
                parse_listen_address(text).unwrap(),
                "127.0.0.1:8080".parse().unwrap()
            );
        }
        assert_eq!(
            parse_listen_address("[::1]:0").unwrap(),
            "[::1]:0".parse().unwrap()
        );
        assert_eq!(
            parse_listen_address("0.0.0.0:9").unwrap(),
            "0.0.0.0:9".parse().unwrap()
        );
        for bad in ["", "host:80", "127.0.0.1", "127.0.0.1:99999", ":x"] {
            assert!(parse_listen_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn origins_must_be_scheme_host_port() {
        for good in [
            "https://app.example",
            "http://localhost:3000",
            "https://app.example:*",
            "null",
        ] {
            assert!(check_origin(good).is_ok(), "{good}");
        }
        for bad in [
            "app.example",
            "ftp://x",
            "https://app.example/path",
            "https://a/",
        ] {
            assert!(check_origin(bad).is_err(), "{bad}");
        }
    }
}
