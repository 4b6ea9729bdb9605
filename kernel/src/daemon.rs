//! Start-up and shutdown of `agentosd`, in the order they must happen:
//! process settings, socket, reactor (which starts the threads), run, and
//! clean-up of the socket on the way out.

use std::io;

use signal_hook_mio::v1_0::Signals;

use agentos_proto::socket_path::SYSTEM_SOCKET;

use crate::config::Config;
use crate::reactor::{ConfigSource, Reactor, ReactorError, HANDLED_SIGNALS};
use crate::socket::{KernelSocket, SocketError};

/// Descriptors kept for the kernel's own use beyond client connections.
const FD_RESERVE: u64 = 64;

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The socket could not be set up.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The shutdown signals could not be caught.
    #[error("cannot catch the shutdown signals: {0}")]
    Signals(io::Error),
    /// The reactor or the kernel could not start.
    #[error(transparent)]
    Start(#[from] ReactorError),
    /// The event loop failed while running.
    #[error("the event loop failed: {0}")]
    Run(#[from] io::Error),
}

/// The group whose members may use the system socket.
pub const SERVICE_GROUP: &str = "agentos";

/// Runs the kernel in the foreground until SIGTERM, SIGINT or SIGQUIT;
/// SIGHUP reloads the configuration from `reload`.
pub fn run(mut config: Config, reload: ConfigSource) -> Result<(), DaemonError> {
    ignore_sigpipe();
    let fd_limit = raise_fd_limit().unwrap_or_else(|err| {
        log::warn!("cannot raise the file descriptor limit: {err}");
        1024
    });
    log::debug!("file descriptor limit: {fd_limit}");
    // Past the descriptor limit, clients would wait in the backlog instead
    // of being told `busy`; keep some descriptors for the kernel itself.
    let usable = usize::try_from(fd_limit.saturating_sub(FD_RESERVE)).unwrap_or(usize::MAX);
    if config.max_connections > usable {
        log::warn!(
            "max_connections lowered from {} to {usable}: the open-files limit is {fd_limit}",
            config.max_connections
        );
        config.max_connections = usable.max(1);
    }
    // Catch the shutdown signals before the socket exists: once a client
    // can connect, SIGTERM must mean a clean shutdown, never sudden death.
    let signals = Signals::new(HANDLED_SIGNALS).map_err(DaemonError::Signals)?;
    // Bind before any thread exists: binding briefly changes the umask.
    let path = config.socket_path();
    let group = config.socket_group.clone().or_else(|| service_group(&path));
    let socket = KernelSocket::bind(&path, group.as_deref(), config.allow_shared_socket_dir)?;
    let gid = socket.gid();
    if !config.debug.defer_opcodes.is_empty() {
        log::warn!(
            "diagnostics: replies to {:?} are produced on worker threads with {} ms delay",
            config.debug.defer_opcodes,
            config.debug.defer_delay_ms
        );
    }
    // Said once everything that serves a request is up: a kernel that
    // fails to start after binding (a bad boot agent, a locked task
    // store) never claimed to listen.
    let reactor = Reactor::new(config, socket, signals, reload)?;
    log::info!(
        "agentosd {} listening on {} (pid {}, socket group {gid})",
        env!("CARGO_PKG_VERSION"),
        path.display(),
        std::process::id(),
    );
    reactor.run()?;
    // The system socket's directory is the kernel's own: it goes with the
    // kernel once empty (the state directory beside the socket is gone by
    // now), as a service's runtime directory would.
    if let Some(dir) = std::path::Path::new(SYSTEM_SOCKET).parent() {
        if path.parent() == Some(dir) {
            let _ = std::fs::remove_dir(dir);
        }
    }
    log::info!("agentosd stopped");
    Ok(())
}

/// The group of the system socket when none is configured: `agentos`
/// (members may use the kernel), if `scripts/install-service` made it.
fn service_group(path: &std::path::Path) -> Option<String> {
    if path != std::path::Path::new(SYSTEM_SOCKET) {
        return None;
    }
    match nix::unistd::Group::from_name(SERVICE_GROUP) {
        Ok(Some(_)) => Some(SERVICE_GROUP.to_owned()),
        _ => {
            log::warn!(
                "group {SERVICE_GROUP:?} does not exist (scripts/install-service creates it): \
                 only root may use {SYSTEM_SOCKET}"
            );
            None
        }
    }
}

/// Sets up logging: an explicit filter wins, then `RUST_LOG`, then `info`.
/// Request payloads are never logged above `debug`.
pub fn init_logging(filter: Option<&str>) {
    let mut builder = env_logger::Builder::new();
    match (filter, std::env::var("RUST_LOG")) {
        (Some(filter), _) => builder.parse_filters(filter),
        (None, Ok(filter)) => builder.parse_filters(&filter),
        (None, Err(_)) => builder.parse_filters("info"),
    };
    // The HTTP client logs the raw bytes of requests at `trace`, headers
    // and all: an LLM provider's key, a remote MCP server's credentials.
    // Its own logging stops at `warn`, whatever the filter asks.
    for module in ["ureq", "ureq_proto"] {
        builder.filter_module(module, log::LevelFilter::Warn);
    }
    // Under systemd the journal stamps each line itself.
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder.format_timestamp(None);
    } else {
        builder.format_timestamp_millis();
    }
    builder.init();
}

/// A peer that disconnects while we write must be an `EPIPE` error on that
/// one connection, never a signal that kills the kernel.
fn ignore_sigpipe() {
    // SAFETY: installing SIG_IGN for SIGPIPE touches no Rust state and is
    // async-signal-safe by construction.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Raises the soft open-files limit to the hard limit: each connection,
/// agent, exec host and run costs descriptors. Returns the new soft limit.
fn raise_fd_limit() -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}
