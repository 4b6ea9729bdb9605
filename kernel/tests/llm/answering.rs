//! A provider that takes the connection and never answers: THINK says so
//! within seconds (not after two minute-long attempts), HELLO calls it
//! "not answering", and it recovers by itself once the provider answers.
//! A provider that is merely slow, but answers the health probe, is
//! waited for.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::llm_stub::{Reply, Stub};
use agentos_test_support::{request, Daemon};
use serde_json::{json, Value};

use crate::{daemon_for, KEY};

/// A provider on 127.0.0.1 that accepts every connection and, until told
/// to answer, holds it without a byte in reply.
struct Silent {
    host: String,
    answering: Arc<AtomicBool>,
}

impl Silent {
    fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let answering = Arc::new(AtomicBool::new(false));
        let held = Arc::new(Mutex::new(Vec::new()));
        let answer = answering.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if answer.load(Ordering::SeqCst) {
                    std::thread::spawn(move || serve(stream));
                } else {
                    held.lock().unwrap().push(stream);
                }
            }
        });
        Silent { host, answering }
    }

    fn answer_from_now_on(&self) {
        self.answering.store(true, Ordering::SeqCst);
    }
}

/// Answers requests on one connection: a chat completion to a POST, an
/// empty model list to anything else.
fn serve(stream: TcpStream) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let post = line.starts_with("POST");
        let mut length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let answer = if post {
            Reply::openai("back again", 3, 2).body
        } else {
            br#"{"data":[]}"#.to_vec()
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            answer.len()
        );
        if writer
            .write_all(&[head.as_bytes(), &answer].concat())
            .is_err()
        {
            return;
        }
    }
}

fn hello_llm(daemon: &Daemon) -> Value {
    let mut client = daemon.client();
    request(&mut client, Opcode::HELLO, &json!({}))["llm"].clone()
}

#[test]
fn a_provider_that_never_answers_fails_think_in_seconds_and_recovers_when_it_answers() {
    let silent = Silent::start();
    let daemon = Daemon::start_with(&format!(
        "[llm]\nprovider = \"openai\"\nbase_url = \"http://{}/v1\"\napi_key = \"{KEY}\"\n\
         model = \"stub-model\"\n",
        silent.host
    ));
    let mut client = daemon.client();
    let started = Instant::now();
    let reply = request(&mut client, Opcode::THINK, &json!({"prompt": "hi"}));
    let took = started.elapsed();
    assert_eq!(reply["success"], false, "{reply}");
    assert_eq!(reply["code"], "unavailable", "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(error.contains("not answering"), "{error}");
    assert!(
        error.contains(&silent.host),
        "the error names the host: {error}"
    );
    // Two seconds' wait, then a probe of three: far below the two
    // minute-long attempts the call alone would make.
    assert!(
        took < Duration::from_secs(20),
        "a silent provider took {took:?}"
    );

    let llm = hello_llm(&daemon);
    assert_eq!(llm["state"], "not_answering", "{llm}");
    assert_eq!(llm["ready"], false, "{llm}");
    let reason = llm["reason"].as_str().unwrap();
    assert!(reason.starts_with("not answering since "), "{reason}");
    assert!(!reason.contains("connection refused"), "{reason}");

    // While it stays silent, THINK is refused at once.
    let started = Instant::now();
    let again = request(&mut client, Opcode::THINK, &json!({"prompt": "hi"}));
    assert_eq!(again["code"], "unavailable", "{again}");
    assert!(again["error"].as_str().unwrap().contains("not answering"));
    assert!(started.elapsed() < Duration::from_secs(2), "{again}");

    // It answers again: the next probe finds it, and THINK works.
    silent.answer_from_now_on();
    let deadline = Instant::now() + Duration::from_secs(30);
    while hello_llm(&daemon)["state"] != "ready" {
        assert!(Instant::now() < deadline, "{}", hello_llm(&daemon));
        std::thread::sleep(Duration::from_millis(200));
    }
    let reply = request(&mut client, Opcode::THINK, &json!({"prompt": "hi"}));
    assert_eq!(reply["success"], true, "{reply}");
    assert_eq!(reply["content"], "back again", "{reply}");
}

#[test]
fn a_slow_provider_that_answers_the_probe_is_waited_for() {
    // Six seconds to generate: past the wait after which the provider is
    // probed, and past the probe's own timeout.
    let stub = Stub::start(|request, _| match request.method.as_str() {
        "GET" => Reply::json(200, &json!({"data": []})),
        _ => Reply::openai("slow but sure", 10, 5).after(Duration::from_secs(6)),
    });
    let daemon = daemon_for("openai", &stub, "");
    let mut client = daemon.client();
    let reply = request(&mut client, Opcode::THINK, &json!({"prompt": "hi"}));
    assert_eq!(reply["success"], true, "{reply}");
    assert_eq!(reply["content"], "slow but sure", "{reply}");
    let probes: Vec<String> = (stub.requests().iter())
        .filter(|r| r.method == "GET")
        .map(|r| r.path.clone())
        .collect();
    assert!(!probes.is_empty(), "the slow call was never probed");
    assert!(probes.iter().all(|path| path == "/v1/models"), "{probes:?}");
    assert_eq!(hello_llm(&daemon)["state"], "ready");
}
