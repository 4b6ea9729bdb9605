//! The systemd service manager's notification protocol (`sd_notify`): with
//! `Type=notify`, systemd counts the kernel started only once it says
//! `READY=1`, and is told of reloads and of the shutdown. Outside systemd
//! (no `NOTIFY_SOCKET`) this does nothing.

use std::ffi::OsString;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The service manager's notification socket, if the kernel runs under one.
#[derive(Debug, Default)]
pub struct ServiceManager {
    target: Option<SocketAddr>,
}

impl ServiceManager {
    /// The manager `NOTIFY_SOCKET` names: a path, or an abstract socket
    /// written `@name`.
    pub fn from_env() -> ServiceManager {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|name| {
            address(&name)
                .map_err(|err| log::warn!("NOTIFY_SOCKET {name:?} is unusable: {err}"))
                .ok()
        });
        ServiceManager { target }
    }

    /// The kernel serves requests.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={status}"));
    }

    /// The kernel re-reads its configuration; `ready` follows.
    pub fn reloading(&self) {
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000)
            .unwrap_or(0);
        self.send(&format!(
            "RELOADING=1\nMONOTONIC_USEC={now}\nSTATUS=reloading the configuration"
        ));
    }

    /// The kernel is shutting down.
    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=stopping");
    }

    fn send(&self, message: &str) {
        let Some(target) = &self.target else {
            return;
        };
        let sent = UnixDatagram::unbound()
            .and_then(|socket| socket.send_to_addr(message.as_bytes(), target));
        if let Err(err) = sent {
            log::warn!("cannot notify the service manager: {err}");
        }
    }
}

fn address(name: &OsString) -> std::io::Result<SocketAddr> {
    use std::os::unix::ffi::OsStrExt;
    match name.as_bytes() {
        [b'@', abstract_name @ ..] => SocketAddr::from_abstract_name(abstract_name),
        [b'/', ..] => SocketAddr::from_pathname(name),
        _ => Err(std::io::Error::other(
            "neither a path nor an @abstract name",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let manager = ServiceManager {
            target: Some(address(&path.clone().into_os_string()).unwrap()),
        };
        let mut buf = [0u8; 256];
        manager.ready("serving");
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
        manager.reloading();
        let n = listener.recv(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"RELOADING=1\nMONOTONIC_USEC="));
        manager.stopping();
        let n = listener.recv(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"STOPPING=1"));
    }

    #[test]
    fn abstract_and_bad_names() {
        assert!(address(&"@agentos-test".into()).is_ok());
        assert!(address(&"relative".into()).is_err());
        ServiceManager::default().ready("nowhere");
    }
}
