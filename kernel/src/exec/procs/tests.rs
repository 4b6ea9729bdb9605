//! `Procs` against a fake steward on the other end of its socket: what a
//! hostile one (or one that dies) comes to. No sandbox, no processes.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use agentos_proto::payload::{
    ExecCall, FileCall, FileEvents, ProcRef, ProcStart, ProcState, Signal,
};
use agentos_proto::{ErrorCode, ErrorReply};
use mio::{Events, Poll};

use super::*;
use crate::address::{ConnKey, ReplyTo};
use crate::fd;

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
            (&key, Some(1)),
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
            (&self.key, Some(1)),
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
    let since = Instant::now();
    assert!(fake.procs.in_use(&fake.key, since));
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
    assert!(!fake.procs.in_use(&fake.key, since));
}

#[test]
fn a_file_op_owed_or_given_since_keeps_a_session_in_use() {
    let mut fake = started();
    fake.says(r#"{"hello":3}"#);
    fake.says(r#"{"failed":1,"errno":2,"error":"no such program"}"#);
    let before = Instant::now();
    assert!(
        !fake.procs.in_use(&fake.key, before),
        "nothing owed, nothing since"
    );
    let order = fake.file(
        serde_json::json!({"op": "stat", "session": "s", "path": "/a"}),
        2,
    );
    assert!(fake.procs.in_use(&fake.key, Instant::now()), "owed");
    fake.says(&format!(
        r#"{{"failed":{},"errno":2,"error":"gone"}}"#,
        order["ref"]
    ));
    assert!(fake.procs.in_use(&fake.key, before), "given since");
    assert!(!fake.procs.in_use(&fake.key, Instant::now()));
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
    let replies = fake.floods(flood);
    assert_eq!(
        replies.len(),
        1,
        "the start owed is answered once: {replies:?}"
    );
    assert_eq!(code_of(&replies[0].1), Some(ErrorCode::Unavailable));
}

impl Fake {
    /// A file op in the session, answered to `seq`; the order the steward
    /// reads.
    fn file(&mut self, call: serde_json::Value, seq: u64) -> serde_json::Value {
        let ExecCall::Files(call) = ExecCall::parse(&serde_json::to_vec(&call).unwrap()).unwrap()
        else {
            panic!("not a file op")
        };
        let asked = (self.procs).file((&self.key, Some(1)), &call, reply_to(seq), &mut Vec::new());
        assert!(asked.unwrap().is_none(), "the steward it has");
        self.order()
    }

    /// The next order the steward reads.
    fn order(&mut self) -> serde_json::Value {
        let mut header = [0u8; 4];
        self.steward.read_exact(&mut header).unwrap();
        let mut order = vec![0u8; u32::from_le_bytes(header) as usize];
        self.steward.read_exact(&mut order).unwrap();
        serde_json::from_slice(&order).unwrap()
    }
}

fn an_entry(path: &str) -> serde_json::Value {
    serde_json::json!({
        "name": "a", "path": path, "type": "file", "size": 1, "mode": 420,
        "permissions": "-rw-r--r--", "owner": "nobody", "group": "nogroup",
        "modified_at": "2026-11-30T00:00:00Z", "symlink_target": null
    })
}

#[test]
fn a_file_op_is_ordered_with_the_call_and_answered_with_the_checked_reply() {
    let mut fake = started();
    fake.says(r#"{"hello":3}"#);
    let order = fake.file(
        serde_json::json!({"op": "stat", "session": "s", "path": "/a"}),
        2,
    );
    assert_eq!(order["op"], "file");
    assert_eq!(order["call"]["op"], "stat");
    assert_eq!(order["call"]["path"], "/a");
    let reference = order["ref"].as_u64().unwrap();
    let done =
        serde_json::json!({"done": reference, "reply": {"success": true, "entry": an_entry("/a")}});
    let replies = fake.says(&done.to_string());
    assert_eq!(replies.len(), 1, "{replies:?}");
    let Answer::Json(body) = &replies[0].1 else {
        panic!("{replies:?}")
    };
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(body["entry"]["path"], "/a");
    // A failure says why, in the caller's terms.
    let order = fake.file(
        serde_json::json!({"op": "read", "session": "s", "path": "/b"}),
        3,
    );
    let failed = format!(
        r#"{{"failed":{},"errno":28,"error":"No space left on device"}}"#,
        order["ref"]
    );
    let replies = fake.says(&failed);
    assert_eq!(code_of(&replies[0].1), Some(ErrorCode::LimitExceeded));
}

#[test]
fn a_file_reply_that_was_not_asked_for_drops_the_steward() {
    let hostile = [
        // Another op's reply.
        serde_json::json!({"success": true, "removed": true}),
        // More than the op's reply has.
        serde_json::json!({"success": true, "entry": an_entry("/a"), "x": 1}),
        // More bytes than were asked for.
        serde_json::json!({"success": true, "data": "YWJjZA==", "offset": 0, "size": 4, "eof": true}),
    ];
    for reply in hostile {
        let mut fake = started();
        fake.says(r#"{"hello":3}"#);
        let order = fake.file(
            serde_json::json!({"op": "read", "session": "s", "path": "/a", "length": 3}),
            2,
        );
        let done = serde_json::json!({"done": order["ref"], "reply": reply});
        let replies = fake.says(&done.to_string());
        // The file op and the start it owed are both answered.
        let codes: Vec<_> = replies.iter().map(|(_, a)| code_of(a)).collect();
        assert_eq!(codes, vec![Some(ErrorCode::Unavailable); 2], "{reply}");
    }
    // A `done` for a start, or for no order at all.
    for done in [r#"{"done":1,"reply":{}}"#, r#"{"done":77,"reply":{}}"#] {
        let mut fake = started();
        let replies = fake.says(done);
        let codes: Vec<_> = replies.iter().map(|(_, a)| code_of(a)).collect();
        assert_eq!(codes, vec![Some(ErrorCode::Unavailable)], "{done}");
    }
}

#[test]
fn a_long_report_is_taken_only_while_a_file_op_is_owed() {
    let mut fake = started();
    fake.says(r#"{"hello":3}"#);
    let order = fake.file(
        serde_json::json!({"op": "read", "session": "s", "path": "/a"}),
        2,
    );
    // 300 KiB of base64: past a process report's cap, within a read's.
    let data = "QUJD".repeat(75 << 10);
    let done = serde_json::json!({"done": order["ref"], "reply": {
        "success": true, "data": data, "offset": 0, "size": 230400, "eof": true}});
    let replies = fake.says_long(&done.to_string());
    assert!(matches!(replies[0].1, Answer::Json(_)), "{replies:?}");
    // Owing none, the same length is too long.
    let replies = fake.says_long(&format!(r#"{{"hello":3,"x":"{data}"}}"#));
    let codes: Vec<_> = replies.iter().map(|(_, a)| code_of(a)).collect();
    assert_eq!(codes, vec![Some(ErrorCode::Unavailable)], "the start owed");
}

impl Fake {
    /// A report longer than the socket holds, written as the kernel reads
    /// it: the replies of the turns until one comes.
    fn says_long(&mut self, json: &str) -> Vec<Reply> {
        let mut frame = (json.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(json.as_bytes());
        self.floods(frame)
    }

    /// `bytes` written as the kernel reads them (cut short once it has
    /// dropped the steward): the replies of the turns until one comes.
    fn floods(&mut self, bytes: Vec<u8>) -> Vec<Reply> {
        let writer = std::thread::spawn({
            let mut steward = self.steward.try_clone().unwrap();
            move || {
                let _ = steward.write_all(&bytes);
            }
        });
        let mut replies = Vec::new();
        for _ in 0..50 {
            replies.extend(self.turn());
            if !replies.is_empty() {
                break;
            }
        }
        if replies.is_empty() {
            // Nothing came: the writer is let go, and the test fails.
            let _ = self.steward.shutdown(std::net::Shutdown::Both);
        }
        writer.join().unwrap();
        replies
    }
}

#[test]
fn a_file_op_has_longer_to_answer_than_a_start() {
    let mut fake = started();
    fake.procs.answer_within = Duration::from_millis(40);
    fake.says(r#"{"hello":3}"#);
    fake.says(r#"{"started":1,"pid":4,"cwd":"/"}"#);
    fake.file(
        serde_json::json!({"op": "remove", "session": "s", "path": "/big"}),
        2,
    );
    std::thread::sleep(Duration::from_millis(80));
    let mut replies = Vec::new();
    fake.procs.on_deadlines(Instant::now(), &mut replies);
    assert!(replies.is_empty(), "{replies:?}");
    std::thread::sleep(Duration::from_millis(200));
    fake.procs.on_deadlines(Instant::now(), &mut replies);
    let codes: Vec<_> = replies.iter().map(|(_, a)| code_of(a)).collect();
    assert_eq!(codes, vec![Some(ErrorCode::Unavailable)], "{replies:?}");
}

#[test]
fn a_watch_is_named_by_the_kernel_and_its_events_kept_followed_and_ended() {
    let mut fake = started();
    fake.says(r#"{"hello":3}"#);
    let order = fake.file(
        serde_json::json!({"op": "watch", "session": "s", "path": "/w"}),
        2,
    );
    let reference = order["ref"].as_u64().unwrap();
    let done = serde_json::json!({"done": reference, "reply": {"success": true, "watch": "mine"}});
    let replies = fake.says(&done.to_string());
    let Answer::Json(body) = &replies[0].1 else {
        panic!("{replies:?}")
    };
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    let name = format!("w-{reference}");
    assert_eq!(body["watch"], name.as_str(), "the kernel names it");
    let follow = |after: Option<u64>| FileEvents {
        session: "s".to_owned(),
        watch: name.clone(),
        after,
        follow: true,
        wait_ms: Some(5000),
    };
    let quota = fake.key.0;
    let now = Instant::now();
    let waiting = (fake.procs).events(&fake.key, follow(Some(0)), quota, reply_to(3), now);
    assert!(waiting.unwrap().is_none(), "it waits");
    let seen = r#"{"events":REF,"list":[{"type":"create","path":"/w/a","name":"a"}]}"#;
    let replies = fake.says(&seen.replace("REF", &reference.to_string()));
    assert_eq!(replies.len(), 1, "{replies:?}");
    let Answer::Json(body) = &replies[0].1 else {
        panic!("{replies:?}")
    };
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(
        (body["events"][0]["path"].as_str(), body["offset"].as_u64()),
        (Some("/w/a"), Some(1))
    );
    // Events of a watch it does not have are let be.
    assert!(fake.says(r#"{"events":999,"list":[]}"#).is_empty());
    // Another session's name finds nothing.
    let other = (fake.key.0, "t".to_owned());
    let refused = (fake.procs).events(&other, follow(None), quota, reply_to(4), now);
    assert_eq!(refused.unwrap_err().code, ErrorCode::NotFound);
    // Ended, a follow waiting is told so, and the steward to stop.
    let waiting = (fake.procs).events(&fake.key, follow(Some(1)), quota, reply_to(5), now);
    assert!(waiting.unwrap().is_none());
    let mut replies = Vec::new();
    let removed = fake.procs.unwatch(&fake.key, &name, &mut replies).unwrap();
    assert!(removed.is_some());
    let Answer::Json(body) = &replies[0].1 else {
        panic!("{replies:?}")
    };
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(body["ended"], true);
    let order = fake.order();
    assert_eq!(
        (order["op"].as_str(), order["ref"].as_u64()),
        (Some("unwatch"), Some(reference))
    );
    let gone = (fake.procs).events(&fake.key, follow(None), quota, reply_to(6), now);
    assert_eq!(gone.unwrap_err().code, ErrorCode::NotFound);
}

#[test]
fn a_steward_asked_for_its_sessions_watches_is_held_to_the_cap() {
    let mut fake = started();
    fake.says(r#"{"hello":3}"#);
    for seq in 0..16 {
        fake.file(
            serde_json::json!({"op": "watch", "session": "s", "path": "/w"}),
            10 + seq,
        );
    }
    let call = FileCall::Watch(agentos_proto::payload::FileWatch {
        session: "s".to_owned(),
        path: "/w".to_owned(),
        recursive: false,
    });
    let refused = (fake.procs).file((&fake.key, Some(1)), &call, reply_to(99), &mut Vec::new());
    assert_eq!(refused.unwrap_err().code, ErrorCode::LimitExceeded);
}

#[test]
fn an_order_behind_a_slow_file_op_has_its_time_after_that_ones() {
    let mut fake = started();
    fake.procs.answer_within = Duration::from_millis(40);
    fake.says(r#"{"hello":3}"#);
    fake.says(r#"{"started":1,"pid":4,"cwd":"/"}"#);
    fake.file(
        serde_json::json!({"op": "list", "session": "s", "path": "/big"}),
        2,
    );
    // A signal, waiting behind the list the steward is walking.
    let which = ProcRef::Pid(4);
    let (key, mut replies) = (fake.key.clone(), Vec::new());
    let sent = fake
        .procs
        .signal(&key, which, Signal::SIGTERM, reply_to(3), &mut replies);
    assert!(sent.unwrap().is_none());
    std::thread::sleep(Duration::from_millis(120));
    fake.procs.on_deadlines(Instant::now(), &mut replies);
    assert!(
        replies.is_empty(),
        "not due before the list is: {replies:?}"
    );
    std::thread::sleep(Duration::from_millis(250));
    fake.procs.on_deadlines(Instant::now(), &mut replies);
    let codes: Vec<_> = replies.iter().map(|(_, a)| code_of(a)).collect();
    assert_eq!(codes, vec![Some(ErrorCode::Unavailable); 2], "{replies:?}");
}

#[test]
fn a_resumed_stewards_old_timers_do_not_drop_it() {
    let mut fake = started();
    fake.procs.answer_within = Duration::from_millis(60);
    fake.says(r#"{"hello":3}"#);
    let key = fake.key.clone();
    fake.procs.frozen(&key, true, Instant::now());
    std::thread::sleep(Duration::from_millis(40));
    fake.procs.frozen(&key, false, Instant::now());
    // Its first timer comes, its time having been given anew.
    std::thread::sleep(Duration::from_millis(30));
    let mut replies = Vec::new();
    fake.procs.on_deadlines(Instant::now(), &mut replies);
    assert!(replies.is_empty(), "{replies:?}");
    std::thread::sleep(Duration::from_millis(60));
    fake.procs.on_deadlines(Instant::now(), &mut replies);
    let codes: Vec<_> = replies.iter().map(|(_, a)| code_of(a)).collect();
    assert_eq!(codes, vec![Some(ErrorCode::Unavailable)], "{replies:?}");
}

#[test]
fn only_a_file_ops_reply_may_be_long() {
    let mut fake = started();
    fake.says(r#"{"hello":3}"#);
    fake.file(
        serde_json::json!({"op": "read", "session": "s", "path": "/a"}),
        2,
    );
    // Owing a read, a long report of another kind is still too long.
    let long = format!(
        r#"{{"ended":4,"exit_code":0,"signal":null,"x":"{}"}}"#,
        "a".repeat(100 << 10)
    );
    let replies = fake.says_long(&long);
    let codes: Vec<_> = replies.iter().map(|(_, a)| code_of(a)).collect();
    assert_eq!(codes, vec![Some(ErrorCode::Unavailable); 2], "{replies:?}");
}

#[test]
fn a_steward_of_an_interpreter_that_has_ended_is_not_given_the_next_ones_orders() {
    let mut fake = started();
    // The session was closed and opened again before the old steward's
    // end was read: its next start gets a steward of its own, and what the
    // old one owed is answered.
    let mut replies = Vec::new();
    let fresh = (fake.procs).start(
        (&fake.key, Some(2)),
        start("true"),
        &BTreeMap::new(),
        reply_to(2),
        &mut replies,
    );
    assert!(fresh.unwrap().is_some(), "a new steward's socket");
    assert_eq!(replies.len(), 1, "the old steward's start is answered");
}

#[test]
fn a_steward_made_before_its_interpreter_opened_serves_the_one_that_opens() {
    let poll = Poll::new().unwrap();
    let mut procs = Procs::new(poll.registry(), 0).unwrap();
    let key = (Principal::Operator { uid: 1 }, "s".to_owned());
    let no_env = BTreeMap::new();
    // The sandbox's ends, kept open (a closed one ends its steward).
    let mut theirs = Vec::new();
    let mut ask = |interpreter, seq| {
        let of = (&key, interpreter);
        let started = procs.start(of, start("true"), &no_env, reply_to(seq), &mut Vec::new());
        started.unwrap().map(|socket| theirs.push(socket)).is_some()
    };
    assert!(
        ask(None, 1),
        "a new steward, whose fork waits for the interpreter"
    );
    assert!(!ask(Some(7), 2), "the same one, once it opened");
    assert!(!ask(Some(7), 3));
    assert!(ask(Some(8), 4), "a new one for the next interpreter");
}
