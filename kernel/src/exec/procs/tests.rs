//! `Procs` against a fake steward on the other end of its socket: what a
//! hostile one (or one that dies) comes to. No sandbox, no processes.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use agentos_proto::payload::{ProcStart, ProcState};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::{Events, Poll};

use super::*;
use crate::address::{ConnKey, ReplyTo};

struct Fake {
    poll: Poll,
    procs: Procs,
    steward: UnixStream,
    key: SessionKey,
}

fn reply_to(seq: u64) -> ReplyTo {
    ReplyTo::Request {
        conn: ConnKey {
            index: 0,
            serial: 1,
        },
        seq,
    }
}

fn start(argv: &str) -> ProcStart {
    ProcStart {
        session: "s".to_owned(),
        argv: vec![argv.to_owned()],
        ..ProcStart::default()
    }
}

/// A `Procs` with one `start` sent to a fake steward, whose order is read.
fn started() -> Fake {
    let poll = Poll::new().unwrap();
    let mut procs = Procs::new(poll.registry(), 0).unwrap();
    let key = (Principal::Operator { uid: 1 }, "s".to_owned());
    let theirs = procs
        .start(
            &key,
            start("true"),
            &BTreeMap::new(),
            reply_to(1),
            &mut Vec::new(),
        )
        .unwrap()
        .expect("a new steward's socket");
    let mut steward = UnixStream::from(theirs);
    let mut header = [0u8; 4];
    steward.read_exact(&mut header).unwrap();
    let mut order = vec![0u8; u32::from_le_bytes(header) as usize];
    steward.read_exact(&mut order).unwrap();
    let order: serde_json::Value = serde_json::from_slice(&order).unwrap();
    assert_eq!(
        (order["op"].as_str(), order["ref"].as_u64()),
        (Some("start"), Some(1))
    );
    Fake {
        poll,
        procs,
        steward,
        key,
    }
}

impl Fake {
    /// Another start of `true` in the session, answered to `seq`.
    fn start_again(&mut self, seq: u64) -> Result<Option<OwnedFd>, ErrorReply> {
        let no_env = BTreeMap::new();
        (self.procs).start(
            &self.key,
            start("true"),
            &no_env,
            reply_to(seq),
            &mut Vec::new(),
        )
    }

