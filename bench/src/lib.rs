//! Shared pieces of the benchmark programs: starting the servers under
//! test, what they send the kernel and how they read its replies
//! ([`wire`]), and percentiles. The stand-in LLM provider the THINK
//! benchmark uses is the tests' (`agentos_test_support::llm_stub`).

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub mod kernel_figures;
pub mod wire;

/// Why a server under test did not come up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Its program could not be run.
    #[error("cannot start {name}")]
    Spawn {
        /// The server's name in the results.
        name: &'static str,
        /// Why not.
        #[source]
        source: io::Error,
    },
    /// Whether it was still running could not be asked.
    #[error("cannot wait for {name}")]
    Wait {
        /// The server's name in the results.
        name: &'static str,
        /// Why not.
        #[source]
        source: io::Error,
    },
    /// It exited before it listened.
    #[error("{name} exited at start: {status}")]
    Exited {
        /// The server's name in the results.
        name: &'static str,
        /// How it ended.
        status: ExitStatus,
    },
    /// Its socket accepted nothing for ten seconds.
    #[error("{name} did not start listening")]
    NotListening {
        /// The server's name in the results.
        name: &'static str,
    },
    /// Its config file could not be written.
    #[error("cannot write {}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// Why not.
        #[source]
        source: io::Error,
    },
}

/// A server process under test, killed when dropped.
#[derive(Debug)]
pub struct Server {
    /// Its name in the results.
    pub name: &'static str,
    child: Child,
    /// The socket it listens on.
    pub socket: PathBuf,
}

impl Server {
    /// Starts `command` and waits until `socket` accepts connections.
    pub fn start(
        name: &'static str,
        mut command: Command,
        socket: PathBuf,
    ) -> Result<Server, StartError> {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| StartError::Spawn { name, source })?;
        let mut server = Server {
            name,
            child,
            socket,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&server.socket).is_err() {
            let exited = server
                .child
                .try_wait()
                .map_err(|source| StartError::Wait { name, source })?;
            if let Some(status) = exited {
                return Err(StartError::Exited { name, status });
            }
            if Instant::now() > deadline {
                return Err(StartError::NotListening { name });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(server)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident memory in MiB.
    pub fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    }

    /// Stops it with SIGTERM and waits, so it cleans up after itself.
    pub fn stop(mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: kill(2) on our own child.
            unsafe {
                libc::kill(self.child.id() as i32, libc::SIGTERM);
            }
            let _ = self.child.wait();
        }
    }
}

/// Starts agentosd on a socket in `dir`, logging only warnings, with its
/// agents' logs in `dir` too, and no LLM (a model loading in the
/// background would disturb what is measured).
pub fn start_agentosd(binary: &Path, dir: &Path) -> Result<Server, StartError> {
    start_agentosd_with(binary, dir, "[llm]\nprovider = \"none\"\n")
}

/// [`start_agentosd`] with this TOML config.
pub fn start_agentosd_with(
    binary: &Path,
    dir: &Path,
    config_text: &str,
) -> Result<Server, StartError> {
    let config = dir.join("agentosd.toml");
    std::fs::write(&config, config_text).map_err(|source| StartError::Config {
        path: config.clone(),
        source,
    })?;
    let socket = dir.join("agentos.sock");
    let mut command = Command::new(binary);
    command
        .arg("--socket")
        .arg(&socket)
        .arg("--config")
        .arg(&config)
        .arg("--log-level")
        .arg("warn")
        .env("AGENTOS_AGENT_LOG_DIR", dir.join("logs"))
        .env("AGENTOS_STATE_DIR", dir.join("state"));
    Server::start("agentosd", command, socket)
}

/// A program built next to the running one (in the same target directory).
pub fn sibling(name: &str) -> io::Result<PathBuf> {
    let here = std::env::current_exe()?;
    Ok(here
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
        .join(name))
}

/// The `p` quantile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// How a target came out, as the benchmarks print it.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}
