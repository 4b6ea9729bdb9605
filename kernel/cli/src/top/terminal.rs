//! The terminal while `agentos top` runs: its mode, drawing a frame, its
//! size, and the keys pressed.

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices, Termios};

use crate::error::CliError;

/// The terminal in the view's mode: keys arrive one at a time and
/// unechoed, on the alternate screen with the cursor hidden. Dropping it
/// puts the terminal back as it was, whichever way the view ends (`q`, a
/// signal, an error from the kernel, a panic).
#[derive(Debug)]
pub struct Screen {
    saved: Termios,
}

impl Screen {
    pub fn enter() -> Result<Screen, CliError> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).map_err(|error| CliError::Terminal {
            doing: "reading the terminal's mode",
            error,
        })?;
        let mut keys = saved.clone();
        // ISIG off too: Ctrl-C arrives as a key rather than as SIGINT, and
        // Ctrl-Z cannot stop the view with the terminal in its mode.
        keys.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG);
        keys.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
        keys.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
        // The guard exists before the first change, so that a failure
        // half-way still undoes what was done.
        let screen = Screen { saved };
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &keys).map_err(|error| {
            CliError::Terminal {
                doing: "setting the terminal's mode",
                error,
            }
        })?;
        let mut out = std::io::stdout().lock();
        out.write_all(b"\x1b[?1049h\x1b[?25l\x1b[2J")?;
        out.flush()?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        // Errors are ignored: the terminal may be gone (SIGHUP), and there
        // is nothing else to do with it.
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b"\x1b[?25h\x1b[?1049l");
        let _ = out.flush();
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

/// Draws a frame over the last one: each line cleared to its end, the
/// rest of the screen cleared below. No newline after the last line, which
/// would scroll a full screen by one.
pub fn draw(lines: &[String]) -> std::io::Result<()> {
    let mut frame = String::from("\x1b[H");
    frame.push_str(&lines.join("\x1b[K\n"));
    frame.push_str("\x1b[K\x1b[J");
    let mut out = std::io::stdout().lock();
    out.write_all(frame.as_bytes())?;
    out.flush()
}

/// Columns and rows of the terminal on stdout (80x24 if it will not say).
pub fn terminal_size() -> (usize, usize) {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which
    // points at a live, writable `winsize` for the whole call.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    if rc == 0 && size.ws_col > 0 && size.ws_row > 0 {
        (usize::from(size.ws_col), usize::from(size.ws_row))
    } else {
        (80, 24)
    }
}

/// Why the wait between refreshes ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Wake {
    /// `q`, Ctrl-C, end of input or a terminating signal.
    Quit,
    /// Time for the next sample.
    Refresh,
    /// The terminal changed size: draw the same sample again.
    Redraw,
    /// Another key: the view decides what it means.
    Key(u8),
}

/// Waits for a key, a signal or `deadline`, whichever comes first.
pub fn wait_for_key(
    deadline: Instant,
    stop: &AtomicBool,
    resized: &AtomicBool,
) -> Result<Wake, CliError> {
    let stdin = std::io::stdin();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(Wake::Quit);
        }
        if resized.swap(false, Ordering::Relaxed) {
            return Ok(Wake::Redraw);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Wake::Refresh);
        }
        // Rounded up, so that the wait does not end a little early and spin.
        let timeout =
            PollTimeout::try_from(left + Duration::from_micros(999)).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, timeout) {
            // A signal: the flags say which.
            Err(Errno::EINTR) | Ok(0) => continue,
            Err(error) => {
                return Err(CliError::Terminal {
                    doing: "waiting for a key",
                    error,
                })
            }
            Ok(_) => {}
        }
        let mut keys = [0u8; 64];
        let read = match nix::unistd::read(stdin.as_fd(), &mut keys) {
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            // The terminal went away.
            Err(_) | Ok(0) => return Ok(Wake::Quit),
            Ok(read) => read,
        };
        // q, Q, Ctrl-C (ISIG is off, so it arrives as 0x03), Ctrl-D.
        if keys[..read].iter().any(|key| b"qQ\x03\x04".contains(key)) {
            return Ok(Wake::Quit);
        }
        // The last key pressed counts; escape sequences (arrows) do not.
        if let Some(&key) = keys[..read]
            .iter()
            .rev()
            .find(|k| k.is_ascii_graphic() || **k == b'\t')
        {
            return Ok(Wake::Key(key));
        }
    }
}
