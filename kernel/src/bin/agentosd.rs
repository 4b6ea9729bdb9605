//! `agentosd`: the AgentOS kernel daemon. Runs in the foreground.

use std::path::PathBuf;
use std::process::ExitCode;

use agentos_kernel::config::{Config, Flags};
use agentos_kernel::tools::process::ServerCommand;
use agentos_kernel::tools::view::Withheld;
use agentos_kernel::{agents, daemon, sandbox};
use clap::Parser;

/// The AgentOS kernel: serves the AgentOS protocol on a Unix socket.
///
/// Settings come from the config file, then AGENTOS_* environment
/// variables, then these flags.
#[derive(Debug, Parser)]
#[command(name = "agentosd", version)]
struct Args {
    /// Socket path [default: $AGENTOS_SOCKET, /run/agentos/agentos.sock as root,
    /// else $XDG_RUNTIME_DIR/agentos/agentos.sock or /tmp/agentos-$UID/agentos.sock]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Config file [default: $AGENTOS_CONFIG, else /etc/agentos/agentosd.toml if present]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log filter: error, warn, info, debug, trace (or an env_logger filter)
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Group owning the socket; its members may use the kernel
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Serve a socket in a directory other users may write in (/tmp),
    /// where they could plant its .lock or .d first
    #[arg(long)]
    allow_shared_socket_dir: bool,
    /// Largest request payload accepted, in bytes
    #[arg(long, value_name = "BYTES")]
    max_request_bytes: Option<u64>,
    /// Worker threads for blocking work
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Interpreter for SPAWN scripts that name none
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Check the configuration (file, environment, flags) and exit: 0 when
    /// it is valid (with a warning for each MCP server whose program the
    /// kernel would not find, or finds as a version manager's shim), 2 with
    /// the reason when not
    #[arg(long)]
    check_config: bool,
}

fn main() -> ExitCode {
    // The daemon re-executes itself as the init of each sandbox it starts,
    // and to confine the children it runs itself.
    let role = std::env::args_os().nth(1);
    if role.as_deref() == Some(std::ffi::OsStr::new(sandbox::init::ARG)) {
        sandbox::init::main();
    }
    if role.as_deref() == Some(std::ffi::OsStr::new(sandbox::confine::ARG)) {
        sandbox::confine::main();
    }
    let args = Args::parse();
    let flags = Flags {
        config: args.config,
        socket: args.socket,
        socket_group: args.socket_group,
        allow_shared_socket_dir: args.allow_shared_socket_dir,
        log_level: args.log_level,
        max_request_bytes: args.max_request_bytes,
        workers: args.workers,
        python: args.python,
    };
    let config = match Config::load(&flags) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("agentosd: {err}");
            return ExitCode::from(2);
        }
    };
    if args.check_config {
        if let Err(err) = agents::Agents::check_boot(&config) {
            eprintln!("agentosd: {err}");
            return ExitCode::from(2);
        }
        match &config.file {
            Some(file) => println!("agentosd: {} is valid", file.display()),
            None => println!("agentosd: no config file; the settings are valid"),
        }
        for warning in server_program_warnings(&config) {
            eprintln!("agentosd: warning: {warning}");
        }
        return ExitCode::SUCCESS;
    }
    daemon::init_logging(config.log_level.as_deref());
    // SIGHUP reads the same layers again: file, environment, flags.
    let reload = Box::new(move || Config::load(&flags));
    match daemon::run(config, reload) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            log::error!("{err}");
            ExitCode::FAILURE
        }
    }
}

/// What `--check-config` says of each enabled MCP server's program: one
/// the kernel would not find (so the server would not start), and one that
/// is a version manager's shim (pyenv, rbenv, asdf), which picks the real
/// program from an environment a server does not get. Warnings, not
/// errors: the settings are valid, and a program may be installed later.
fn server_program_warnings(config: &Config) -> Vec<String> {
    let path = std::env::var("PATH").ok();
    // Only where the program is matters here, not what the server sees.
    let withheld = Withheld {
        homes: Vec::new(),
        state_dir: PathBuf::new(),
    };
    let mut warnings = Vec::new();
    for (name, server) in config.mcp.enabled().filter(|(_, s)| !s.is_remote()) {
        match ServerCommand::resolve(server, path.as_deref(), None, &withheld) {
            Err(why) => warnings.push(format!(
                "MCP server `{name}` will not start: {why} ({})",
                path.as_deref().unwrap_or("no PATH set")
            )),
            Ok(command) if is_shim(&command.program) => warnings.push(format!(
                "MCP server `{name}`: its command is {}, a version manager's shim, which \
                 picks its program from the environment, and a server gets none of the \
                 kernel's: give the real program's path (`pyenv which {}`, say)",
                command.program.display(),
                command
                    .program
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
            )),
            Ok(_) => {}
        }
    }
    warnings
}

/// Whether `program` lies in a version manager's `shims` directory.
fn is_shim(program: &std::path::Path) -> bool {
    program
        .parent()
        .and_then(|dir| dir.file_name())
        .is_some_and(|dir| dir == "shims")
}
