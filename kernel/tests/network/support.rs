//! What the proxy tests stand on: a proxy serving a listener on the
//! host's loopback, upstream servers on loopback (plain HTTP, HTTPS with a
//! test CA, echo, a byte source), and a small HTTP client.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::{Duration, Instant};

use agentos_egress::policy::Policy;
use agentos_egress::proxy::{Proxy, ProxySettings};
use agentos_egress::record::{Attempt, Record, Totals};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, StreamOwned};

pub const WAIT: Duration = Duration::from_secs(10);

pub fn policy(json: &str) -> Policy {
    Policy::from_proto(&serde_json::from_str(json).unwrap()).unwrap()
}

/// Settings naming the test hosts: `*.test` names map to loopback.
pub fn settings() -> ProxySettings {
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    let mut resolve = HashMap::new();
    for name in [
        "allowed.test",
        "denied.test",
        "other.test",
        "cred.test",
        "sneaky.test",
    ] {
        resolve.insert(name.to_owned(), vec![loopback]);
    }
    resolve.insert(
        "meta.test".to_owned(),
        vec!["169.254.169.254".parse().unwrap()],
    );
    resolve.insert(
        "public.test".to_owned(),
        vec!["93.184.216.34".parse().unwrap()],
    );
    ProxySettings {
        resolve,
        extra_roots_pem: test_ca().pem.clone().into_bytes(),
        head_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..ProxySettings::default()
    }
}

/// A proxy serving one sandbox (id 1) on a loopback listener.
pub struct Served {
    pub proxy: Proxy,
    pub address: SocketAddr,
    pub record: Arc<Mutex<Record>>,
    /// Dropped last, after the proxy's thread has ended.
    _turn: Turn,
}

/// Tests share the process; one that takes its descriptors away runs
/// alone.
static TURNS: RwLock<()> = RwLock::new(());