    fn says(&mut self, json: &str) -> Vec<Reply> {
        let mut frame = (json.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(json.as_bytes());
        self.steward.write_all(&frame).unwrap();
        self.turn()
    }

    fn turn(&mut self) -> Vec<Reply> {
        let mut events = Events::with_capacity(8);
        self.poll
            .poll(&mut events, Some(Duration::from_millis(200)))
            .unwrap();
        let mut replies = Vec::new();
        for event in &events {
            self.procs
                .on_event(event.token(), &mut replies, Instant::now());
        }
        replies
    }
}

fn code_of(answer: &Answer) -> Option<ErrorCode> {
    match answer {
        Answer::Error(err) => Some(err.code),
        _ => None,
    }
}

#[test]
fn a_start_is_answered_once_its_steward_says_it_started() {
    let mut fake = started();
    assert!(fake.says(r#"{"hello":3}"#).is_empty());
    let replies = fake.says(r#"{"started":1,"pid":4,"cwd":"/home/user"}"#);
    assert_eq!(replies.len(), 1);
    let Answer::Json(body) = &replies[0].1 else {
        panic!("{replies:?}")
    };
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(
        (body["success"].as_bool(), body["pid"].as_u64()),
        (Some(true), Some(4))
    );
    let listed = fake.procs.processes(&fake.key);
    assert_eq!((listed[0].pid, listed[0].cwd.as_str()), (4, "/home/user"));
}

#[test]
fn what_a_steward_may_not_say_drops_it_and_answers_what_it_owed() {
    for hostile in [
        r#"{"started":99,"pid":4,"cwd":"/"}"#,
        r#"{"started":1,"pid":1,"cwd":"/"}"#,
        r#"{"started":1,"pid":0,"cwd":"/"}"#,
        r#"{"started":1,"pid":4,"cwd":"relative"}"#,
        r#"{"signalled":1,"sent":true}"#,
        r#"{"failed":99,"errno":2,"error":"x"}"#,
        r#"{"ended":77,"exit_code":0,"signal":null}"#,
        r#"{"hello":3,"also":1}"#,
        r#"{"hello":1}"#,
        "[]",
    ] {
        let mut fake = started();
        let replies = fake.says(hostile);
        let codes: Vec<_> = replies.iter().map(|(_, a)| code_of(a)).collect();
        assert_eq!(
            codes,
            vec![Some(ErrorCode::Unavailable)],
            "{hostile}: {replies:?}"
        );
        assert!(fake.procs.processes(&fake.key).is_empty(), "{hostile}");
        // The next start asks for a new steward.
        let again = fake.start_again(2);
        assert!(again.unwrap().is_some(), "{hostile}");
    }
}

#[test]
fn a_steward_that_sends_a_frame_too_large_or_a_descriptor_is_dropped() {
    let mut fake = started();
    let huge = format!(r#"{{"hello":3,"x":"{}"}}"#, "a".repeat(70 << 10));
    let replies = fake.says(&huge);
    assert_eq!(replies.len(), 1);
    assert_eq!(code_of(&replies[0].1), Some(ErrorCode::Unavailable));

    let mut fake = started();
    let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
    fd::send_with_fds(std::os::fd::AsFd::as_fd(&fake.steward), b"\x05", &[pipe_r]).unwrap();
    let replies = fake.turn();
    assert_eq!(replies.len(), 1);
    assert_eq!(code_of(&replies[0].1), Some(ErrorCode::Unavailable));
}

#[test]
fn a_steward_that_dies_ends_its_processes_once_their_output_closes() {
    let mut fake = started();
    fake.says(r#"{"hello":3}"#);
    fake.says(r#"{"started":1,"pid":4,"cwd":"/"}"#);
    assert!(fake.procs.in_use(&fake.key));
    fake.steward.shutdown(std::net::Shutdown::Both).unwrap();
    // Its pipes' other ends came with the order, unread: closed, so the
    // output has ended too.
    for _ in 0..3 {
        fake.turn();
    }
    let listed = fake.procs.processes(&fake.key);
    assert_eq!(listed[0].state, ProcState::Ended, "{listed:?}");
    let reason = listed[0].end.reason.as_deref();
    assert_eq!(reason, Some("its steward or its session ended"));
    assert!(!fake.procs.in_use(&fake.key));
}

#[test]
fn a_steward_that_stops_answering_is_dropped_and_its_callers_told() {
    let mut fake = started();
    fake.procs.answer_within = Duration::from_millis(50);
    // Its hello starts the clock on the order it has.
    assert!(fake.says(r#"{"hello":3}"#).is_empty());
    std::thread::sleep(Duration::from_millis(80));
    let mut replies = Vec::new();
    fake.procs.on_deadlines(Instant::now(), &mut replies);
    let codes: Vec<_> = replies.iter().map(|(_, a)| code_of(a)).collect();
    assert_eq!(codes, vec![Some(ErrorCode::Unavailable)], "{replies:?}");
    let again = fake.start_again(2);
    assert!(again.unwrap().is_some(), "a new steward is asked for");
}

#[test]
fn starts_waiting_for_the_steward_count_against_the_caps() {
    let mut fake = started();
    for seq in 2..=64 {
        let asked = fake.start_again(seq);
        assert!(asked.is_ok(), "start {seq}: {asked:?}");
    }
    let refused = fake.start_again(65);
    assert_eq!(refused.unwrap_err().code, ErrorCode::LimitExceeded);
}

#[test]
fn a_flooding_steward_is_read_a_budget_at_a_time() {
    let mut fake = started();
    let hello = br#"{"hello":3}"#;
    let mut frame = (hello.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(hello);
    // Far more than one turn reads; the second hello ends it all the same.
    let flood: Vec<u8> = frame
        .iter()
        .copied()
        .cycle()
        .take(frame.len() * 20_000)
        .collect();
    let writer = std::thread::spawn({
        let mut steward = fake.steward.try_clone().unwrap();
        move || {
            let _ = steward.write_all(&flood);
        }
    });
    let mut replies = Vec::new();
    for _ in 0..50 {
        replies.extend(fake.turn());
        if !replies.is_empty() {
            break;
        }
    }
    assert_eq!(
        replies.len(),
        1,
        "the start owed is answered once: {replies:?}"
    );
    assert_eq!(code_of(&replies[0].1), Some(ErrorCode::Unavailable));
    drop(fake);
    writer.join().unwrap();
}
