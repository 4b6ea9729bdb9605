//! HTTP (0x50): a request the kernel makes for its caller, under the
//! caller's network policy, as the Clove SDK's `http` sends it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::parse::{bad_request, parse_json};
use crate::error::ErrorReply;

/// The longest URL accepted, in bytes.
pub const MAX_HTTP_URL_LEN: usize = 8192;
/// At most this many caller headers.
pub const MAX_HTTP_HEADERS: usize = 64;
/// At most this many bytes of caller headers, names and values together.
pub const MAX_HTTP_HEADER_BYTES: usize = 16 * 1024;
/// The longest a request may take, redirects included, in seconds.
pub const MAX_HTTP_TIMEOUT_SECS: u64 = 120;
/// What a request that leaves out `timeout` gets, in seconds.
pub const DEFAULT_HTTP_TIMEOUT_SECS: u64 = 30;

/// The methods a request may use.
const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// Headers the kernel sets itself, or that would change how the request is
/// framed or routed: a caller's are refused, by name.
const RESERVED_HEADERS: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// An HTTP request: `{"url": "https://…", "method": "GET", "headers":
/// {…}, "body": "…", "timeout": 30}`.
///
/// ```
/// use agentos_proto::payload::HttpRequest;
/// let get = HttpRequest::parse(br#"{"url":"https://example.com/","async":false}"#).unwrap();
/// assert_eq!(get.method, "GET");
/// assert!(HttpRequest::parse(br#"{"url":"ftp://example.com/"}"#).is_err());
/// assert!(HttpRequest::parse(br#"{"url":"https://x/","headers":{"Host":"y"}}"#).is_err());
/// assert!(HttpRequest::parse(br#"{"url":"https://x/","headers":{"A":"b\r\nC: d"}}"#).is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HttpRequest {
    /// An `http://` or `https://` URL, without user information.
    pub url: String,
    /// `GET` (the default), `HEAD`, `POST`, `PUT`, `PATCH`, `DELETE` or
    /// `OPTIONS`, in any case.
    #[serde(default = "get")]
    pub method: String,
    /// Headers to send, by name.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The body to send (not with `GET` or `HEAD`).
    #[serde(default)]
    pub body: Option<String>,
    /// Seconds the whole request may take, redirects included (default
    /// 30, at most 120).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Clove's asynchronous form; only `false` is served.
    #[serde(default, rename = "async")]
    pub asynchronous: bool,
}

fn get() -> String {
    String::from("GET")
}

impl HttpRequest {
    /// Parses an HTTP payload, checking every field.
    pub fn parse(payload: &[u8]) -> Result<Self, ErrorReply> {
        let mut request: HttpRequest = parse_json("HTTP", payload)?;
        if request.asynchronous {
            return Err(bad_request(
                "HTTP field `async`: only synchronous requests are served; leave it out or \
                 send false",
            ));
        }
        check_url(&request.url)?;
        request.method = request.method.to_ascii_uppercase();
        if !METHODS.contains(&request.method.as_str()) {
            return Err(bad_request(format!(
                "HTTP field `method`: {:?} is not one of {}",
                request.method,
                METHODS.join(", ")
            )));
        }
        if request.body.is_some() && matches!(request.method.as_str(), "GET" | "HEAD") {
            return Err(bad_request(format!(
                "HTTP field `body`: a {} carries no body",
                request.method
            )));
        }
        check_headers(&request.headers)?;
        match request.timeout {
            Some(0) => return Err(bad_request("HTTP field `timeout`: must be at least 1")),
            Some(secs) if secs > MAX_HTTP_TIMEOUT_SECS => {
                return Err(bad_request(format!(
                    "HTTP field `timeout`: at most {MAX_HTTP_TIMEOUT_SECS} seconds"
                )))
            }
            _ => {}
        }
        Ok(request)
    }

    /// The seconds the request may take.
    pub fn timeout_secs(&self) -> u64 {
        self.timeout.unwrap_or(DEFAULT_HTTP_TIMEOUT_SECS)
    }
}

