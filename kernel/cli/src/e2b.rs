//! `agentos e2b`: E2B's API for E2B's SDKs, served over the kernel
//! (`agentos_e2b`); and `agentos e2b keys add NAME`, which makes a key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentos_e2b::keys::{add_key, KeysError};
use agentos_e2b::{default_keys_path, E2bError, E2bOptions, Sizing};

/// `agentos e2b`'s flags.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct E2bArgs {
    #[command(subcommand)]
    command: Option<E2bCommand>,
    /// Serve at ADDR (host:port, :port or port; port alone is 127.0.0.1).
    /// A non-loopback host needs keys
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
    listen: String,
    /// API keys: lines `NAME sha256:HEX`, mode 600 (`agentos e2b keys add
    /// NAME` makes them). Else the key in $AGENTOS_E2B_API_KEY; else
    /// ~/.config/agentos/e2b-keys if there is one; else a key the face
    /// makes and keeps in ~/.config/agentos/e2b-token, served on your own
    /// connections only
    #[arg(long, value_name = "PATH")]
    keys_file: Option<PathBuf>,
    /// The secret sandbox access tokens are made with (mode 600); else
    /// one made and kept in ~/.config/agentos/e2b-secret-token
    #[arg(long, value_name = "PATH")]
    secret_file: Option<PathBuf>,
    /// In a fleet: the fleet's secret (mode 600, the same on every node),
    /// proving the forwards of requests for other nodes' sandboxes; else
    /// $AGENTOS_FLEET_SECRET; else the face forwards nothing
    #[arg(long, value_name = "PATH")]
    fleet_secret_file: Option<PathBuf>,
    /// A Host header value allowed besides localhost and the bound
    /// address (DNS rebinding guard). Repeatable
    #[arg(long, value_name = "HOST")]
    allow_host: Vec<String>,
    /// Each sandbox's memory limit, MiB
    #[arg(long, value_name = "MIB", default_value_t = 512)]
    memory_mb: u64,
    /// Each sandbox's CPUs
    #[arg(long, value_name = "N", default_value_t = 2)]
    cpus: u32,
    /// Each sandbox's processes and threads
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_pids: u64,
    /// How long a sandbox paused with its memory stays frozen before it
    /// is hibernated (its files kept, its memory freed), seconds
    #[arg(long, value_name = "SECS", default_value_t = 3600)]
    paused_keep_secs: u64,
    /// Live sandboxes one key may hold
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_sandboxes_per_key: usize,
    /// The most one upload to a sandbox's /files may write, MiB
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    max_upload_mib: u64,
}

#[derive(Debug, clap::Subcommand)]
enum E2bCommand {
    /// API keys
    #[command(subcommand)]
    Keys(KeysCommand),
}

#[derive(Debug, clap::Subcommand)]
enum KeysCommand {
    /// Make a key named NAME, keep its hash in the keys file and print
    /// the key (once: it is kept nowhere)
    Add {
        /// 1 to 44 of A-Z a-z 0-9 _ -
        name: String,
        /// The keys file [default: ~/.config/agentos/e2b-keys]
        #[arg(long, value_name = "PATH")]
        keys_file: Option<PathBuf>,
    },
}

/// Why `agentos e2b` failed.
#[derive(Debug, thiserror::Error)]
pub enum E2bCliError {
    #[error("agentos e2b")]
    Serve(#[from] E2bError),
    #[error("agentos e2b keys")]
    Keys(#[from] KeysError),
    #[error("agentos e2b: {0}")]
    Setup(String),
}

/// Runs `agentos e2b` with the kernel at `socket`.
pub fn e2b(args: E2bArgs, socket: &Path) -> Result<(), E2bCliError> {
    if let Some(E2bCommand::Keys(KeysCommand::Add { name, keys_file })) = args.command {
        let path = match keys_file {
            Some(path) => path,
            None => default_keys_path().map_err(|err| E2bCliError::Setup(err.to_string()))?,
        };
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|err| E2bCliError::Setup(format!("{}: {err}", dir.display())))?;
        }
        let key = add_key(&path, &name)?;
        eprintln!(
            "agentos e2b: key {name} added to {}; it is shown once, here:",
            path.display()
        );
        println!("{key}");
        return Ok(());
    }
    let memory_bytes = args
        .memory_mb
        .checked_mul(1 << 20)
        .filter(|bytes| *bytes >= 16 << 20)
        .ok_or_else(|| E2bCliError::Setup("--memory-mb: give at least 16".to_owned()))?;
    if args.cpus == 0 || args.max_pids == 0 || args.max_sandboxes_per_key == 0 {
        return Err(E2bCliError::Setup(
            "--cpus, --max-pids and --max-sandboxes-per-key: give at least 1".to_owned(),
        ));
    }
    if args.max_upload_mib == 0 {
        return Err(E2bCliError::Setup(
            "--max-upload-mib: give at least 1".to_owned(),
        ));
    }
    // A paused sandbox's keep is a lifetime, at most the kernel's 30 days.
    if !(1..=30 * 24 * 3600).contains(&args.paused_keep_secs) {
        return Err(E2bCliError::Setup(
            "--paused-keep-secs: give 1 to 2592000 (30 days)".to_owned(),
        ));
    }
    let options = E2bOptions {
        listen: args.listen,
        socket: socket.to_owned(),
        keys_file: args.keys_file,
        secret_file: args.secret_file,
        fleet_secret_file: args.fleet_secret_file,
        allow_hosts: args.allow_host,
        sizing: Sizing {
            memory_bytes,
            cpus: args.cpus,
            max_pids: args.max_pids,
            paused_keep_ms: args.paused_keep_secs * 1000,
            max_sandboxes_per_key: args.max_sandboxes_per_key,
            max_upload_bytes: args.max_upload_mib.saturating_mul(1 << 20),
        },
    };
    // A server outlives its clients: one that hangs up mid-answer is an
    // EPIPE for that write, not a signal that ends every other request.
    // SAFETY: setting a signal's disposition touches no memory of ours,
    // and no other thread runs yet.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // One thread serves everything: each kernel request is non-blocking
    // I/O on it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| E2bCliError::Setup(format!("starting its runtime: {err}")))?;
    let served = runtime.block_on(agentos_e2b::serve(options));
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(served?)
}
