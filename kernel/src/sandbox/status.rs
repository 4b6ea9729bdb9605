//! The status pipe: one line per event, from the sandbox's init to the
//! daemon. The daemon learns that the workload started (SPAWN's reply
//! waits for this), why it could not, and how it ended.
//!
//! ```text
//! ready <pid>              the workload was exec'd (pid as seen inside)
//! error <code> <message>   setup failed; <code> is a protocol error word
//! exit <code>              the workload exited
//! signal <number>          a signal ended the workload
//! ```

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use agentos_proto::ErrorCode;

use super::spec::fds;
use crate::fd::set_nonblocking;

/// One status line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// The workload is running.
    Ready {
        /// Its pid inside the sandbox.
        pid: i32,
    },
    /// The sandbox could not start the workload.
    Error {
        /// The protocol word that fits the cause.
        code: ErrorCode,
        /// What went wrong, for the SPAWN reply.
        message: String,
    },
    /// The workload exited with this code.
    Exited(i32),
    /// This signal ended the workload.
    Signaled(i32),
}

impl Status {
    /// The line, with its newline.
    pub fn encode(&self) -> String {
        match self {
            Status::Ready { pid } => format!("ready {pid}\n"),
            Status::Error { code, message } => {
                // One line, whatever the message held.
                format!("error {} {}\n", code.as_str(), message.replace('\n', " "))
            }
            Status::Exited(code) => format!("exit {code}\n"),
            Status::Signaled(signal) => format!("signal {signal}\n"),
        }
    }

    /// Parses one line (without its newline).
    pub fn parse(line: &str) -> Option<Status> {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "ready" => rest.parse().ok().map(|pid| Status::Ready { pid }),
            "exit" => rest.parse().ok().map(Status::Exited),
            "signal" => rest.parse().ok().map(Status::Signaled),
            "error" => {
                let (code, message) = rest.split_once(' ').unwrap_or((rest, ""));
                let code = serde_json::from_value(serde_json::Value::String(code.to_owned()))
                    .unwrap_or(ErrorCode::Internal);
                Some(Status::Error {
                    code,
                    message: message.to_owned(),
                })
            }
            _ => None,
        }
    }
}

/// The daemon's end of a status pipe (non-blocking).
#[derive(Debug)]
pub struct StatusReader {
    fd: OwnedFd,
    partial: Vec<u8>,
}

impl StatusReader {
    /// Wraps the pipe's read end, making it non-blocking.
    pub fn new(fd: OwnedFd) -> io::Result<StatusReader> {
        set_nonblocking(&fd)?;
        Ok(StatusReader {
            fd,
            partial: Vec::new(),
        })
    }

    /// The descriptor, for registering with the reactor.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Reads what is there: complete lines, and whether the writer is gone.
    pub fn read_available(&mut self) -> (Vec<Status>, bool) {
        let closed;
        let mut chunk = [0u8; 1024];
        loop {
            // SAFETY: reading into a local buffer of the given length.
            let n =
                unsafe { libc::read(self.fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            match n {
                0 => {
                    closed = true;
                    break;
                }
                n if n > 0 => self.partial.extend_from_slice(&chunk[..n as usize]),
                _ => {
                    let err = io::Error::last_os_error();
                    if err.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    closed = err.kind() != io::ErrorKind::WouldBlock;
                    break;
                }
            }
            // A misbehaving writer cannot make us buffer without bound.
            if self.partial.len() > 64 * 1024 {
                closed = true;
                break;
            }
        }
        let mut statuses = Vec::new();
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            if let Some(status) = Status::parse(String::from_utf8_lossy(&line[..end]).trim_end()) {
                statuses.push(status);
            }
        }
        (statuses, closed)
    }
}

/// Writes one status line to the daemon. If the daemon is gone there is
/// nobody to tell, so errors are ignored.
pub fn report(status: &Status) {
    let line = status.encode();
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writing from a valid buffer to our status pipe.
        let n = unsafe { libc::write(fds::STATUS, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        rest = &rest[n as usize..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let all = [
            Status::Ready { pid: 2 },
            Status::Error {
                code: ErrorCode::NotFound,
                message: "script /a.py does not exist".into(),
            },
            Status::Exited(3),
            Status::Signaled(9),
        ];
        for status in all {
            let line = status.encode();
            assert!(line.ends_with('\n'));
            assert_eq!(Status::parse(line.trim_end()), Some(status));
        }
    }

    #[test]
    fn multi_line_messages_stay_one_line() {
        let line = Status::Error {
            code: ErrorCode::Internal,
            message: "a\nb".into(),
        }
        .encode();
        assert_eq!(line.matches('\n').count(), 1);
    }

    #[test]
    fn reader_splits_lines_and_sees_the_close() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let mut reader = StatusReader::new(read).unwrap();
        nix::unistd::write(&write, b"ready 2\nexit").unwrap();
        assert_eq!(
            reader.read_available(),
            (vec![Status::Ready { pid: 2 }], false)
        );
        nix::unistd::write(&write, b" 0\n").unwrap();
        drop(write);
        assert_eq!(reader.read_available(), (vec![Status::Exited(0)], true));
    }
}