#[allow(dead_code)]
enum Turn {
    Shared(RwLockReadGuard<'static, ()>),
    Alone(RwLockWriteGuard<'static, ()>),
}

pub fn serve(settings: ProxySettings, policy_json: &str) -> Served {
    let turn = Turn::Shared(TURNS.read().unwrap_or_else(|e| e.into_inner()));
    serve_in(turn, settings, policy_json)
}

/// [`serve`], with no other test's proxy running meanwhile.
pub fn serve_alone(settings: ProxySettings, policy_json: &str) -> Served {
    let turn = Turn::Alone(TURNS.write().unwrap_or_else(|e| e.into_inner()));
    serve_in(turn, settings, policy_json)
}

fn serve_in(turn: Turn, settings: ProxySettings, policy_json: &str) -> Served {
    let proxy = Proxy::start(settings).unwrap();
    let (address, record) = endpoint(&proxy, 1, policy_json);
    Served {
        proxy,
        address,
        record,
        _turn: turn,
    }
}

/// Serves sandbox `id` on a fresh loopback listener.
pub fn endpoint(proxy: &Proxy, id: u64, policy_json: &str) -> (SocketAddr, Arc<Mutex<Record>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let address = listener.local_addr().unwrap();
    let record = proxy.serve(
        id,
        format!("test sandbox {id}"),
        listener,
        policy(policy_json),
    );
    (address, record)
}

impl Served {
    pub fn totals(&self) -> Totals {
        self.record.lock().unwrap().totals()
    }

    pub fn attempts(&self) -> Vec<Attempt> {
        self.record.lock().unwrap().attempts().0.cloned().collect()
    }

    /// Waits until the record says what `done` looks for.
    pub fn wait_for(&self, what: &str, done: impl Fn(&Record) -> bool) {
        let until = Instant::now() + WAIT;
        while !done(&self.record.lock().unwrap()) {
            assert!(
                Instant::now() < until,
                "the record never showed {what}: {:?}",
                self.attempts()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A connection to the proxy that asked `CONNECT target` and read the
/// answer's head: its status and the whole head.
pub fn connect(proxy: SocketAddr, target: &str) -> (TcpStream, u16, String) {
    let mut stream = TcpStream::connect(proxy).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        stream,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
    )
    .unwrap();
    let (status, head) = read_head(&mut stream);
    (stream, status, head)
}

/// Reads a response head byte by byte (so nothing after it is taken).
pub fn read_head(stream: &mut impl Read) -> (u16, String) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            Ok(_) => break,
            Err(e) => panic!(
                "reading a response head: {e} after {:?}",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    let head = String::from_utf8(head).unwrap();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head)
}

/// A response: status, head and body (by Content-Length, or to the end).
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn read_response(stream: &mut impl Read) -> Response {
    let (status, head) = read_head(stream);
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    let mut body = Vec::new();
    match length {
        Some(n) => {
            body.resize(n, 0);
            stream.read_exact(&mut body).unwrap();
        }
        None => {
            let _ = stream.read_to_end(&mut body);
        }
    }
    Response { status, head, body }
}

/// The test CA, and the leaf its HTTPS servers present.
pub struct TestCa {
    pub pem: String,
    pub leaf_der: CertificateDer<'static>,
    pub server: Arc<ServerConfig>,
}

pub fn test_ca() -> &'static TestCa {
    static CA: std::sync::OnceLock<TestCa> = std::sync::OnceLock::new();
    CA.get_or_init(|| {
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca = params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let names = [
            "allowed.test",
            "other.test",
            "cred.test",
            "127.0.0.1",
            "::1",
        ];
        let leaf = CertificateParams::new(names.map(String::from).to_vec())
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let mut server =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)
                .unwrap();
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        TestCa {
            pem: ca.pem(),
            leaf_der: leaf.der().clone(),
            server: Arc::new(server),
        }
    })
}

/// A TLS client session over `stream` for `name`, trusting `ca_pem` only.
pub fn tls(
    stream: TcpStream,
    name: &str,
    ca_pem: &str,
) -> StreamOwned<ClientConnection, TcpStream> {
    let mut roots = RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        let cert: CertificateDer<'static> = cert.unwrap();
        roots.add(cert).unwrap();
    }
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let session = ClientConnection::new(Arc::new(config), name).unwrap();
    StreamOwned::new(session, stream)
}

/// An upstream server on loopback; what it was sent is kept.
pub struct Upstream {
    pub port: u16,
    /// Each request head received, in order, with the connection's number.
    pub heads: Arc<Mutex<Vec<(usize, String)>>>,
}

impl Upstream {
    pub fn heads(&self) -> Vec<(usize, String)> {
        self.heads.lock().unwrap().clone()
    }
}

/// What an upstream server does with a connection.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// HTTP/1.1 with keep-alive: each response body says what the request
    /// head and body were.
    Http,
    /// The same inside TLS with the test CA's leaf.
    Https,
    /// Sends back what it reads.
    Echo,
    /// Sends this many bytes (a counting pattern), then closes.
    Source(u64),
    /// A lenient HTTP/1.1 server, as many real ones are: a bare LF or a
    /// bare CR ends a line as CRLF does; a line starting with whitespace
    /// continues the field before it; whitespace before a field's colon is
    /// ignored; a Transfer-Encoding naming `chunked` anywhere wins over
    /// Content-Length, on HTTP/1.0 too; the last Content-Length counts, read
    /// as its first list item, signed (`+5`, `5, 5`); a chunk-size line may
    /// end in a bare LF and carry extensions; a two-word request line
    /// (HTTP/0.9) is taken; and every request on a connection is answered,
    /// whatever `Connection` says (pipelining). Like a CDN in front of its
    /// origin, it drops the fields `Connection` names before it frames the
    /// body; and it ignores a body on GET, HEAD or OPTIONS. Its answer's
    /// body is the request's body; each head is kept as it was read.
    Lenient,
    /// The same inside TLS with the test CA's leaf.
    LenientTls,
}

pub fn upstream(kind: Kind) -> Upstream {
    upstream_on("127.0.0.1:0", kind)
}

pub fn upstream_on(bind: &str, kind: Kind) -> Upstream {
    let listener = TcpListener::bind(bind).unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let kept = heads.clone();
    thread::spawn(move || {
        for (number, stream) in listener.incoming().enumerate() {
            let Ok(stream) = stream else { continue };
            let heads = kept.clone();
            thread::spawn(move || match kind {
                Kind::Http => http_server(stream, number, &heads),
                Kind::Https => {
                    let session = rustls::ServerConnection::new(test_ca().server.clone()).unwrap();
                    http_server(StreamOwned::new(session, stream), number, &heads);
                }
                Kind::Lenient => lenient_server(stream, number, &heads),
                Kind::LenientTls => {
                    let session = rustls::ServerConnection::new(test_ca().server.clone()).unwrap();
                    lenient_server(StreamOwned::new(session, stream), number, &heads);
                }
                Kind::Echo => {
                    let mut reader = stream.try_clone().unwrap();
                    let mut writer = stream;
                    let _ = std::io::copy(&mut reader, &mut writer);
                }
                Kind::Source(total) => {
                    let mut stream = stream;
                    let chunk: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
                    let mut left = total;
                    while left > 0 {
                        let n = left.min(chunk.len() as u64) as usize;
                        if stream.write_all(&chunk[..n]).is_err() {
                            return;
                        }
                        left -= n as u64;
                    }
                }
            });
        }
    });
    Upstream { port, heads }
}

