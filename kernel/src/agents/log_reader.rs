//! Reading an agent's log for LOGS: its last lines, or what follows a byte
//! offset. Reads are bounded (`MAX_LOG_CHUNK`), so one request costs the
//! reactor at most one such read of a local file.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use agentos_proto::payload::MAX_LOG_CHUNK;

/// A piece of a log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Chunk {
    /// The bytes read.
    pub bytes: Vec<u8>,
    /// Where they end in the file.
    pub offset: u64,
    /// Where the file ends now.
    pub size: u64,
    /// The file was shorter than the offset asked for: it was cut (its
    /// older half dropped), so reading started again at its beginning.
    pub truncated: bool,
}

impl Chunk {
    /// Nothing to give: no text, and no cut to report.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty() && !self.truncated
    }
}

/// The log's size; a log not written yet is empty.
pub fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |meta| meta.len())
}

/// The last `lines` lines of the log (at most `MAX_LOG_CHUNK` bytes of
/// them); a final line without its newline counts as a line. While the
/// log is `growing`, a character its writer has not finished is left for
/// the next read.
pub fn tail(path: &Path, lines: u64, growing: bool) -> io::Result<Chunk> {
    let Some(mut file) = open(path)? else {
        return Ok(Chunk::default());
    };
    let size = file.metadata()?.len();
    let start = size.saturating_sub(MAX_LOG_CHUNK);
    let window = read_range(&mut file, start, size)?;
    // Each newline before the last byte ends a line; the tail starts after
    // the `lines`-th one from the end.
    let body = window.strip_suffix(b"\n").unwrap_or(&window);
    let from = if lines == 0 {
        window.len()
    } else {
        body.iter()
            .rposition({
                let mut seen = 0;
                move |&b| {
                    seen += u64::from(b == b'\n');
                    seen == lines
                }
            })
            .map_or(0, |at| at + 1)
    };
    let mut bytes = window[from..].to_vec();
    let unfinished = if growing { unfinished_char(&bytes) } else { 0 };
    bytes.truncate(bytes.len() - unfinished);
    Ok(Chunk {
        bytes,
        offset: size - unfinished as u64,
        size,
        truncated: false,
    })
}

/// What the log holds after byte `after`, up to `MAX_LOG_CHUNK` bytes;
/// `growing` as for [`tail`].
pub fn read_after(path: &Path, after: u64, growing: bool) -> io::Result<Chunk> {
    let Some(mut file) = open(path)? else {
        return Ok(Chunk {
            truncated: after > 0,
            ..Chunk::default()
        });
    };
    let size = file.metadata()?.len();
    let (start, truncated) = if after > size {
        (0, true)
    } else {
        (after, false)
    };
    let end = size.min(start + MAX_LOG_CHUNK);
    let mut bytes = read_range(&mut file, start, end)?;
    // Within the file a chunk may stop anywhere; at its end, only while the
    // writer may still finish the character.
    let unfinished = if growing || end < size {
        unfinished_char(&bytes)
    } else {
        0
    };
    bytes.truncate(bytes.len() - unfinished);
    Ok(Chunk {
        offset: start + bytes.len() as u64,
        bytes,
        size,
        truncated,
    })
}

/// How many bytes at the end of `bytes` begin a UTF-8 character they do
/// not finish: a reply stops before them, and the next one starts with
/// the whole character instead of two halves that each read as U+FFFD.
fn unfinished_char(bytes: &[u8]) -> usize {
    // A character is at most 4 bytes: its lead byte is among the last 4.
    for back in 1..=bytes.len().min(4) {
        let byte = bytes[bytes.len() - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: the lead is further back
        }
        let needs = match byte {
            b if b & 0b1110_0000 == 0b1100_0000 => 2,
            b if b & 0b1111_0000 == 0b1110_0000 => 3,
            b if b & 0b1111_1000 == 0b1111_0000 => 4,
            _ => 1,
        };
        return if needs > back { back } else { 0 };
    }
    0
}

