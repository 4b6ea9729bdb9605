//! `[metrics] listen`: a thread of its own serving `GET /metrics` over TCP
//! or a Unix socket, from the latest published snapshot. One request at a
//! time, each bounded in size and time, so a slow or hostile scraper holds
//! only this thread, never the reactor.

use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::Duration;

use super::metrics::{Published, CONTENT_TYPE};

/// Where the metrics are served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// `host:port`.
    Tcp(String),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl Listen {
    /// `[metrics] listen`: a path (starting with `/`) or `host:port`.
    pub fn parse(text: &str) -> Listen {
        if text.starts_with('/') {
            Listen::Unix(PathBuf::from(text))
        } else {
            Listen::Tcp(text.to_owned())
        }
    }
}

/// The longest request head read.
const MAX_HEAD_BYTES: usize = 8 * 1024;
/// How long a scraper gets to send its request and read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `listen` and serves it from a thread named `metrics` until the
/// process ends.
pub fn serve(listen: &Listen, published: Published) -> io::Result<()> {
    match listen {
        Listen::Tcp(address) => {
            let listener = TcpListener::bind(address)?;
            spawn(move || {
                for stream in listener.incoming().flatten() {
                    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
                    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
                    answer(stream, &published);
                }
            })
        }
        Listen::Unix(path) => {
            // A socket left by an earlier kernel is replaced.
            let _ = std::fs::remove_file(path);
            let listener = UnixListener::bind(path)?;
            spawn(move || {
                for stream in listener.incoming().flatten() {
                    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
                    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
                    answer(stream, &published);
                }
            })
        }
    }
}

fn spawn(serve: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(serve)
        .map(drop)
}

/// Answers one request on `stream`.
fn answer(mut stream: impl Read + Write, published: &Published) {
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
        if head.len() > MAX_HEAD_BYTES {
            let _ = reply(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"",
            );
            return;
        }
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut words = line.split(|b| *b == b' ');
    let (method, target) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let path = target.split(|b| *b == b'?').next().unwrap_or_default();
    let _ = match (method, path) {
        (b"GET", b"/metrics") => reply(
            &mut stream,
            "200 OK",
            CONTENT_TYPE,
            published.render().as_bytes(),
        ),
        (b"GET", _) => reply(
            &mut stream,
            "404 Not Found",
            "text/plain",
            b"metrics are at /metrics\n",
        ),
        _ => reply(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            b"GET /metrics\n",
        ),
    };
}

fn reply(stream: &mut impl Write, status: &str, content_type: &str, body: &[u8]) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::Snapshot;

    fn get(address: std::net::SocketAddr, request: &str) -> String {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn the_latest_snapshot_is_served_at_metrics_and_nothing_else() {
        let published = Published::default();
        let mut snapshot = Snapshot::default();
        snapshot.gauge(
            "agentos_agents",
            "Agents by state.",
            &[("state", "running")],
            2,
        );
        published.publish(snapshot);
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        serve(&Listen::parse(&format!("127.0.0.1:{port}")), published).unwrap();
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let metrics = get(address, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(metrics.contains("text/plain; version=0.0.4"), "{metrics}");
        assert!(
            metrics.contains("agentos_agents{state=\"running\"} 2"),
            "{metrics}"
        );
        assert!(get(address, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(address, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let endless = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(9000));
        assert!(get(address, &endless).starts_with("HTTP/1.1 431"));
    }
}
