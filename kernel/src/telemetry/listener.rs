//! `[metrics] listen`: a thread of its own serving `GET /metrics` over TCP
//! or a Unix socket, from the latest published snapshot.
//!
//! The thread runs one poll loop over the listening socket and every
//! connection, all nonblocking: a connection is read and answered as its
//! bytes come, alongside the others, so no client waits behind another.
//! Each connection has a whole-request deadline from its acceptance —
//! request and answer together — after which it is closed however it is
//! progressing, so a client dribbling a byte now and then holds only a
//! slot, and for at most [`WHOLE_REQUEST`]. Slots are bounded; when they
//! are all taken, the oldest connection is closed for the newcomer, so
//! clients that keep slots busy cannot keep a scrape out either. The
//! reactor is never involved.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mio::event::Source;
use mio::net::{TcpListener, UnixListener};
use mio::{Events, Interest, Poll, Token};

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
/// How long a connection may take, from its acceptance to the last byte
/// of its answer: a scraper on the same machine or network needs
/// milliseconds.
const WHOLE_REQUEST: Duration = Duration::from_secs(2);
/// Connections served at once; each costs a descriptor. Far more than
/// scrapers need, and the oldest is closed to admit another.
const MAX_CONNECTIONS: usize = 512;
/// The listening socket's token; connections have their serial numbers.
const LISTENER: Token = Token(usize::MAX);

/// Binds `listen` and serves it from a thread named `metrics` until the
/// process ends.
pub fn serve(listen: &Listen, published: Published) -> io::Result<()> {
    let acceptor = match listen {
        Listen::Tcp(address) => {
            // Bound through std, which resolves names (`localhost:9464`).
            let listener = std::net::TcpListener::bind(address)?;
            listener.set_nonblocking(true)?;
            Acceptor::Tcp(TcpListener::from_std(listener))
        }
        Listen::Unix(path) => {
            // A socket left by an earlier kernel is replaced.
            let _ = std::fs::remove_file(path);
            Acceptor::Unix(UnixListener::bind(path)?)
        }
    };
    let server = Server::new(acceptor, published)?;
    agentos_primitives::threads::spawn("metrics", move || server.run()).map(drop)
}

/// What the loop listens on.
enum Acceptor {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Acceptor {
    fn register(&mut self, poll: &Poll) -> io::Result<()> {
        let registry = poll.registry();
        match self {
            Acceptor::Tcp(listener) => registry.register(listener, LISTENER, Interest::READABLE),
            Acceptor::Unix(listener) => registry.register(listener, LISTENER, Interest::READABLE),
        }
    }

    fn accept(&self) -> io::Result<Box<dyn Stream>> {
        Ok(match self {
            Acceptor::Tcp(listener) => Box::new(listener.accept()?.0),
            Acceptor::Unix(listener) => Box::new(listener.accept()?.0),
        })
    }
}

/// A connection's socket, TCP or Unix.
trait Stream: Read + Write + Source + Send {}

impl<T: Read + Write + Source + Send> Stream for T {}

/// One connection being served.
struct Connection {
    stream: Box<dyn Stream>,
    /// When it is closed, answered or not.
    deadline: Instant,
    state: State,
}

enum State {
    /// The request head so far.
    Reading(Vec<u8>),
    /// The answer, and how much of it is sent.
    Writing { answer: Vec<u8>, sent: usize },
}

/// Whether a connection is still being served.
#[derive(Debug, PartialEq, Eq)]
enum Progress {
    /// It waits for its socket.
    Waiting,
    /// It is answered, or gone: close it.
    Done,
}

impl Connection {
    /// Reads and writes what the socket allows now (the poll is edge
    /// triggered: until it would block).
    fn advance(&mut self, published: &Published) -> Progress {
        match self.try_advance(published) {
            Ok(progress) => progress,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => Progress::Waiting,
            Err(_) => Progress::Done,
        }
    }

    fn try_advance(&mut self, published: &Published) -> io::Result<Progress> {
        loop {
            match &mut self.state {
                State::Reading(head) => {
                    let mut chunk = [0u8; 1024];
                    let read = match self.stream.read(&mut chunk) {
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                        read => read?,
                    };
                    if read == 0 {
                        return Ok(Progress::Done);
                    }
                    // Only the new bytes and the three before them can
                    // complete the blank line: a head sent a byte at a
                    // time is not searched again and again.
                    let from = head.len().saturating_sub(3);
                    head.extend_from_slice(&chunk[..read]);
                    if head.len() > MAX_HEAD_BYTES {
                        let answer =
                            reply("431 Request Header Fields Too Large", "text/plain", b"");
                        self.state = State::Writing { answer, sent: 0 };
                    } else if head[from..].windows(4).any(|w| w == b"\r\n\r\n") {
                        let answer = answer(head, published);
                        self.state = State::Writing { answer, sent: 0 };
                    }
                }
                State::Writing { answer, sent } => {
                    let written = match self.stream.write(&answer[*sent..]) {
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                        written => written?,
                    };
                    *sent += written;
                    if written == 0 || *sent == answer.len() {
                        return Ok(Progress::Done);
                    }
                }
            }
        }
    }
}

/// The poll loop and the connections it serves.
struct Server {
    poll: Poll,
    acceptor: Acceptor,
    published: Published,
    /// By serial number: accepted in this order, so the first has the
    /// earliest deadline.
    connections: BTreeMap<usize, Connection>,
    next_serial: usize,
}

impl Server {
    fn new(mut acceptor: Acceptor, published: Published) -> io::Result<Server> {
        let poll = Poll::new()?;
        acceptor.register(&poll)?;
        Ok(Server {
            poll,
            acceptor,
            published,
            connections: BTreeMap::new(),
            next_serial: 0,
        })
    }

