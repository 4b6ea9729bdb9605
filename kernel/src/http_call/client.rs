//! One HTTP request made for a caller: every connection — the first and
//! each redirect's — goes only to addresses the caller's policy allows,
//! decided on the name asked for and the address it resolved to, as the
//! egress proxy decides a sandbox's connections.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentos_egress::policy::{Decision, Policy};
use agentos_proto::payload::{HttpReply, HttpRequest};
use agentos_proto::{ErrorCode, ErrorReply};
use base64::Engine;
use ureq::http::{self, Uri};
use ureq::tls::{Certificate, RootCerts, TlsConfig};
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

/// At most this many redirects are followed.
const MAX_REDIRECTS: usize = 5;

/// At most this many addresses are tried (what the connector holds).
const MAX_ADDRESSES: usize = 16;

/// Where Debian keeps the system's trusted roots.
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What every request shares: names answered without DNS, the roots
/// servers are checked against, and the largest body read.
#[derive(Debug)]
pub struct Upstream {
    names: HashMap<String, Vec<IpAddr>>,
    roots: RootCerts,
    max_body: u64,
}

impl Upstream {
    /// `names` as `[network] resolve` gives them (lower case); with
    /// `extra_roots_pem`, the system's roots and those; else the public
    /// roots.
    pub fn new(names: HashMap<String, Vec<IpAddr>>, extra_roots_pem: &[u8], max_body: u64) -> Self {
        let roots = if extra_roots_pem.is_empty() {
            RootCerts::WebPki
        } else {
            let system = std::fs::read(SYSTEM_ROOTS).unwrap_or_default();
            let certificates: Vec<Certificate<'static>> = ureq::tls::parse_pem(&system)
                .chain(ureq::tls::parse_pem(extra_roots_pem))
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
                    _ => None,
                })
                .collect();
            RootCerts::new_with_certs(&certificates)
        };
        Upstream {
            names,
            roots,
            max_body,
        }
    }
}

/// Makes `request` under `policy`, following redirects (each one's
/// connection decided again). Any answer is a reply, whatever its status.
pub fn perform(
    upstream: &Upstream,
    policy: Policy,
    request: HttpRequest,
) -> Result<HttpReply, ErrorReply> {
    let deadline = Instant::now() + Duration::from_secs(request.timeout_secs());
    let resolver = PolicyResolver {
        policy: Arc::new(policy),
        names: upstream.names.clone(),
    };
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .max_redirects_will_error(false)
        .proxy(None)
        .max_idle_connections(0)
        .timeout_global(Some(Duration::from_secs(request.timeout_secs())))
        .user_agent(concat!("agentos/", env!("CARGO_PKG_VERSION")))
        .tls_config(
            TlsConfig::builder()
                .root_certs(upstream.roots.clone())
                .build(),
        )
        .build();
    let agent = ureq::Agent::with_parts(config, DefaultConnector::default(), resolver);
    let mut url = request.url;
    let mut method = request.method;
    let mut headers = request.headers;
    let mut body = request.body.unwrap_or_default().into_bytes();
    let mut hop = 0;
    loop {
        if Instant::now() >= deadline {
            return Err(timed_out(&url));
        }
        let mut builder = http::Request::builder().method(method.as_str()).uri(&url);
        for (name, value) in &headers {
            builder = builder.header(name, value);
        }
        let outgoing = builder
            .body(body.clone())
            .map_err(|err| bad_url(&url, &err.to_string()))?;
        let mut response = agent.run(outgoing).map_err(|err| failure(&url, err))?;
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get(http::header::LOCATION)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        if let (true, Some(location)) = (is_redirect(status), location) {
            if hop == MAX_REDIRECTS {
                return Err(ErrorReply::new(
                    ErrorCode::LimitExceeded,
                    format!("HTTP {url}: more than {MAX_REDIRECTS} redirects"),
                ));
            }
            let next = joined(&url, &location)?;
            if status == 303 || (matches!(status, 301 | 302) && method == "POST") {
                method = String::from("GET");
                body.clear();
            }
            if host_of(&next) != host_of(&url) {
                headers.retain(|name, _| !is_credential(name));
            }
            url = next;
            hop += 1;
            continue;
        }
        return reply(upstream, url, status, &mut response);
    }
}

