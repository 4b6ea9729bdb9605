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

/// The log's size; a log not written yet is empty.
pub fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |meta| meta.len())
}

/// The last `lines` lines of the log (at most `MAX_LOG_CHUNK` bytes of
/// them); a final line without its newline counts as a line.
pub fn tail(path: &Path, lines: u64) -> io::Result<Chunk> {
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
    Ok(Chunk {
        bytes: window[from..].to_vec(),
        offset: size,
        size,
        truncated: false,
    })
}

/// What the log holds after byte `after`, up to `MAX_LOG_CHUNK` bytes.
pub fn read_after(path: &Path, after: u64) -> io::Result<Chunk> {
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
    Ok(Chunk {
        bytes: read_range(&mut file, start, end)?,
        offset: end,
        size,
        truncated,
    })
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
        let text = |n| String::from_utf8(tail(file.path(), n).unwrap().bytes).unwrap();
        assert_eq!(text(1), "three\n");
        assert_eq!(text(2), "two\nthree\n");
        assert_eq!(text(3), "one\ntwo\nthree\n");
        assert_eq!(text(10), "one\ntwo\nthree\n");
        assert_eq!(text(0), "");
        let unfinished = log(b"one\ntwo");
        assert_eq!(tail(unfinished.path(), 1).unwrap().bytes, b"two");
        assert_eq!(tail(unfinished.path(), 1).unwrap().offset, 7);
    }

    #[test]
    fn a_missing_log_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.log");
        assert_eq!(tail(&path, 5).unwrap(), Chunk::default());
        assert_eq!(size(&path), 0);
        assert!(!read_after(&path, 0).unwrap().truncated);
    }

    #[test]
    fn reads_go_on_from_an_offset_and_notice_a_cut() {
        let file = log(b"0123456789");
        let chunk = read_after(file.path(), 4).unwrap();
        assert_eq!((chunk.bytes.as_slice(), chunk.offset), (&b"456789"[..], 10));
        assert!(read_after(file.path(), 10).unwrap().bytes.is_empty());
        let cut = read_after(file.path(), 50).unwrap();
        assert!(cut.truncated);
        assert_eq!(cut.bytes, b"0123456789");
    }

    #[test]
    fn reads_are_bounded() {
        let big = vec![b'x'; (MAX_LOG_CHUNK + 10) as usize];
        let file = log(&big);
        let chunk = read_after(file.path(), 0).unwrap();
        assert_eq!(chunk.bytes.len() as u64, MAX_LOG_CHUNK);
        assert_eq!(chunk.offset, MAX_LOG_CHUNK);
        assert_eq!(
            tail(file.path(), 1).unwrap().bytes.len() as u64,
            MAX_LOG_CHUNK
        );
    }
}