/// An `http` or `https` URL with a host, no user information, no spaces
/// or control characters.
fn check_url(url: &str) -> Result<(), ErrorReply> {
    let bad = |why: &str| Err(bad_request(format!("HTTP field `url`: {why}")));
    if url.len() > MAX_HTTP_URL_LEN {
        return bad(&format!("longer than {MAX_HTTP_URL_LEN} bytes"));
    }
    if url.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return bad("it holds a space or a control character");
    }
    let lower = url.to_ascii_lowercase();
    let Some(rest) = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
    else {
        return bad("only http:// and https:// URLs are served");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return bad("user information (`user@`) is not sent; put credentials in a header");
    }
    if authority.is_empty() || authority.starts_with(':') {
        return bad("it names no host");
    }
    Ok(())
}

/// Header names are tokens; values hold no CR, LF or NUL; the kernel's
/// own and framing headers, and `Proxy-*`, are refused by name.
fn check_headers(headers: &BTreeMap<String, String>) -> Result<(), ErrorReply> {
    if headers.len() > MAX_HTTP_HEADERS {
        return Err(bad_request(format!(
            "HTTP field `headers`: at most {MAX_HTTP_HEADERS} headers"
        )));
    }
    let bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
    if bytes > MAX_HTTP_HEADER_BYTES {
        return Err(bad_request(format!(
            "HTTP field `headers`: more than {MAX_HTTP_HEADER_BYTES} bytes"
        )));
    }
    for (name, value) in headers {
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(bad_request(format!(
                "HTTP field `headers`: {name:?} is not a header name"
            )));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-") {
            return Err(bad_request(format!(
                "HTTP field `headers`: {name} is set by the kernel, not the caller"
            )));
        }
        if value.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
            return Err(bad_request(format!(
                "HTTP field `headers.{name}`: a value may not hold CR, LF or NUL"
            )));
        }
    }
    Ok(())
}

/// An HTTP reply: the upstream's answer, whatever its status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HttpReply {
    /// True: an answer came (any status).
    pub success: bool,
    /// Its status code.
    pub status_code: u16,
    /// Its headers, names in lower case (repeated ones joined with `, `).
    pub headers: BTreeMap<String, String>,
    /// Its body: text, or base64 when `body_encoding` says so.
    pub body: String,
    /// `base64` when the body is not UTF-8 text; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_encoding: Option<String>,
    /// The URL that answered, after redirects.
    pub url: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(json: &str) -> String {
        HttpRequest::parse(json.as_bytes()).unwrap_err().error
    }

    #[test]
    fn clove_sdk_payloads_parse() {
        let post = HttpRequest::parse(
            br#"{"url":"https://httpbin.org/post","method":"post","timeout":30,"async":false,
                "headers":{"Content-Type":"application/json"},"body":"{}"}"#,
        )
        .unwrap();
        assert_eq!(post.method, "POST");
        assert_eq!(post.timeout_secs(), 30);
    }

    #[test]
    fn hostile_fields_are_refused_by_name() {
        for (json, field) in [
            (r#"{"url":"file:///etc/passwd"}"#, "url"),
            (r#"{"url":"https://user:pw@host/"}"#, "url"),
            (r#"{"url":"https://host/a b"}"#, "url"),
            (r#"{"url":"http:///path"}"#, "url"),
            (r#"{"url":"https://h/","method":"CONNECT"}"#, "method"),
            (r#"{"url":"https://h/","body":"x"}"#, "body"),
            (r#"{"url":"https://h/","timeout":0}"#, "timeout"),
            (r#"{"url":"https://h/","timeout":100000}"#, "timeout"),
            (r#"{"url":"https://h/","async":true}"#, "async"),
            (
                r#"{"url":"https://h/","headers":{"Transfer-Encoding":"chunked"}}"#,
                "headers",
            ),
            (
                r#"{"url":"https://h/","headers":{"Proxy-Authorization":"x"}}"#,
                "headers",
            ),
            (
                r#"{"url":"https://h/","headers":{"X":"a\u0000b"}}"#,
                "headers",
            ),
            (r#"{"url":"https://h/","headers":{"A B":"x"}}"#, "headers"),
        ] {
            let message = refused(json);
            assert!(message.contains(field), "{json}: {message}");
        }
        assert!(refused(r#"{"url":"https://h/","follow":true}"#).contains("follow"));
    }
}
