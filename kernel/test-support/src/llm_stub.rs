//! A stand-in LLM provider: a small HTTP/1.1 server on 127.0.0.1 that
//! records every request and answers from a script, in the wire format of
//! any provider. Tests use it to check exactly what the kernel sends and
//! how it treats rate limits, errors and hangs; the THINK benchmark uses it
//! for a provider whose cost is known exactly.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One request as the stub received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// When it had fully arrived.
    pub at: Instant,
    /// `POST`, …
    pub method: String,
    /// The path, with any query.
    pub path: String,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Recorded {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (`null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// What the stub answers.
#[derive(Clone, Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// Time to wait before answering.
    pub delay: Duration,
}

impl Reply {
    /// A JSON reply.
    pub fn json(status: u16, body: &serde_json::Value) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: body.to_string().into_bytes(),
            delay: Duration::ZERO,
        }
    }

    /// A raw reply.
    pub fn raw(status: u16, body: &[u8]) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: body.to_vec(),
            delay: Duration::ZERO,
        }
    }

    /// An OpenAI chat completion.
    pub fn openai(content: &str, prompt_tokens: u64, completion_tokens: u64) -> Reply {
        Reply::json(
            200,
            &serde_json::json!({
                "id": "chatcmpl-stub", "object": "chat.completion", "model": "stub-model",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens},
            }),
        )
    }

    /// An Anthropic message.
    pub fn anthropic(content: &str, input_tokens: u64, output_tokens: u64) -> Reply {
        Reply::json(
            200,
            &serde_json::json!({
                "id": "msg_stub", "type": "message", "role": "assistant", "model": "stub-model",
                "content": [{"type": "text", "text": content}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
            }),
        )
    }

    /// A Gemini generateContent answer.
    pub fn gemini(content: &str, prompt_tokens: u64, candidate_tokens: u64) -> Reply {
        Reply::json(
            200,
            &serde_json::json!({
                "candidates": [{"content": {"role": "model", "parts": [{"text": content}]},
                                "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": prompt_tokens,
                                  "candidatesTokenCount": candidate_tokens,
                                  "totalTokenCount": prompt_tokens + candidate_tokens},
                "modelVersion": "stub-model",
            }),
        )
    }

    /// The same reply, with a header added.
    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The same reply, sent after `delay`.
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

/// Decides the reply to a request; gets the request and its index (0 for
/// the first the stub received).
pub type Script = dyn Fn(&Recorded, usize) -> Reply + Send + Sync;

/// A running stub; stops when dropped.
pub struct Stub {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    stopped: Arc<AtomicBool>,
}

impl std::fmt::Debug for Stub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stub").field("addr", &self.addr).finish()
    }
}

impl Stub {
    /// Starts a stub answering by `script`.
    pub fn start(script: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static) -> Stub {
        Stub::start_at("127.0.0.1:0", script)
    }

    /// Starts a stub on `address` (`127.0.0.1:PORT`), answering by `script`.
    pub fn start_at(
        address: &str,
        script: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static,
    ) -> Stub {
        let listener = TcpListener::bind(address).unwrap_or_else(|e| panic!("bind {address}: {e}"));
        let addr = listener.local_addr().expect("local address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stopped = Arc::new(AtomicBool::new(false));
        let script: Arc<Script> = Arc::new(script);
        let (log, stop) = (requests.clone(), stopped.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (log, script) = (log.clone(), script.clone());
                std::thread::spawn(move || serve(stream, &log, script.as_ref()));
            }
        });
        Stub {
            addr,
            requests,
            stopped,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.requests).clone()
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Serves one keep-alive connection until the client closes it.
fn serve(stream: TcpStream, log: &Mutex<Vec<Recorded>>, script: &Script) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader) {
        let index = {
            let mut log = lock(log);
            log.push(request.clone());
            log.len() - 1
        };
        let reply = script(&request, index);
        std::thread::sleep(reply.delay);
        let mut head = format!(
            "HTTP/1.1 {} Stub\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            reply.status,
            reply.body.len()
        );
        for (name, value) in &reply.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        // One write: a head and body sent apart would wait on Nagle and
        // the client's delayed ACK, 40 ms a reply.
        let mut message = head.into_bytes();
        message.extend_from_slice(&reply.body);
        if writer.write_all(&message).is_err() {
            return;
        }
    }
}

/// Reads one request; `None` at the end of the connection or on nonsense.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Recorded> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let body = if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        read_chunked(reader)?
    } else {
        let length: usize = find("content-length").map_or(Some(0), |v| v.parse().ok())?;
        let mut body = vec![0; length];
        reader.read_exact(&mut body).ok()?;
        body
    };
    Some(Recorded {
        at: Instant::now(),
        method,
        path,
        headers,
        body,
    })
}

fn read_chunked(reader: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        reader.read_line(&mut size).ok()?;
        let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).ok()?;
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(&chunk[..size]);
    }
}
