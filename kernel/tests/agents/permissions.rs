//! GET_PERMS and SET_PERMS: the Clove SDK's levels and switches, which
//! only ever lower. What an operator's connection drops holds for that
//! connection only; what an agent drops holds for good, with its
//! descendants; and what a hostile agent tries — raising itself back,
//! lowering a stranger, fields the kernel cannot keep — is refused.

use agentos_proto::Opcode;
use agentos_test_support::{act, agent_info, request, Daemon};
use serde_json::json;

use super::{refused, reply};

const GET_PERMS: u8 = 0x40;
const SET_PERMS: u8 = 0x41;
const EXEC: u8 = 0x02;

#[test]
fn an_operator_connection_lowers_itself_alone_and_never_rises_again() {
    let daemon = Daemon::start();
    let mut lowered = daemon.client();
    let mut other = daemon.client();
    let own = request(&mut lowered, Opcode::GET_PERMS, &json!({}));
    assert_eq!(own["success"], true, "{own}");
    assert!(own["agent_id"].as_u64().unwrap() >= 1_000_000, "{own}");
    let permissions = &own["permissions"];
    assert_eq!(permissions["level"], "unrestricted", "{own}");
    for switch in ["think", "exec", "spawn", "task", "read", "write", "http"] {
        assert_eq!(permissions[switch], true, "{switch}: {own}");
    }
    // `unrestricted` is "everything I was granted": nothing changes.
    let same = request(
        &mut lowered,
        Opcode::SET_PERMS,
        &json!({"level": "unrestricted"}),
    );
    assert_eq!(same["permissions"], own["permissions"], "{same}");

    let standard = request(
        &mut lowered,
        Opcode::SET_PERMS,
        &json!({"level": "standard"}),
    );
    assert_eq!(standard["success"], true, "{standard}");
    assert_eq!(standard["permissions"]["level"], "standard", "{standard}");
    assert_eq!(standard["permissions"]["exec"], false, "{standard}");
    assert_eq!(standard["permissions"]["write"], true, "{standard}");
    let run = request(&mut lowered, Opcode::EXEC, &json!({"code": "print(1)"}));
    refused(&run, "permission_denied", "exec");
    let spawn = request(
        &mut lowered,
        Opcode::SPAWN,
        &json!({"name": "after-lowering", "command": ["/bin/true"]}),
    );
    refused(&spawn, "permission_denied", "spawn");

    // No way back up on this connection.
    let again = request(
        &mut lowered,
        Opcode::SET_PERMS,
        &json!({"level": "unrestricted"}),
    );
    assert_eq!(again["permissions"]["level"], "standard", "{again}");
    let raise = request(
        &mut lowered,
        Opcode::SET_PERMS,
        &json!({"permissions": {"can_exec": true}}),
    );
    refused(&raise, "permission_denied", "can_exec");
    let readonly = request(
        &mut lowered,
        Opcode::SET_PERMS,
        &json!({"permissions": {"can_write": false, "can_read": true}}),
    );
    assert_eq!(readonly["permissions"]["level"], "readonly", "{readonly}");

    // Another connection of the same uid keeps everything.
    let untouched = request(&mut other, Opcode::GET_PERMS, &json!({}));
    assert_eq!(
        untouched["permissions"]["level"], "unrestricted",
        "{untouched}"
    );
    let ran = request(&mut other, Opcode::EXEC, &json!({"code": "print(1)"}));
    assert_eq!(ran["success"], true, "{ran}");
}

#[test]
fn what_the_kernel_cannot_keep_is_refused_by_name_never_ignored() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    for (body, naming) in [
        (json!({"permissions": {"exec": ["ls"]}}), "permissions.exec"),
        (
            json!({"permissions": {"filesystem": {"read": ["/tmp/*"]}}}),
            "permissions.filesystem",
        ),
        (
            json!({"permissions": {"network": ["example.com"]}}),
            "permissions.network",
        ),
        (json!({"permissions": {"can_fly": false}}), "can_fly"),
        (json!({"level": "root"}), "level"),
        (json!({"level": "standard", "as": "root"}), "as"),
        (json!({}), "level"),
    ] {
        let reply = request(&mut client, Opcode::SET_PERMS, &body);
        refused(&reply, "bad_request", naming);
    }
    let get = request(&mut client, Opcode::GET_PERMS, &json!({"level": "x"}));
    refused(&get, "bad_request", "level");
    // Nothing was lowered by the refused requests.
    let own = request(&mut client, Opcode::GET_PERMS, &json!({}));
    assert_eq!(own["permissions"]["level"], "unrestricted", "{own}");
}

