//! A process's PTY: a pair opened on the host's devpts, the master kept
//! by the kernel (non-blocking, read as the process's one stream and
//! written as its input), the slave sent to the steward. The slave is
//! taken from the master itself (`TIOCGPTPEER`), so no path under
//! `/dev/pts` has to exist where the process runs.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use agentos_proto::payload::PtySize;
use nix::fcntl::OFlag;

use crate::fd;

/// A new PTY of `size`: its master (non-blocking) and its slave.
pub fn open(size: PtySize) -> io::Result<(OwnedFd, OwnedFd)> {
    let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
    nix::pty::grantpt(&master)?;
    nix::pty::unlockpt(&master)?;
    let master = OwnedFd::from(master);
    resize(&master, size)?;
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: TIOCGPTPEER takes the open flags as its argument and
    // returns a new descriptor of the slave, which is owned from here on.
    let slave = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if slave < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `slave` was just returned by the kernel and belongs to no one
    // else.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    fd::set_nonblocking(&master)?;
    Ok((master, slave))
}

/// Gives the PTY whose master is `master` a new size (its foreground
/// process group is sent SIGWINCH).
pub fn resize(master: &OwnedFd, size: PtySize) -> io::Result<()> {
    let window = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which lives
    // across the call.
    let done = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &window) };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_pty_carries_bytes_both_ways_and_has_its_size() {
        let (master, slave) = open(PtySize { cols: 80, rows: 24 }).unwrap();
        let mut window = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer.
        let got = unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut window) };
        assert_eq!((got, window.ws_row, window.ws_col), (0, 24, 80));
        resize(
            &master,
            PtySize {
                cols: 120,
                rows: 40,
            },
        )
        .unwrap();
        // SAFETY: as above.
        unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut window) };
        assert_eq!((window.ws_row, window.ws_col), (40, 120));
        nix::unistd::write(slave.as_fd(), b"hi\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut buffer = [0u8; 16];
        let n = nix::unistd::read(master.as_fd(), &mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"hi\r\n", "the line discipline's newline");
        drop(slave);
        let closed = nix::unistd::read(master.as_fd(), &mut buffer);
        assert_eq!(closed, Err(nix::errno::Errno::EIO), "the end of its output");
    }
}
