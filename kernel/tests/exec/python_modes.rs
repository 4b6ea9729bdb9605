//! EXEC's two Python fields for a loop that runs what a model wrote:
//! `print_last_expression` shows a last bare expression's value once, and
//! `skip_if_not_code` leaves text a model set out in a block unrun, the
//! sandbox (never the kernel) deciding what is code.

use agentos_test_support::{require_root, Daemon};
use serde_json::{json, Value};

use crate::exec;

#[test]
fn a_last_bare_expression_is_printed_once_when_asked() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let code =
        "calls = []\ndef value():\n    calls.append(1)\n    return {'calls': len(calls)}\nvalue()";
    let shown = exec(
        &mut stream,
        json!({"code": code, "print_last_expression": true}),
    );
    assert_eq!(shown["stdout"], "{'calls': 1}\n", "evaluated once: {shown}");
    let default = exec(&mut stream, json!({"code": code}));
    assert_eq!(
        default["stdout"], "",
        "EXEC's default prints nothing: {default}"
    );
    for (code, stdout) in [
        ("x = 6\nx * 7", "42\n"),
        ("print('a')\nNone", "a\n"),
        ("import os\nos.getcwd()", "'/workspace'\n"),
        ("y = 1", ""),
    ] {
        let reply = exec(
            &mut stream,
            json!({"code": code, "print_last_expression": true}),
        );
        assert_eq!(reply["stdout"], stdout, "{code}: {reply}");
        assert_eq!(reply["exit_code"], 0);
    }
    let failed = exec(
        &mut stream,
        json!({"code": "1 / 0", "print_last_expression": true}),
    );
    assert_eq!(failed["error"], "ZeroDivisionError: division by zero");
    let traceback = failed["stderr"].as_str().unwrap();
    assert!(!traceback.contains("run_python"), "{traceback}");
    // Output limits hold for the value too.
    let huge = exec(
        &mut stream,
        json!({"code": "'x' * 10_000_000", "print_last_expression": true}),
    );
    let truncated = huge["truncated"]["stdout"].as_u64().unwrap();
    assert!(truncated > 9_000_000, "{}", huge["truncated"]);
}

fn run_if_code(stream: &mut std::os::unix::net::UnixStream, code: &str) -> Value {
    exec(
        stream,
        json!({"code": code, "skip_if_not_code": true, "print_last_expression": true}),
    )
}

#[test]
fn text_set_out_as_code_is_not_run_and_code_is() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    let texts = [
        ("a JSON object", "{\"total\": 49.75, \"items\": [1, 2]}"),
        ("answer: 42", "answer: 42"),
        (
            "a traceback",
            "Traceback (most recent call last):\n  File \"<exec>\", line 1, in <module>\nNameError: name 'x' is not defined",
        ),
        (
            "prose with code in it",
            "The answer is 42: I ran print(6 * 7) and it printed 42.",
        ),
        ("a word", "PELICAN"),
        ("a number", "-17.5"),
    ];
    for (what, text) in texts {
        let reply = run_if_code(&mut stream, text);
        let why = reply["not_code"]
            .as_str()
            .unwrap_or_else(|| panic!("{what} ran: {reply}"));
        assert!(!why.is_empty());
        assert_eq!(reply["stdout"], "", "{what}: {reply}");
        assert_eq!(reply["stderr"], "", "{what}: {reply}");
        assert!(reply["error"].is_null(), "{what}: {reply}");
    }
    let code = run_if_code(&mut stream, "with open('/workspace/f', 'w') as f:\n    f.write('hi')\nprint(open('/workspace/f').read())");
    assert!(code.get("not_code").is_none(), "{code}");
    assert_eq!(code["stdout"], "hi\n");
    let expression = run_if_code(&mut stream, "6 * 7");
    assert_eq!(
        expression["stdout"], "42\n",
        "a computation is code: {expression}"
    );
    // Without the field, text that does not parse is a failed run.
    let plain = exec(&mut stream, json!({"code": texts[3].1}));
    assert_eq!(plain["exit_code"], 1);
    assert!(plain["error"].as_str().unwrap().starts_with("SyntaxError"));
    assert!(plain.get("not_code").is_none());
}

#[test]
fn the_python_fields_are_refused_for_bash_by_name() {
    require_root!("EXEC (its isolation needs namespaces)");
    let daemon = Daemon::start();
    let mut stream = daemon.raw();
    for field in ["print_last_expression", "skip_if_not_code"] {
        let reply = exec(
            &mut stream,
            json!({"code": "echo hi", "language": "bash", field: true}),
        );
        assert_eq!(reply["code"], "bad_request", "{reply}");
        assert!(reply["error"].as_str().unwrap().contains(field), "{reply}");
    }
    let not_a_bool = exec(
        &mut stream,
        json!({"code": "1", "print_last_expression": "yes"}),
    );
    assert_eq!(not_a_bool["code"], "bad_request", "{not_a_bool}");
    let misspelt = exec(
        &mut stream,
        json!({"code": "1", "print_last_expresion": true}),
    );
    assert_eq!(misspelt["code"], "bad_request", "{misspelt}");
    assert!(
        misspelt["error"]
            .as_str()
            .unwrap()
            .contains("print_last_expresion"),
        "{misspelt}"
    );
}
