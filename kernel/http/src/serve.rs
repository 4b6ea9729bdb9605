//! The server: the listening socket, a task per connection that admits
//! it and serves it through the gate, and stopping on SIGINT or SIGTERM.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use crate::gate::{Body, Gate, Handle, KeyedGate};
use crate::guard::{Ends, Guard};
use crate::plan::{HttpError, HttpPlan, KeyedPlan, Listening, Site};
use crate::request_body::RequestBody;
use crate::token::Origin;

/// How long a client may take to send a request's headers; a connection
/// that dawdles longer is closed, so idle sockets cannot pile up.
const HEADER_READ_LIMIT: Duration = Duration::from_secs(30);

/// The connections one client (a local uid, or a remote address) may
/// hold at once; past it, its oldest connection that has not carried the
/// token is closed for the new one, or, when all have, the new one is
/// answered 503 and closed. A client needs one or two; this leaves room
/// for many, and keeps one user's flood from using up the descriptors
/// everyone else needs.
const MAX_CONNECTIONS_PER_CLIENT: usize = 64;

/// How long in-flight requests get to finish after SIGINT or SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves the face `plan` describes on its address until SIGINT or
/// SIGTERM: every request that passes the gate (its path, its token, its
/// connection's owner, its body's size) goes, its body read whole, to
/// the service `make` builds for the site.
pub async fn serve<S, F>(plan: HttpPlan, make: F) -> Result<(), HttpError>
where
    F: FnOnce(&Site) -> S,
    S: Service<Request<Full<Bytes>>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    let HttpPlan {
        listening,
        token,
        token_origin,
        fleet,
    } = plan;
    let face = listening.face;
    let made = match &token_origin {
        Origin::Given => None,
        Origin::Made(path) => Some((path.clone(), "made now")),
        Origin::Kept(path) => Some((path.clone(), "made by an earlier start")),
    };
    let told = move || {
        if let Some((path, when)) = made {
            eprintln!(
                "agentos {}: every request must carry Authorization: Bearer TOKEN, TOKEN being \
                 the content of {} ({when}, readable by you only)",
                face.name,
                path.display()
            );
        }
    };
    let gate = move |site: &Site, guard| Gate {
        service: make(site),
        face,
        token,
        guard,
        fleet,
    };
    listen(listening, gate, told).await
}

/// Serves the face `plan` describes on its address until SIGINT or
/// SIGTERM: every request on a connection its client may hold (and, for
/// a face without keys, of its own user) goes, as it comes, to the
/// service `make` builds for the site, which proves the caller itself.
/// Its body is streamed, not read first: the service bounds it.
pub async fn serve_keyed<S, F>(plan: KeyedPlan, make: F) -> Result<(), HttpError>
where
    F: FnOnce(&Site) -> S,
    S: Service<Request<RequestBody>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    let gate = move |site: &Site, guard| KeyedGate {
        service: make(site),
        guard,
    };
    listen(plan.listening, gate, || {}).await
}

/// Listens where `listening` says and serves each connection through the
/// gate `make_gate` builds, once `told` has said what the user needs to
/// know before the address is printed.
async fn listen<H, F>(
    listening: Listening,
    make_gate: F,
    told: impl FnOnce(),
) -> Result<(), HttpError>
where
    F: FnOnce(&Site, Arc<Guard>) -> H,
    H: Handle,
{
    let face = listening.face;
    let name = face.name;
    // Signals are caught before the address is printed, so a client that
    // sees it may stop the server at once.
    let mut terminate = signal(SignalKind::terminate()).map_err(HttpError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(HttpError::Signals)?;
    let listener = TcpListener::bind(listening.address)
        .await
        .map_err(|error| HttpError::Listen {
            address: listening.address,
            error,
        })?;
    let address = listener.local_addr().map_err(HttpError::BoundAddress)?;
    let stopping = CancellationToken::new();
    let guard = Arc::new(Guard::new(
        address,
        MAX_CONNECTIONS_PER_CLIENT,
        listening.only_uid,
    ));
    let gate = Arc::new(make_gate(&listening.site(stopping.clone()), guard.clone()));
    told();
    eprintln!("agentos {name}: listening on http://{address}{}", face.path);

    let connections = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of descriptors and the like: wait a little
                        // rather than spin, and keep serving.
                        eprintln!("agentos {name}: accept: {err}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // Whose the connection is, and whether its client may
                // have one more, is found in the connection's own task:
                // the accept loop never waits on a client.
                let watcher = connections.watcher();
                let (guard, gate) = (guard.clone(), gate.clone());
                tokio::spawn(async move {
                    // A response goes out in parts (a stream's messages,
                    // a head then a body): each is sent as written, not
                    // held for the peer's delayed acknowledgement.
                    let _ = stream.set_nodelay(true);
                    // The connection's own local address: on a wildcard
                    // bind, the listener's is 0.0.0.0, which no
                    // connection's other end is connected to.
                    let Ok(local) = stream.local_addr() else {
                        return;
                    };
                    let ends = Ends { peer, local };
                    let Some(held) = guard.admit(ends).await else {
                        return refuse_busy(stream, guard.per_client()).await;
                    };
                    let place = held.place();
                    let service = service_fn({
                        let place = place.clone();
                        move |request: Request<Incoming>| {
                            let (gate, place) = (gate.clone(), place.clone());
                            async move {
                                let (parts, body) = request.into_parts();
                                let (body, read) = RequestBody::new(body);
                                let request = Request::from_parts(parts, body);
                                let mut response = gate.handle(request, ends, &place).await;
                                read.close_unless_read(&mut response);
                                Ok::<_, Infallible>(response)
                            }
                        }
                    });
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_READ_LIMIT)
                        .serve_connection(TokioIo::new(stream), service);
                    // A client that hangs up mid-request is its own
                    // business; the server goes on. A connection that a
                    // newer one of its client displaced is closed.
                    tokio::select! {
                        _ = watcher.watch(connection) => {}
                        _ = place.evicted() => {}
                    }
                    drop(held);
                });
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    drop(listener);
    eprintln!("agentos {name}: stopping");
    // Ends the response streams still open, then lets the requests in
    // flight finish, for a while.
    stopping.cancel();
    if tokio::time::timeout(SHUTDOWN_GRACE, connections.shutdown())
        .await
        .is_err()
    {
        eprintln!("agentos {name}: requests still running after {SHUTDOWN_GRACE:?}; leaving them");
    }
    Ok(())
}

/// A 503 for a client that holds its share of connections, written
/// without reading its request; then the connection closes.
async fn refuse_busy(mut stream: TcpStream, per_client: usize) {
    let text = format!(
        "Service Unavailable: a client may hold {per_client} connections to this server at once"
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    // A client too slow to take a few hundred bytes is not waited for.
    let write = stream.write_all(response.as_bytes());
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}
