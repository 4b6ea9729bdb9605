//! A request for another node's sandbox, relayed to that node's face: its
//! method, target, headers and body as they came (but those of this hop's
//! connection), with the fleet's proof added; the answer streamed back as
//! it comes, so a command's output arrives while it runs.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agentos_http::{Body, RequestBody};
use bytes::Bytes;
use http::{header, HeaderMap, Request, Response, StatusCode, Uri};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::answer::ApiError;
use crate::fleet::{FleetFace, Peer, FORWARDED_BY, FORWARD_SIGNATURE};

/// How long connecting to another node's face may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Headers of one hop's connection, never passed on (RFC 9110, 7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Relays `request`, for sandbox `sandbox`, to `peer`'s face.
pub async fn relay(
    fleet: &FleetFace,
    peer: &Peer,
    sandbox: &str,
    request: Request<RequestBody>,
) -> Response<Body> {
    relayed(fleet, peer, sandbox, request)
        .await
        .unwrap_or_else(ApiError::into_response)
}

async fn relayed(
    fleet: &FleetFace,
    peer: &Peer,
    sandbox: &str,
    request: Request<RequestBody>,
) -> Result<Response<Body>, ApiError> {
    let unreachable = |why: String| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("sandbox {sandbox} is on node {}, {why}", peer.name),
        )
    };
    if !peer.alive {
        return Err(unreachable("which is not live now".into()));
    }
    let Some(advertise) = &peer.advertise else {
        return Err(unreachable(
            "which advertises no address for its face".into(),
        ));
    };
    let authority = authority_of(advertise).ok_or_else(|| {
        unreachable(format!(
            "whose advertised address {advertise:?} is not http://HOST:PORT"
        ))
    })?;
    let (mut parts, body) = request.into_parts();
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |target| target.as_str())
        .to_owned();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(FORWARDED_BY);
    parts.headers.remove(FORWARD_SIGNATURE);
    for (name, value) in fleet.sign(&parts.method, &target, sandbox)? {
        parts.headers.insert(name, value);
    }
    let host = header::HeaderValue::from_str(&authority)
        .map_err(|_| unreachable(format!("whose address {advertise:?} is no Host")))?;
    parts.headers.insert(header::HOST, host);
    parts.uri = target
        .parse::<Uri>()
        .map_err(|err| ApiError::bad_request(format!("the request's target: {err}")))?;
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&authority))
        .await
        .map_err(|_| unreachable(format!("whose face at {advertise} did not answer in 5 s")))?
        .map_err(|err| {
            unreachable(format!(
                "whose face at {advertise} cannot be reached: {err}"
            ))
        })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| unreachable(format!("whose face at {advertise} failed: {err}")))?;
    // The connection's own end (or failure) shows in the answer's body.
    tokio::spawn(connection);
    let answer = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|err| unreachable(format!("whose face at {advertise} failed: {err}")))?;
    let (mut parts, incoming) = answer.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Relayed(incoming).boxed()))
}

/// `HOST:PORT` of an `http://HOST:PORT` address (a path after it is
/// allowed and ignored).
fn authority_of(advertise: &str) -> Option<String> {
    let rest = advertise.strip_prefix("http://")?;
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    (!host.is_empty() && port.parse::<u16>().is_ok()).then(|| authority.to_owned())
}

/// Leaves out this hop's headers, and any the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    for name in HOP_BY_HOP
        .iter()
        .copied()
        .chain(named.iter().map(String::as_str))
    {
        headers.remove(name);
    }
}

/// Another face's answer as this face's: it ends where the other's
/// connection failed (the client sees an answer cut short, as it would
/// from that face).
struct Relayed(Incoming);

impl http_body::Body for Relayed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match Pin::new(&mut self.0).poll_frame(context) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(err))) => {
                eprintln!("agentos e2b: a forwarded answer was cut short: {err}");
                Poll::Ready(None)
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_addresses_with_a_port_are_reached() {
        assert_eq!(
            authority_of("http://10.0.0.2:3000").as_deref(),
            Some("10.0.0.2:3000")
        );
        assert_eq!(
            authority_of("http://n2.internal:80/").as_deref(),
            Some("n2.internal:80")
        );
        for bad in [
            "https://10.0.0.2:3000",
            "http://10.0.0.2",
            "10.0.0.2:3000",
            "http://:80",
        ] {
            assert_eq!(authority_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn this_hops_headers_are_not_passed_on() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        headers.insert("x-private", "1".parse().unwrap());
        headers.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        headers.insert("x-api-key", "k".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("x-api-key"));
    }
}
