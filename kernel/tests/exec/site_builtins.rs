//! What the site module would give an interpreter, given to runs without
//! it: help() on stdout, never a pager or a prompt waiting for input, and
//! exit() and quit().

use agentos_test_support::{require_root, Daemon};
use serde_json::{json, Value};

use crate::exec;

/// A run of `code` with a timeout short enough that a help() waiting for
/// input would show as `timed_out`.
fn run(stream: &mut std::os::unix::net::UnixStream, code: &str) -> Value {
    let reply = exec(stream, json!({"code": code, "timeout_ms": 20_000}));
    assert_eq!(reply["timed_out"], false, "{reply}");
    reply
}

fn stdout(reply: &Value) -> &str {
    reply["stdout"].as_str().unwrap_or_default()
}

#[test]
fn help_prints_an_objects_documentation_on_stdout() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = run(&mut stream, "help(len)");
    assert_eq!(reply["success"], true, "{reply}");
    assert!(
        stdout(&reply).contains("Help on built-in function len in module builtins")
            && stdout(&reply).contains("Return the number of items in a container"),
        "{reply}"
    );
    assert_eq!(reply["stderr"], "", "{reply}");
    // help on True goes through pydoc's pager, which must write to stdout.
    let reply = run(&mut stream, "help(True)");
    assert!(stdout(&reply).contains("class bool"), "{reply}");
    // It follows sys.stdout wherever the run points it.
    let reply = run(
        &mut stream,
        "import contextlib, io\nbuffer = io.StringIO()\n\
         with contextlib.redirect_stdout(buffer):\n    help(abs)\n\
         print(len(buffer.getvalue()) > 0, 'Help on' in buffer.getvalue())",
    );
    assert_eq!(stdout(&reply), "True True\n", "{reply}");
}

#[test]
fn help_with_no_argument_returns_without_waiting_for_input() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = run(&mut stream, "help()\nhelp()\nprint('after help')");
    assert_eq!(reply["success"], true, "{reply}");
    let out = stdout(&reply);
    assert_eq!(out.matches("Welcome to Python").count(), 2, "{reply}");
    assert!(out.ends_with("after help\n"), "{reply}");
    assert_eq!(
        stdout(&run(&mut stream, "print(repr(help))")),
        "Type help() for interactive help, or help(object) for help about object.\n"
    );
}

#[test]
fn help_documents_the_tools_a_run_imports() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    // The kernel's own servers are always there: no MCP server is needed.
    let reply = run(
        &mut stream,
        "import tools\nhelp(tools.kernel.list_agents)\nhelp(tools)",
    );
    assert_eq!(reply["success"], true, "{reply}");
    let out = stdout(&reply);
    assert!(
        out.contains("Help on function list_agents")
            && out.contains("List the agents the kernel runs"),
        "{reply}"
    );
    assert!(
        out.contains("Help on module tools")
            && out.contains("The kernel's tools, as Python functions"),
        "{reply}"
    );
}

#[test]
fn exit_and_quit_end_the_run_with_their_status() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let reply = run(&mut stream, "print('before')\nexit(3)\nprint('after')");
    assert_eq!(
        (stdout(&reply), reply["exit_code"].clone()),
        ("before\n", json!(3)),
        "{reply}"
    );
    let reply = run(&mut stream, "quit()");
    assert_eq!(
        (reply["exit_code"].clone(), reply["success"].clone()),
        (json!(0), json!(true)),
        "{reply}"
    );
}

#[test]
fn pydoc_is_imported_only_by_a_run_that_asks_for_help() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    // Held by the zygote, pydoc would weigh on every run's fork and exit.
    let reply = run(
        &mut stream,
        "import sys\nprint('pydoc' in sys.modules)\nhelp(len)\nprint('pydoc' in sys.modules)",
    );
    let out = stdout(&reply);
    assert!(
        out.starts_with("False\n") && out.ends_with("True\n"),
        "{reply}"
    );
}