fn http_server(mut stream: impl Read + Write, number: usize, heads: &Mutex<Vec<(usize, String)>>) {
    loop {
        let (_, head) = {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match stream.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => return,
                }
            }
            (0, String::from_utf8_lossy(&head).into_owned())
        };
        heads.lock().unwrap().push((number, head.clone()));
        let length = head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        });
        let mut body = vec![0; length.unwrap_or(0)];
        if stream.read_exact(&mut body).is_err() {
            return;
        }
        let reply = format!("{head}{}", String::from_utf8_lossy(&body));
        let close = head.to_ascii_lowercase().contains("connection: close");
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{}\r\n{reply}",
            reply.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        if stream.write_all(answer.as_bytes()).is_err() || stream.flush().is_err() || close {
            return;
        }
    }
}

/// A stream read as a lenient server reads it: a byte at a time, with one
/// byte put back after a bare CR, and every byte read kept.
struct LenientReader<S> {
    stream: S,
    back: Option<u8>,
    read: Vec<u8>,
}

impl<S: Read> LenientReader<S> {
    fn byte(&mut self) -> Option<u8> {
        if let Some(byte) = self.back.take() {
            return Some(byte);
        }
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(1) => {
                self.read.push(byte[0]);
                Some(byte[0])
            }
            _ => None,
        }
    }

    /// A line ended by CRLF, a bare LF or a bare CR, without its end.
    fn line(&mut self) -> Option<String> {
        let mut line = Vec::new();
        loop {
            match self.byte()? {
                b'\n' => break,
                b'\r' => {
                    match self.byte() {
                        Some(b'\n') | None => {}
                        Some(other) => self.back = Some(other),
                    }
                    break;
                }
                byte => line.push(byte),
            }
        }
        Some(String::from_utf8_lossy(&line).into_owned())
    }

    /// Header fields to the empty line, names lowercased: a line that
    /// starts with whitespace continues the field before it, and
    /// whitespace around a name is dropped.
    fn fields(&mut self) -> Option<Vec<(String, String)>> {
        let mut fields: Vec<(String, String)> = Vec::new();
        loop {
            let line = self.line()?;
            if line.is_empty() {
                return Some(fields);
            }
            if line.starts_with([' ', '\t']) {
                if let Some((_, value)) = fields.last_mut() {
                    value.push(' ');
                    value.push_str(line.trim());
                }
                continue;
            }
            let (name, value) = line.split_once(':').unwrap_or((&line, ""));
            fields.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }

    fn bytes(&mut self, n: usize) -> Option<Vec<u8>> {
        (0..n).map(|_| self.byte()).collect()
    }

    /// A chunked body, as leniently as it is framed.
    fn chunked(&mut self) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line = self.line()?;
            let size = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16).ok()?;
            if size == 0 {
                // Trailer fields, to the empty line.
                while !self.line()?.is_empty() {}
                return Some(body);
            }
            body.extend(self.bytes(size)?);
            self.line()?;
        }
    }
}

fn lenient_server(stream: impl Read + Write, number: usize, heads: &Mutex<Vec<(usize, String)>>) {
    let mut reader = LenientReader {
        stream,
        back: None,
        read: Vec::new(),
    };
    loop {
        reader.read.clear();
        let Some(request_line) = reader.line() else {
            return;
        };
        if request_line.is_empty() {
            continue;
        }
        // HTTP/0.9: a request line alone.
        let simple = request_line.split_whitespace().count() < 3;
        let fields = if simple {
            Some(Vec::new())
        } else {
            reader.fields()
        };
        let Some(mut fields) = fields else { return };
        let head = String::from_utf8_lossy(&reader.read).into_owned();
        heads.lock().unwrap().push((number, head));
        let named: Vec<String> = fields
            .iter()
            .filter(|(name, _)| name == "connection")
            .flat_map(|(_, value)| value.split(',').map(|o| o.trim().to_ascii_lowercase()))
            .collect();
        fields.retain(|(name, _)| !named.contains(name));
        let method = request_line.split_whitespace().next().unwrap_or_default();
        if matches!(method, "GET" | "HEAD" | "OPTIONS") {
            fields.retain(|(name, _)| name != "content-length" && name != "transfer-encoding");
        }
        let chunked = fields.iter().any(|(name, value)| {
            name == "transfer-encoding" && value.to_ascii_lowercase().contains("chunked")
        });
        let length = fields
            .iter()
            .rev()
            .find(|(name, _)| name == "content-length")
            .and_then(|(_, value)| value.split(',').next()?.trim().parse::<i64>().ok())
            .unwrap_or(0);
        let body = if chunked {
            reader.chunked()
        } else {
            reader.bytes(usize::try_from(length).unwrap_or(0))
        };
        let Some(body) = body else { return };
        let mut answer = if simple {
            Vec::new()
        } else {
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes()
        };
        answer.extend_from_slice(&body);
        let stream = &mut reader.stream;
        if stream.write_all(&answer).is_err() || stream.flush().is_err() || simple {
            return;
        }
    }
}