/// The reply for an answer, its body read within the bound.
fn reply(
    upstream: &Upstream,
    url: String,
    status: u16,
    response: &mut http::Response<ureq::Body>,
) -> Result<HttpReply, ErrorReply> {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in response.headers() {
        let value = String::from_utf8_lossy(value.as_bytes());
        headers
            .entry(name.as_str().to_owned())
            .and_modify(|joined| {
                joined.push_str(", ");
                joined.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    let bytes = response
        .body_mut()
        .with_config()
        .limit(upstream.max_body)
        .read_to_vec()
        .map_err(|err| match err {
            ureq::Error::BodyExceedsLimit(limit) => ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "HTTP {url}: the body is longer than {limit} bytes, the most a reply holds"
                ),
            ),
            other => failure(&url, other),
        })?;
    let (body, body_encoding) = match String::from_utf8(bytes) {
        Ok(text) => (text, None),
        Err(err) => (
            base64::engine::general_purpose::STANDARD.encode(err.into_bytes()),
            Some(String::from("base64")),
        ),
    };
    Ok(HttpReply {
        success: true,
        status_code: status,
        headers,
        body,
        body_encoding,
        url,
    })
}

fn is_redirect(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

/// Headers that carry a credential, dropped when a redirect leaves the
/// host they were meant for.
fn is_credential(name: &str) -> bool {
    ["authorization", "cookie", "x-api-key"].contains(&name.to_ascii_lowercase().as_str())
}

fn host_of(url: &str) -> Option<String> {
    url.parse::<Uri>()
        .ok()
        .and_then(|uri| uri.authority().map(|a| a.as_str().to_ascii_lowercase()))
}

/// `location` resolved against `base`: absolute, scheme-relative,
/// absolute-path or relative; only http and https.
fn joined(base: &str, location: &str) -> Result<String, ErrorReply> {
    let base_uri: Uri = base.parse().map_err(|_| bad_url(base, "not a URL"))?;
    let scheme = base_uri.scheme_str().unwrap_or("https");
    let authority = base_uri.authority().map(|a| a.as_str()).unwrap_or_default();
    let lower = location.to_ascii_lowercase();
    let next = if lower.starts_with("http://") || lower.starts_with("https://") {
        location.to_owned()
    } else if location.starts_with("//") {
        format!("{scheme}:{location}")
    } else if location.starts_with('/') {
        format!("{scheme}://{authority}{location}")
    } else if has_scheme(location) {
        return Err(bad_url(
            location,
            "a redirect may lead only to http:// or https://",
        ));
    } else {
        let path = base_uri.path();
        let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
        format!("{scheme}://{authority}{dir}{location}")
    };
    // The same rules as the caller's own URL.
    let checked = format!(r#"{{"url":{}}}"#, serde_json::Value::String(next.clone()));
    HttpRequest::parse(checked.as_bytes())
        .map_err(|err| bad_url(location, &format!("a redirect to it: {}", err.error)))?;
    Ok(next)
}

/// Whether a reference starts with a scheme (`name:`), as RFC 3986 has it.
fn has_scheme(reference: &str) -> bool {
    let Some((scheme, _)) = reference.split_once(':') else {
        return false;
    };
    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

fn bad_url(url: &str, why: &str) -> ErrorReply {
    ErrorReply::new(ErrorCode::BadRequest, format!("HTTP {url}: {why}"))
}

fn timed_out(url: &str) -> ErrorReply {
    ErrorReply::new(
        ErrorCode::Timeout,
        format!("HTTP {url}: timeout: no answer within the request's time"),
    )
}

/// What a failed request tells its caller: a refusal by the policy as
/// such, a timeout as one, anything else as unavailable.
fn failure(url: &str, err: ureq::Error) -> ErrorReply {
    match err {
        ureq::Error::Io(io) if io.kind() == io::ErrorKind::PermissionDenied => {
            ErrorReply::new(ErrorCode::PermissionDenied, format!("HTTP {url}: {io}"))
        }
        ureq::Error::Timeout(_) => timed_out(url),
        ureq::Error::Io(io) if io.kind() == io::ErrorKind::TimedOut => timed_out(url),
        ureq::Error::HostNotFound => ErrorReply::new(
            ErrorCode::Unavailable,
            format!("HTTP {url}: the host does not resolve"),
        ),
        other => ErrorReply::new(ErrorCode::Unavailable, format!("HTTP {url}: {other}")),
    }
}

/// Resolves a request's host to the addresses the policy allows, or
/// refuses it: a name the policy never allows is not even looked up.
#[derive(Debug)]
struct PolicyResolver {
    policy: Arc<Policy>,
    names: HashMap<String, Vec<IpAddr>>,
}

impl PolicyResolver {
    fn addresses(&self, host: &str, port: u16) -> io::Result<Vec<IpAddr>> {
        if let Ok(address) = host.parse::<IpAddr>() {
            return Ok(vec![address]);
        }
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        if let Some(known) = self.names.get(&name) {
            return Ok(known.clone());
        }
        Ok((name.as_str(), port)
            .to_socket_addrs()?
            .map(|found| found.ip())
            .collect())
    }
}

fn refused(why: String) -> ureq::Error {
    ureq::Error::Io(io::Error::new(io::ErrorKind::PermissionDenied, why))
}

impl Resolver for PolicyResolver {
    fn resolve(
        &self,
        uri: &Uri,
        _config: &ureq::config::Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let host = uri
            .host()
            .ok_or(ureq::Error::HostNotFound)?
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("http") => 80,
            _ => 443,
        });
        if let Some(Decision::Refused(why)) = self.policy.decide_name(host, port) {
            return Err(refused(why));
        }
        let addresses = self.addresses(host, port).map_err(ureq::Error::Io)?;
        let mut first_refusal = None;
        let mut allowed = self.empty();
        for address in addresses {
            match self.policy.decide(host, address, port) {
                Decision::Allowed if allowed.len() < MAX_ADDRESSES => {
                    allowed.push(SocketAddr::new(address, port))
                }
                Decision::Allowed => {}
                Decision::Refused(why) => {
                    first_refusal.get_or_insert(why);
                }
            }
        }
        if allowed.is_empty() {
            return Err(match first_refusal {
                Some(why) => refused(why),
                None => ureq::Error::HostNotFound,
            });
        }
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_resolve_against_the_url_they_answer() {
        let base = "https://h.test/a/b?q=1";
        assert_eq!(joined(base, "/c").unwrap(), "https://h.test/c");
        assert_eq!(joined(base, "c").unwrap(), "https://h.test/a/c");
        assert_eq!(joined(base, "//o.test/x").unwrap(), "https://o.test/x");
        assert_eq!(
            joined(base, "http://169.254.169.254/latest").unwrap(),
            "http://169.254.169.254/latest",
            "joined, then refused by the policy when connecting"
        );
        assert!(joined(base, "file:///etc/passwd").is_err());
        assert!(joined(base, "gopher://h.test/").is_err());
    }

    #[test]
    fn a_name_outside_the_policy_is_not_looked_up() {
        let policy = Policy::from_proto(
            &serde_json::from_str(r#"{"allow":["ok.test","meta.test"]}"#).unwrap(),
        )
        .unwrap();
        let resolver = PolicyResolver {
            policy: Arc::new(policy),
            names: HashMap::from([
                ("ok.test".to_owned(), vec!["93.184.216.34".parse().unwrap()]),
                (
                    "meta.test".to_owned(),
                    vec!["169.254.169.254".parse().unwrap()],
                ),
            ]),
        };
        let config = ureq::config::Config::default();
        let resolve =
            |url: &str| resolver.resolve(&url.parse().unwrap(), &config, NextTimeout::default());
        assert_eq!(resolve("https://ok.test/").unwrap().len(), 1);
        for url in [
            "https://meta.test/",
            "http://169.254.169.254/",
            "https://elsewhere.test/",
        ] {
            match resolve(url) {
                Err(ureq::Error::Io(err)) => {
                    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{url}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
