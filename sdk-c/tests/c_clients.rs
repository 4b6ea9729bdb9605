//! The C library as C code uses it: `include/agentos.h` compiled against
//! `libagentos`, the example `examples/c/hello.c` run against a live
//! agentosd, and under valgrind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Where cargo put this build's libagentos and agentosd (the profile's
/// directory: this test's binary lives in its `deps/`).
fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Compiles `source` with the header and links it with libagentos.
fn compile(source: &Path, output: &Path) {
    let status = Command::new("gcc")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(repo().join("sdk-c/include"))
        .arg(source)
        .arg("-L")
        .arg(build_dir())
        .arg("-lagentos")
        .arg("-o")
        .arg(output)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed on {}", source.display());
}

/// An agentosd on a socket of its own, stopped on drop.
struct Kernel {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Kernel {
    fn start() -> Kernel {
        let agentosd = build_dir().join("agentosd");
        assert!(
            agentosd.exists(),
            "{} is missing: build the workspace (cargo build) first",
            agentosd.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agentos.sock");
        let config = dir.path().join("agentosd.toml");
        std::fs::write(&config, "[llm]\nprovider = \"none\"\n").unwrap();
        let child = Command::new(agentosd)
            .arg("--socket")
            .arg(&socket)
            .arg("--config")
            .arg(&config)
            .env("AGENTOS_AGENT_LOG_DIR", dir.path().join("logs"))
            .env("AGENTOS_STATE_DIR", dir.path().join("state"))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "agentosd did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Kernel {
            child,
            socket,
            _dir: dir,
        }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

#[test]
fn the_header_declares_what_the_library_defines() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("symbols.c");
    // Every function of the header, taken by address: the link fails on
    // any the library does not define.
    std::fs::write(
        &source,
        r#"#include "agentos.h"
#include <stdio.h>
int main(void) {
    void *symbols[] = {
        (void *)agentos_connect, (void *)agentos_close, (void *)agentos_call,
        (void *)agentos_free, (void *)agentos_last_error, (void *)agentos_hello,
        (void *)agentos_noop, (void *)agentos_think, (void *)agentos_exec,
        (void *)agentos_tool, (void *)agentos_spawn, (void *)agentos_kill,
        (void *)agentos_list, (void *)agentos_task, (void *)agentos_logs,
    };
    agentos_status ok = AGENTOS_OK;
    printf("%zu %d\n", sizeof symbols / sizeof symbols[0], (int)ok);
    return 0;
}
"#,
    )
    .unwrap();
    compile(&source, &dir.path().join("symbols"));
}

#[test]
fn the_c_example_talks_to_a_live_kernel_and_valgrind_finds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let hello = dir.path().join("hello");
    compile(&repo().join("examples/c/hello.c"), &hello);
    let kernel = Kernel::start();
    let run = |wrapper: &[&str]| {
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(&hello);
                command
            }
            None => Command::new(&hello),
        };
        command
            .arg(&kernel.socket)
            .env("LD_LIBRARY_PATH", build_dir())
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("hello: {\"success\":true"), "{stdout}");
    assert!(stdout.contains("noop: ping\n"), "{stdout}");
    assert!(stdout.contains("think: {"), "{stdout}");
    assert!(stdout.contains("raw noop: 3 bytes back"), "{stdout}");
    assert!(stdout.contains("tool: {\"success\":true"), "{stdout}");
    assert!(stdout.contains("task: {\"success\":true"), "{stdout}");
    assert!(stdout.contains("hello from the C example\\n"), "{stdout}");
    assert!(stdout.contains("\"killed\":true"), "{stdout}");

    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!(
            "!!! NOT TESTED: valgrind is not installed: the C library is not checked for leaks"
        );
        return;
    }
    let checked = run(&[
        "valgrind",
        "--error-exitcode=99",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,indirect",
        "--quiet",
    ]);
    assert!(
        checked.status.success(),
        "valgrind: {}\n{}",
        checked.status,
        String::from_utf8_lossy(&checked.stderr)
    );
}
