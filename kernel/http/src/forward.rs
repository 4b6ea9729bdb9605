//! A request for what another node holds, relayed to that node's face:
//! its method, target, headers and body as they came (but those of this
//! hop's connection), with the fleet's proof added; the answer, once it
//! proves it comes from that node, streamed back as it comes, so a
//! command's output arrives while it runs.
//!
//! What went wrong reaching another node is this face's log's, not the
//! client's: the client is to be told only that the node cannot be
//! reached now.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, Response, Uri};
use http_body::Frame;
use http_body_util::{BodyExt, Either, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::fleet::{
    target_of, FleetFace, Peer, Signed, FORWARDED_BY, FORWARD_ANSWER, FORWARD_SIGNATURE,
    GREETING_PATH,
};
use crate::{Body, RequestBody};

/// How long connecting to another node's face may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long its answer to the greeting may take. (The answer to the
/// request itself may take as long as the work: a run's.)
const GREETING_TIMEOUT: Duration = Duration::from_secs(10);

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

/// A request's body as a face relays it: as it streams in, or read whole
/// (when the face had to read it to know where it goes).
pub type Relayable = Either<RequestBody, Full<Bytes>>;

/// Relays `request`, for `subject` (a sandbox, a session: what it is,
/// `noun`), to `peer`'s face. Why it failed goes to the face's log, and
/// what was known of the fleet's nodes is asked again next time.
pub async fn relay(
    fleet: &FleetFace,
    peer: &Peer,
    (noun, subject): (&str, &str),
    request: Request<Relayable>,
) -> Result<Response<Body>, Unreached> {
    let relayed = relayed(fleet, peer, subject, request).await;
    if let Err(Unreached(why)) = &relayed {
        eprintln!(
            "agentos {}: forwarding a request for {noun} {subject:?} to node {}: {why}",
            fleet.face_name(),
            peer.name
        );
        fleet.forget_peers();
    }
    relayed
}

/// Why another node's face was not reached, for the log.
#[derive(Debug)]
pub struct Unreached(String);

async fn relayed(
    fleet: &FleetFace,
    peer: &Peer,
    subject: &str,
    request: Request<Relayable>,
) -> Result<Response<Body>, Unreached> {
    let unreachable = Unreached;
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
    let target = target_of(&parts.uri).to_owned();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(FORWARDED_BY);
    parts.headers.remove(FORWARD_SIGNATURE);
    let Signed { headers, signature } = (fleet.sign(&peer.name, &parts.method, &target, subject))
        .map_err(|err| unreachable(err.to_string()))?;
    for (name, value) in headers {
        parts.headers.insert(name, value);
    }
    let host = header::HeaderValue::from_str(&authority)
        .map_err(|_| unreachable(format!("whose address {advertise:?} is no Host")))?;
    parts.headers.insert(header::HOST, host);
    parts.uri = target
        .parse::<Uri>()
        .map_err(|err| unreachable(format!("the request's target: {err}")))?;
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
    tokio::time::timeout(
        GREETING_TIMEOUT,
        greet(fleet, peer, &mut sender, &authority),
    )
    .await
    .map_err(|_| unreachable(format!("whose face at {advertise} did not answer in 10 s")))?
    .map_err(|Unreached(why)| unreachable(format!("at {advertise}: {why}")))?;
    let answer = sender
        .send_request(Request::from_parts(parts, Either::Right(body)))
        .await
        .map_err(|err| unreachable(format!("whose face at {advertise} failed: {err}")))?;
    let (mut parts, incoming) = answer.into_parts();
    if !fleet.is_proven_answer(&parts.headers, &peer.name, &signature) {
        // The greeting proved the face: an answer without proof is its
        // gate's refusal (a token or a body it does not take), or a relay.
        return Err(unreachable(format!(
            "its face at {advertise} answered {} without proving it (its gate refused the \
             request: the faces' tokens may differ)",
            parts.status
        )));
    }
    parts.headers.remove(FORWARD_ANSWER);
    strip_hop_by_hop(&mut parts.headers);
    let relayed = Relayed {
        incoming,
        face: fleet.face_name(),
    };
    Ok(Response::from_parts(parts, relayed.boxed()))
}

/// Proves that what answers on the connection is `peer`'s face before
/// anything of the client's is sent on it: a greeting with a nonce, which
/// only a face holding the fleet's secret answers with its proof.
async fn greet(
    fleet: &FleetFace,
    peer: &Peer,
    sender: &mut SendRequest<Either<Empty<Bytes>, Relayable>>,
    authority: &str,
) -> Result<(), Unreached> {
    let failed = |err: &dyn std::fmt::Display| Unreached(err.to_string());
    let nonce = crate::random::bytes::<16>().map_err(|err| failed(&err))?;
    let target = format!("{GREETING_PATH}?nonce={}", crate::random::hex(&nonce));
    let Signed { headers, signature } =
        (fleet.sign(&peer.name, &Method::GET, &target, "")).map_err(|err| failed(&err))?;
    let mut greeting = Request::get(target.as_str())
        .header(header::HOST, authority)
        .body(Either::Left(Empty::<Bytes>::new()))
        .map_err(|err| failed(&err))?;
    for (name, value) in headers {
        greeting.headers_mut().insert(name, value);
    }
    let answer = (sender.send_request(greeting).await).map_err(|err| failed(&err))?;
    if !fleet.is_proven_answer(answer.headers(), &peer.name, &signature) {
        return Err(Unreached(format!(
            "what answers is not node {}'s face: it does not prove it holds the fleet's secret",
            peer.name
        )));
    }
    // The greeting's answer, read to its end, leaves the connection free.
    let _ = answer.into_body().collect().await;
    sender.ready().await.map_err(|err| failed(&err))
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

/// Another face's answer as this face's. Where the other's connection
/// fails it ends: an answer of known length then reaches the client cut
/// short, but a streamed one ends as if whole (the face's bodies carry no
/// error), with a line in this face's log.
struct Relayed {
    incoming: Incoming,
    /// The face's name, for its log.
    face: &'static str,
}

impl http_body::Body for Relayed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match Pin::new(&mut self.incoming).poll_frame(context) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(err))) => {
                eprintln!(
                    "agentos {}: a forwarded answer was cut short: {err}",
                    self.face
                );
                Poll::Ready(None)
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
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
