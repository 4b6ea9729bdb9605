//! Who may call what: secrets kept out of runs, replies and logs, an
//! agent's tool permissions, and THINK as a tool charged to its caller.

use std::time::{Duration, Instant};

use agentos_proto::Opcode;
use agentos_test_support::{self as support, act, call_json, require_root, Daemon};
use serde_json::json;

use crate::{exec, faulty, lines, server, settled, tool, tool_names, EXEC, TOOL};

#[test]
fn secrets_never_enter_runs_replies_or_logs() {
    require_root!("MCP servers confined as the sandbox user, and EXEC");
    const SECRET: &str = "sk-agentos-test-9f3a1c77";
    // Named `json`, as a module the tools runtime itself uses: a server's
    // name never clashes with the runtime's own names.
    let config = faulty(
        "json",
        "\"serve\", \"--leak\"",
        &format!("env = {{ SECRET = \"{SECRET}\" }}"),
    );
    let daemon = Daemon::start_with(&config);
    let mut stream = daemon.raw();
    let list = settled(&mut stream, &["json"]);
    assert_eq!(server(&list, "json")["state"], "ready", "{list}");
    // The server has its key...
    let env = tool(
        &mut stream,
        json!({"op": "call", "server": "json", "tool": "env"}),
    );
    assert_eq!(env["result"]["has_secret"], true, "{env}");
    // ...and nothing else does: not a run's environment, any process it
    // can see, the tools package, nor any reply.
    let run = exec(
        &mut stream,
        &format!(
            r#"
import os, glob
secret = {SECRET:?}
found = [k for k, v in os.environ.items() if secret in v]
for path in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline") + glob.glob("/tools/**", recursive=True):
    try:
        if os.path.isfile(path) and secret.encode() in open(path, "rb").read():
            found.append(path)
    except OSError:
        pass
import tools
print(tools.json.env()["has_secret"], found)
# Nor can a run change what other runs import.
try:
    open("/tools/tools.py", "a").write("print('hijacked')")
    print("tools.py written")
except OSError as err:
    print("refused")
"#
        ),
    );
    assert_eq!(lines(&run), ["True []", "refused"], "{run}");
    // A server that hands its key out in a result or an error: the kernel
    // blots it out of the reply, and out of what a run gets.
    let leak = tool(
        &mut stream,
        json!({"op": "call", "server": "json", "tool": "leak"}),
    );
    assert_eq!(leak["result"]["key"], "[secret]", "{leak}");
    let leak_error = tool(
        &mut stream,
        json!({"op": "call", "server": "json", "tool": "leak_error"}),
    );
    assert_eq!(leak_error["error"], "key [secret] refused", "{leak_error}");
    let leaked_in_run = exec(&mut stream, "import tools\nprint(tools.json.leak())");
    let hello = call_json(&mut stream, Opcode::HELLO, b"");
    for reply in [
        &list,
        &env,
        &run,
        &hello,
        &leak,
        &leak_error,
        &leaked_in_run,
    ] {
        assert!(!reply.to_string().contains(SECRET), "{reply}");
    }
    // The server printed its key on stderr: the log has it blotted out.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !daemon.log().contains("starting with key") {
        assert!(Instant::now() < deadline, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = daemon.log();
    assert!(!log.contains(SECRET), "the key reached the log");
    assert!(log.contains("starting with key [secret]"), "{log}");
}

#[test]
fn an_agent_lists_and_calls_only_the_tools_its_permissions_allow() {
    require_root!("agents, MCP servers and EXEC");
    let config = faulty("faults", "\"serve\"", "");
    let daemon = Daemon::start_with(&config);
    let mut stream = daemon.raw();
    settled(&mut stream, &["faults"]);
    let code = "import tools\ntry:\n    tools.faults.env()\nexcept tools.ToolError as e:\n    \
                print(e.code)\nprint(tools.faults.get_sum(a=1, b=1))";
    let (_, replies) = act(
        &daemon,
        "limited",
        json!({"permissions": {"tools": ["faults.get-*"]}}),
        json!([
            [TOOL, {"op": "list"}],
            [TOOL, {"op": "call", "server": "faults", "tool": "env"}],
            [TOOL, {"op": "call", "server": "llm", "tool": "think", "arguments": {"prompt": "hi"}}],
            [TOOL, {"op": "call", "server": "faults", "tool": "get-sum", "arguments": {"a": 2, "b": 2}}],
            [EXEC, {"code": code}],
        ]),
    );
    let reply = |i: usize| &replies[i]["reply"];
    assert_eq!(tool_names(reply(0)), ["faults.get-sum"], "{}", reply(0));
    for denied in [reply(1), reply(2)] {
        assert_eq!(denied["code"], "permission_denied", "{denied}");
        assert!(
            denied["error"].as_str().unwrap().contains("faults.get-*"),
            "{denied}"
        );
    }
    assert_eq!(reply(3)["result"], 4, "{}", reply(3));
    // A run's calls are its caller's: the agent's permissions hold there.
    assert_eq!(reply(4)["stdout"], "permission_denied\n2\n", "{}", reply(4));
    assert_eq!(reply(4)["tool_calls"], 1, "{}", reply(4));

    // An agent may not give a child tools it lacks.
    let (_, replies) = act(
        &daemon,
        "parent",
        json!({"permissions": {"spawn": true, "tools": ["faults.env"]}}),
        json!([[0x10, {"name": "child", "command": ["/bin/true"], "permissions": {"tools": ["*"]}}]]),
    );
    assert_eq!(
        replies[0]["reply"]["code"], "permission_denied",
        "{replies:?}"
    );
}

#[test]
fn llm_think_as_a_tool_goes_through_think_and_is_charged_to_its_caller() {
    use agentos_test_support::llm_stub::{Reply, Stub};
    let stub = Stub::start(|_, _| Reply::openai("stub says hi", 10, 5));
    let daemon = support::with_llm_stub(&stub.url(), "");
    let mut stream = daemon.raw();
    let think = json!({"op": "call", "server": "llm", "tool": "think",
                       "arguments": {"prompt": "hello", "max_tokens": 20}});
    let answer = tool(&mut stream, think.clone());
    assert_eq!(answer["result"], "stub says hi", "{answer}");
    assert_eq!(answer["content"][0]["text"], "stub says hi");
    let bad = tool(
        &mut stream,
        json!({"op": "call", "server": "llm", "tool": "think", "arguments": {"prompt": 7}}),
    );
    assert_eq!(bad["code"], "tool_error", "{bad}");

    // An agent: refused without permissions.think; charged to its own
    // quota, and refused once the quota is spent.
    let mut client = daemon.client();
    let (_, replies) = act(
        &daemon,
        "thoughtless",
        json!({"permissions": {"think": false}}),
        json!([[TOOL, think.clone()]]),
    );
    assert_eq!(
        replies[0]["reply"]["code"], "permission_denied",
        "{replies:?}"
    );
    let (id, replies) = act(
        &daemon,
        "frugal",
        json!({"permissions": {"llm_tokens": 40}}),
        json!([
            [TOOL, think.clone()],
            [TOOL, think.clone()],
            [TOOL, think.clone()]
        ]),
    );
    assert_eq!(replies[0]["reply"]["result"], "stub says hi", "{replies:?}");
    assert!(
        replies
            .iter()
            .any(|r| r["reply"]["code"] == "limit_exceeded"),
        "a spent quota was not enforced: {replies:?}"
    );
    let listed = support::agent_info(&mut client, id);
    assert!(listed["llm"]["tokens"].as_u64().unwrap() >= 15, "{listed}");
}