#[test]
fn an_agent_lowers_itself_for_good_and_a_hostile_one_cannot_climb_or_reach_others() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let bystander = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "bystander", "command": ["/bin/sleep", "30"]}),
    );
    let bystander = bystander["id"].as_u64().unwrap();
    let (id, replies) = act(
        &daemon,
        "climber",
        json!({}),
        json!([
            [GET_PERMS, {}],
            [SET_PERMS, {"level": "readonly"}],
            [EXEC, {"code": "print(1)"}],
            [SET_PERMS, {"level": "unrestricted"}],
            [SET_PERMS, {"permissions": {"can_write": true}}],
            [SET_PERMS, {"level": "minimal", "agent_id": bystander}],
            [SET_PERMS, {"level": "minimal", "agent_id": 1_000_000}],
            [GET_PERMS, {}],
        ]),
    );
    let own = reply(&replies, 0);
    assert_eq!(own["agent_id"], id, "{own}");
    // A default agent may not spawn, and still amounts to `unrestricted`:
    // everything EXEC, HTTP and the files need.
    assert_eq!(own["permissions"]["spawn"], false, "{own}");
    assert_eq!(own["permissions"]["level"], "unrestricted", "{own}");
    assert_eq!(reply(&replies, 1)["permissions"]["level"], "readonly");
    refused(reply(&replies, 2), "permission_denied", "exec");
    assert_eq!(reply(&replies, 3)["permissions"]["level"], "readonly");
    refused(reply(&replies, 4), "permission_denied", "can_write");
    refused(reply(&replies, 5), "not_found", &bystander.to_string());
    refused(reply(&replies, 6), "not_found", "1000000");
    assert_eq!(reply(&replies, 7)["permissions"]["level"], "readonly");
    // For good: the kernel's record says so, and the bystander kept all.
    let info = agent_info(&mut client, id);
    assert_eq!(info["permissions"]["exec"], false, "{info}");
    assert_eq!(info["permissions"]["write"], false, "{info}");
    let untouched = agent_info(&mut client, bystander);
    assert_eq!(untouched["permissions"]["exec"], true, "{untouched}");
}

#[test]
fn an_operator_lowers_an_agent_and_its_descendants_with_it() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let (parent, replies) = act(
        &daemon,
        "parent",
        json!({"permissions": {"spawn": true}}),
        json!([[0x10, {"name": "child", "command": ["/bin/sleep", "30"]}]]),
    );
    let child = reply(&replies, 0)["id"].as_u64().unwrap();
    let lowered = request(
        &mut client,
        Opcode::SET_PERMS,
        &json!({"agent_id": parent, "permissions": {"can_spawn": false, "can_http": false}}),
    );
    assert_eq!(lowered["success"], true, "{lowered}");
    assert_eq!(lowered["agent_id"], parent, "{lowered}");
    assert_eq!(lowered["permissions"]["spawn"], false, "{lowered}");
    for id in [parent, child] {
        let info = agent_info(&mut client, id);
        assert_eq!(info["permissions"]["http"], false, "{info}");
        assert_eq!(info["permissions"]["spawn"], false, "{info}");
        assert_eq!(info["permissions"]["think"], true, "{info}");
    }
    // The operator's own connection is not lowered by lowering an agent.
    let own = request(&mut client, Opcode::GET_PERMS, &json!({}));
    assert_eq!(own["permissions"]["level"], "unrestricted", "{own}");
}

#[test]
fn a_lowered_operator_connection_spawns_no_agent_with_more_than_it_kept() {
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let lowered = request(
        &mut client,
        Opcode::SET_PERMS,
        &json!({"permissions": {"can_http": false, "can_exec": false}}),
    );
    assert_eq!(lowered["permissions"]["level"], "custom", "{lowered}");
    let asked = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "wider", "command": ["/bin/sleep", "30"],
                "permissions": {"http": true}}),
    );
    refused(&asked, "permission_denied", "permissions.http");
    let spawned = request(
        &mut client,
        Opcode::SPAWN,
        &json!({"name": "narrow", "command": ["/bin/sleep", "30"]}),
    );
    assert_eq!(spawned["success"], true, "{spawned}");
    let info = agent_info(&mut client, spawned["id"].as_u64().unwrap());
    assert_eq!(info["permissions"]["http"], false, "{info}");
    assert_eq!(info["permissions"]["exec"], false, "{info}");
    assert_eq!(info["permissions"]["think"], true, "{info}");
}
