//! The Clove SDK's metrics calls: the host's figures for operators, every
//! figure a number; agents' process and cgroup figures for whoever may
//! see them; and `cgroup_path` as a hostile agent would use it — a path,
//! a stranger's name.

use agentos_proto::Opcode;
use agentos_test_support::{act, request, require_root, Daemon};
use serde_json::{json, Value};

use super::reply;

const SYSTEM_METRICS: u8 = 0xC0;
const AGENT_METRICS: u8 = 0xC1;
const ALL_AGENT_METRICS: u8 = 0xC2;
const CGROUP_METRICS: u8 = 0xC3;

fn number(value: &Value, path: &str) -> f64 {
    let mut at = value;
    for key in path.split('.') {
        at = &at[key];
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number: {value}"))
}

#[test]
fn an_operator_reads_the_hosts_figures_as_numbers() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    for _ in 0..2 {
        let reply = request(&mut client, Opcode::SYSTEM_METRICS, &json!({}));
        assert_eq!(reply["success"], true, "{reply}");
        let metrics = &reply["metrics"];
        let percent = number(metrics, "cpu.percent");
        assert!((0.0..=100.0).contains(&percent), "{metrics}");
        assert!(number(metrics, "cpu.count") >= 1.0, "{metrics}");
        let loads = metrics["cpu"]["load_avg"].as_array().unwrap();
        assert_eq!(loads.len(), 3, "{metrics}");
        assert!(loads.iter().all(Value::is_f64), "{metrics}");
        assert!(number(metrics, "memory.total") > 0.0, "{metrics}");
        assert!(number(metrics, "memory.used") <= number(metrics, "memory.total"));
        for figure in [
            "disk.read_bytes",
            "disk.write_bytes",
            "network.bytes_sent",
            "network.bytes_recv",
            "memory.percent",
            "timestamp",
        ] {
            number(metrics, figure);
        }
    }
    let own = request(&mut client, Opcode::AGENT_METRICS, &json!({}));
    assert_eq!(
        own["code"], "bad_request",
        "an operator has no figures of its own: {own}"
    );
}

#[test]
fn an_agent_sees_its_own_figures_and_nothing_of_the_host_or_of_strangers() {
    require_root!("agents' cgroups, whose figures CGROUP_METRICS reads");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let stranger = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "stranger", "command": ["/bin/sleep", "30"]}),
    );
    let stranger_id = stranger["id"].as_u64().unwrap();
    let (id, replies) = act(
        &daemon,
        "measured",
        json!({"limits": {"memory": 134_217_728u64, "max_pids": 32}}),
        json!([
            [SYSTEM_METRICS, {}],
            [AGENT_METRICS, {}],
            [CGROUP_METRICS, {}],
            [CGROUP_METRICS, {"cgroup_path": "../../memory"}],
            [CGROUP_METRICS, {"cgroup_path": "stranger"}],
            [AGENT_METRICS, {"agent_id": stranger_id}],
            [ALL_AGENT_METRICS, {}],
            [CGROUP_METRICS, {"cgroup_path": "/sys/fs/cgroup"}],
        ]),
    );
    assert_eq!(reply(&replies, 0)["code"], "permission_denied");
    let own = &reply(&replies, 1)["metrics"];
    assert_eq!(own["agent_id"], id, "{own}");
    assert_eq!(own["name"], "measured", "{own}");
    assert_eq!(own["status"], "running", "{own}");
    assert_eq!(
        own["pid"], 1,
        "an agent sees its own top process as 1: {own}"
    );
    number(own, "process.cpu.percent");
    number(own, "kernel_stats.llm_calls");
    let cgroup = &reply(&replies, 2)["metrics"];
    assert_eq!(number(cgroup, "memory.max"), 134_217_728.0, "{cgroup}");
    assert_eq!(number(cgroup, "pids.max"), 32.0, "{cgroup}");
    assert!(number(cgroup, "memory.current") > 0.0, "{cgroup}");
    assert!(number(cgroup, "pids.current") >= 1.0, "{cgroup}");
    for n in [3, 7] {
        let refused = reply(&replies, n);
        assert_eq!(refused["code"], "bad_request", "{refused}");
        assert!(
            refused["error"].as_str().unwrap().contains("never a path"),
            "{refused}"
        );
    }
    assert_eq!(reply(&replies, 4)["code"], "not_found");
    assert_eq!(reply(&replies, 5)["code"], "not_found");
    let all = reply(&replies, 6);
    assert_eq!(all["count"], 1, "only itself: {all}");
}

#[test]
fn an_operator_reads_every_agents_process_and_cgroup() {
    require_root!("agents' cgroups, whose figures CGROUP_METRICS reads");
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "sleeper", "command": ["/bin/sleep", "30"]}),
    );
    let id = spawned["id"].as_u64().unwrap();
    let all = request(&mut client, Opcode::ALL_AGENT_METRICS, &json!({}));
    assert_eq!(all["success"], true, "{all}");
    let agents = all["agents"].as_array().unwrap();
    assert_eq!(all["count"], agents.len(), "{all}");
    let sleeper = agents.iter().find(|a| a["agent_id"] == id).unwrap();
    assert!(number(sleeper, "process.memory.rss") > 0.0, "{sleeper}");
    assert!(
        number(sleeper, "pid") > 1.0,
        "an operator sees host pids: {sleeper}"
    );
    let by_id = request(
        &mut client,
        Opcode::CGROUP_METRICS,
        &json!({"cgroup_path": id.to_string()}),
    );
    assert_eq!(by_id["metrics"]["cgroup_path"], "sleeper", "{by_id}");
    assert!(number(&by_id["metrics"], "memory.max") > 0.0, "{by_id}");
}