fn open(path: &Path) -> io::Result<Option<File>> {
    match File::open(path) {
        Ok(file) => Ok(Some(file)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

fn read_range(file: &mut File, start: u64, end: u64) -> io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::with_capacity(end.saturating_sub(start) as usize);
    file.take(end.saturating_sub(start))
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(text: &[u8]) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file
    }

    #[test]
    fn tails_count_lines_from_the_end() {
        let file = log(b"one\ntwo\nthree\n");
        let text = |n| String::from_utf8(tail(file.path(), n, true).unwrap().bytes).unwrap();
        assert_eq!(text(1), "three\n");
        assert_eq!(text(2), "two\nthree\n");
        assert_eq!(text(3), "one\ntwo\nthree\n");
        assert_eq!(text(10), "one\ntwo\nthree\n");
        assert_eq!(text(0), "");
        let unfinished = log(b"one\ntwo");
        assert_eq!(tail(unfinished.path(), 1, true).unwrap().bytes, b"two");
        assert_eq!(tail(unfinished.path(), 1, true).unwrap().offset, 7);
    }

    #[test]
    fn a_missing_log_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.log");
        assert_eq!(tail(&path, 5, true).unwrap(), Chunk::default());
        assert_eq!(size(&path), 0);
        assert!(!read_after(&path, 0, true).unwrap().truncated);
    }

    #[test]
    fn reads_go_on_from_an_offset_and_notice_a_cut() {
        let file = log(b"0123456789");
        let chunk = read_after(file.path(), 4, true).unwrap();
        assert_eq!((chunk.bytes.as_slice(), chunk.offset), (&b"456789"[..], 10));
        assert!(read_after(file.path(), 10, true).unwrap().bytes.is_empty());
        let cut = read_after(file.path(), 50, true).unwrap();
        assert!(cut.truncated);
        assert_eq!(cut.bytes, b"0123456789");
    }

    #[test]
    fn a_character_is_never_cut_in_two() {
        let file = log("é".as_bytes());
        std::fs::write(file.path(), b"ab\xc3").unwrap();
        let first = read_after(file.path(), 0, true).unwrap();
        assert_eq!((first.bytes.as_slice(), first.offset), (&b"ab"[..], 2));
        std::fs::write(file.path(), "abé".as_bytes()).unwrap();
        let rest = read_after(file.path(), first.offset, true).unwrap();
        assert_eq!(String::from_utf8(rest.bytes).unwrap(), "é");
        assert_eq!(unfinished_char("€".as_bytes()), 0);
        assert_eq!(unfinished_char(&"€".as_bytes()[..2]), 2);
        assert_eq!(unfinished_char(&"😀".as_bytes()[..3]), 3);
        assert_eq!(
            unfinished_char(b"\xff\x80"),
            0,
            "not UTF-8 at all: left as it is"
        );
        // An agent that has ended will not finish it: its last bytes come.
        let ended = log(b"ab\xc3");
        assert_eq!(read_after(ended.path(), 0, false).unwrap().bytes, b"ab\xc3");
        assert_eq!(tail(ended.path(), 1, false).unwrap().offset, 3);
        let tail_cut = log(b"one\ntw\xe2\x82");
        assert_eq!(tail(tail_cut.path(), 1, true).unwrap().bytes, b"tw");
        assert_eq!(tail(tail_cut.path(), 1, true).unwrap().offset, 6);
    }

    #[test]
    fn reads_are_bounded() {
        let big = vec![b'x'; (MAX_LOG_CHUNK + 10) as usize];
        let file = log(&big);
        let chunk = read_after(file.path(), 0, true).unwrap();
        assert_eq!(chunk.bytes.len() as u64, MAX_LOG_CHUNK);
        assert_eq!(chunk.offset, MAX_LOG_CHUNK);
        assert_eq!(
            tail(file.path(), 1, true).unwrap().bytes.len() as u64,
            MAX_LOG_CHUNK
        );
    }
}
