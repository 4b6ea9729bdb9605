//! Server-Sent Events, as a Streamable HTTP server answers a request with
//! them: bytes go in as they arrive, each event's data comes out.
//!
//! Only what MCP uses is kept: the `data` lines of an event, joined by
//! newlines, form its message; `event`, `id` and `retry` fields and
//! comment lines (`:` keep-alives) are read past. Lines end in LF, CR or
//! CRLF. An event bigger than the parser's limit is dropped as it streams
//! in (memory stays bounded) and reported by its size.

/// One event's worth, as the stream gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An event's data.
    Data(String),
    /// An event over the limit, dropped: its size in bytes.
    Oversized(usize),
}

/// Splits an event stream into events.
#[derive(Debug)]
pub struct SseParser {
    max_event: usize,
    /// The line being read.
    line: Vec<u8>,
    /// Whether the line being read has any byte (kept or dropped).
    line_started: bool,
    /// The data of the event being read.
    data: Vec<u8>,
    /// Whether the event being read has a data line.
    has_data: bool,
    /// Bytes of the event being read, when it is over the limit.
    dropping: Option<usize>,
    /// The last byte taken was a CR: an LF right after it ends no line.
    after_cr: bool,
}

impl SseParser {
    /// A parser of events of at most `max_event` bytes.
    pub fn new(max_event: usize) -> SseParser {
        SseParser {
            max_event,
            line: Vec::new(),
            line_started: false,
            data: Vec::new(),
            has_data: false,
            dropping: None,
            after_cr: false,
        }
    }

    /// Takes in bytes as they come; complete events go to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<Event>) {
        for &byte in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => self.end_line(out),
                _ => self.take(byte),
            }
        }
    }

    /// The stream has ended: an event it did not finish is not dispatched
    /// (as the SSE standard says).
    pub fn finish(&mut self) {
        self.line.clear();
        self.line_started = false;
        self.data.clear();
        self.has_data = false;
        self.dropping = None;
    }

    fn take(&mut self, byte: u8) {
        self.line_started = true;
        if let Some(bytes) = self.dropping.as_mut() {
            *bytes += 1;
            return;
        }
        self.line.push(byte);
        if self.line.len() + self.data.len() > self.max_event {
            self.dropping = Some(self.line.len() + self.data.len());
            self.line = Vec::new();
            self.data = Vec::new();
        }
    }

    fn end_line(&mut self, out: &mut Vec<Event>) {
        let line = std::mem::take(&mut self.line);
        if !std::mem::take(&mut self.line_started) {
            return self.dispatch(out);
        }
        if self.dropping.is_some() {
            return;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(0) => return, // a comment
            Some(at) => {
                let value = &line[at + 1..];
                (&line[..at], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (&line[..], &[][..]),
        };
        if field == b"data" {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Event>) {
        if let Some(bytes) = self.dropping.take() {
            out.push(Event::Oversized(bytes));
        } else if self.has_data {
            let data = std::mem::take(&mut self.data);
            out.push(Event::Data(String::from_utf8_lossy(&data).into_owned()));
        }
        self.data.clear();
        self.has_data = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(parser: &mut SseParser, pieces: &[&[u8]]) -> Vec<Event> {
        let mut out = Vec::new();
        for piece in pieces {
            parser.push(piece, &mut out);
        }
        out
    }

    #[test]
    fn data_lines_make_an_event_at_a_blank_line_whatever_the_line_ends() {
        let mut parser = SseParser::new(1024);
        let stream: &[&[u8]] = &[
            b": keep-alive\n\nevent: message\nid: 7\ndata: {\"a\":",
            b"1}\n\n",
            b"data:one\r\ndata: two\r\n\r\n",
            b"data: cr\r\r",
            b"retry: 10\n\n",
        ];
        assert_eq!(
            events(&mut parser, stream),
            [
                Event::Data("{\"a\":1}".into()),
                Event::Data("one\ntwo".into()),
                Event::Data("cr".into()),
            ]
        );
    }

    #[test]
    fn a_crlf_split_between_pieces_ends_one_line() {
        let mut parser = SseParser::new(1024);
        let got = events(&mut parser, &[b"data: x\r", b"\n", b"\r", b"\n"]);
        assert_eq!(got, [Event::Data("x".into())]);
    }

    #[test]
    fn an_event_over_the_limit_is_dropped_and_the_stream_goes_on() {
        let mut parser = SseParser::new(16);
        let big = format!("data: {}\ndata: {}\n\n", "x".repeat(100), "y".repeat(10));
        let got = events(&mut parser, &[big.as_bytes(), b"data: small\n\n"]);
        assert!(matches!(got[0], Event::Oversized(n) if n > 100), "{got:?}");
        assert_eq!(got[1], Event::Data("small".into()));
        assert!(parser.line.capacity() <= 64);
    }

    #[test]
    fn an_unfinished_event_is_not_dispatched() {
        let mut parser = SseParser::new(1024);
        assert!(events(&mut parser, &[b"data: half"]).is_empty());
        parser.finish();
        assert!(events(&mut parser, &[b"\n"]).is_empty());
    }
}