    /// Serves until the process ends, or the poll itself fails.
    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            let timeout = self
                .connections
                .first_key_value()
                .map(|(_, first)| first.deadline.saturating_duration_since(Instant::now()));
            if let Err(err) = self.poll.poll(&mut events, timeout) {
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                log::error!(
                    "[metrics] listen: waiting on connections failed, serving no more: {err}"
                );
                return;
            }
            // Connections first, then new ones: a request already in is
            // answered before a burst of arrivals can evict it.
            let mut arrivals = false;
            for event in &events {
                match event.token() {
                    LISTENER => arrivals = true,
                    Token(serial) => self.advance(serial),
                }
            }
            if arrivals {
                self.accept_all();
            }
            self.close_expired(Instant::now());
        }
    }

    /// Accepts every connection waiting.
    fn accept_all(&mut self) {
        loop {
            match self.acceptor.accept() {
                Ok(stream) => self.admit(stream),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                // Out of descriptors, say: those waiting are taken when the
                // next connection wakes the loop.
                Err(err) => {
                    log::debug!("[metrics] listen: accepting failed: {err}");
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut stream: Box<dyn Stream>) {
        if self.connections.len() >= MAX_CONNECTIONS {
            if let Some((_, oldest)) = self.connections.pop_first() {
                self.close(oldest);
            }
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        let interest = Interest::READABLE | Interest::WRITABLE;
        if self
            .poll
            .registry()
            .register(&mut stream, Token(serial), interest)
            .is_err()
        {
            return;
        }
        let connection = Connection {
            stream,
            deadline: Instant::now() + WHOLE_REQUEST,
            state: State::Reading(Vec::new()),
        };
        self.connections.insert(serial, connection);
    }

    fn advance(&mut self, serial: usize) {
        let Some(connection) = self.connections.get_mut(&serial) else {
            // Closed earlier in this round.
            return;
        };
        if connection.advance(&self.published) == Progress::Done {
            if let Some(done) = self.connections.remove(&serial) {
                self.close(done);
            }
        }
    }

    /// Closes every connection past its deadline.
    fn close_expired(&mut self, now: Instant) {
        while let Some(first) = self.connections.first_entry() {
            if first.get().deadline > now {
                return;
            }
            let expired = first.remove();
            self.close(expired);
        }
    }

    fn close(&self, mut connection: Connection) {
        let _ = self.poll.registry().deregister(&mut connection.stream);
    }
}

/// The answer to a complete request head.
fn answer(head: &[u8], published: &Published) -> Vec<u8> {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut words = line.split(|b| *b == b' ');
    let (method, target) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let path = target.split(|b| *b == b'?').next().unwrap_or_default();
    match (method, path) {
        (b"GET", b"/metrics") => reply("200 OK", CONTENT_TYPE, published.render().as_bytes()),
        (b"GET", _) => reply("404 Not Found", "text/plain", b"metrics are at /metrics\n"),
        _ => reply("405 Method Not Allowed", "text/plain", b"GET /metrics\n"),
    }
}

/// A whole HTTP answer, head and body in one buffer (one write, when the
/// socket takes it).
fn reply(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let mut answer = head.into_bytes();
    answer.extend_from_slice(body);
    answer
}

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::telemetry::metrics::Snapshot;

    /// A request that slow clients send a byte at a time.
    const REQUEST: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: slow.example\r\n\r\n";

    /// Serves a snapshot with one series on a free loopback port.
    fn served() -> SocketAddr {
        let published = Published::default();
        let mut snapshot = Snapshot::default();
        snapshot.gauge(
            "agentos_agents",
            "Agents by state.",
            &[("state", "running")],
            2,
        );
        published.publish(snapshot);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        serve(&Listen::parse(&format!("127.0.0.1:{port}")), published).unwrap();
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn get(address: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn the_latest_snapshot_is_served_at_metrics_and_nothing_else() {
        let address = served();
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

    /// `count` clients, each holding a connection to `address` and sending
    /// one byte of [`REQUEST`] per `every`; one whose connection is closed
    /// connects again at once.
    struct SlowClients {
        stop: Arc<AtomicBool>,
        /// Connections made, reconnections included.
        connected: Arc<AtomicUsize>,
        /// Connections the server closed on them.
        cut: Arc<AtomicUsize>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl SlowClients {
        fn start(address: SocketAddr, count: usize, every: Duration) -> SlowClients {
            let stop = Arc::new(AtomicBool::new(false));
            let connected = Arc::new(AtomicUsize::new(0));
            let cut = Arc::new(AtomicUsize::new(0));
            let (stop_, connected_, cut_) = (stop.clone(), connected.clone(), cut.clone());
            let thread = std::thread::spawn(move || {
                let mut clients: Vec<Option<(TcpStream, usize, Instant)>> =
                    (0..count).map(|_| None).collect();
                while !stop_.load(Ordering::SeqCst) {
                    let now = Instant::now();
                    for client in &mut clients {
                        let Some((stream, sent, next)) = client else {
                            let stream = TcpStream::connect(address).unwrap();
                            stream.set_nonblocking(true).unwrap();
                            *client = Some((stream, 0, now));
                            connected_.fetch_add(1, Ordering::SeqCst);
                            continue;
                        };
                        // Closed (or, wrongly, answered): connect again.
                        let closed = match stream.read(&mut [0u8; 1]) {
                            Err(err) => err.kind() != io::ErrorKind::WouldBlock,
                            Ok(_) => true,
                        };
                        let closed = closed
                            || (now >= *next && stream.write_all(&REQUEST[*sent..=*sent]).is_err());
                        if closed {
                            cut_.fetch_add(1, Ordering::SeqCst);
                            *client = None;
                        } else if now >= *next {
                            *sent = (*sent + 1).min(REQUEST.len() - 2);
                            *next = now + every;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
            SlowClients {
                stop,
                connected,
                cut,
                thread: Some(thread),
            }
        }
    }

    impl Drop for SlowClients {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }

    /// Waits (up to 10 s) for `condition`.
    fn eventually(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Scrapes `address` ten times, a quarter of a second apart, each
    /// answered within a second.
    fn ten_scrapes_each_answered_within_a_second(address: SocketAddr) {
        for scrape in 0..10 {
            let started = Instant::now();
            let mut stream = TcpStream::connect(address).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(1)))
                .unwrap();
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut answer = String::new();
            let read = stream.read_to_string(&mut answer);
            let took = started.elapsed();
            assert!(
                read.is_ok() && took < Duration::from_secs(1),
                "scrape {scrape} of 10: {read:?} after {took:?}: {answer:?}"
            );
            assert!(
                answer.contains("agentos_agents{state=\"running\"} 2"),
                "scrape {scrape}: {answer}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    #[test]
    fn scrapes_are_answered_within_a_second_while_a_hundred_slow_clients_hold_connections() {
        let address = served();
        // A byte every 4 s: slower than the deadline, faster than any
        // per-read timeout worth having.
        let slow = SlowClients::start(address, 100, Duration::from_secs(4));
        eventually("100 slow clients connected", || {
            slow.connected.load(Ordering::SeqCst) >= 100
        });
        std::thread::sleep(Duration::from_millis(300));
        ten_scrapes_each_answered_within_a_second(address);
        // They were held until the deadline, and came back.
        eventually("slow clients cut off at the deadline", || {
            slow.cut.load(Ordering::SeqCst) >= 100
        });
    }

    #[test]
    fn scrapes_are_answered_within_a_second_while_slow_clients_hold_every_slot() {
        // Two descriptors a connection, both ends in this process.
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let needed = 4 * MAX_CONNECTIONS as u64;
        if soft < needed {
            setrlimit(Resource::RLIMIT_NOFILE, hard.min(needed), hard).unwrap();
        }
        let address = served();
        let holders = MAX_CONNECTIONS + 10;
        let slow = SlowClients::start(address, holders, Duration::from_secs(4));
        eventually("every slot held", || {
            slow.connected.load(Ordering::SeqCst) >= holders
        });
        std::thread::sleep(Duration::from_millis(300));
        ten_scrapes_each_answered_within_a_second(address);
    }

    #[test]
    fn a_client_sending_a_byte_every_half_second_is_cut_off_at_the_whole_request_deadline() {
        let address = served();
        let started = Instant::now();
        let mut stream = TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut sent = 0;
        let cut_off = loop {
            if sent == REQUEST.len() {
                break None;
            }
            if stream.write_all(&REQUEST[sent..=sent]).is_err() {
                break Some(started.elapsed());
            }
            sent += 1;
            // The wait between bytes: the server's closing ends it at once.
            let mut answer = Vec::new();
            match stream.read_to_end(&mut answer) {
                Ok(_) => {
                    assert!(
                        answer.is_empty(),
                        "answered: {}",
                        String::from_utf8_lossy(&answer)
                    );
                    break Some(started.elapsed());
                }
                Err(err) if err.kind() == io::ErrorKind::ConnectionReset => {
                    break Some(started.elapsed());
                }
                Err(err) => assert!(
                    matches!(
                        err.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ),
                    "{err}"
                ),
            }
        };
        let cut_off = cut_off.expect("the whole request was sent and never cut off");
        assert!(
            cut_off >= WHOLE_REQUEST && cut_off < WHOLE_REQUEST + Duration::from_secs(3),
            "cut off after {cut_off:?}, having sent {sent} bytes"
        );
    }
}
