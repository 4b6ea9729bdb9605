"""Volumes: what create_volume, volumes and remove_volume send and return,
and how exec and spawn send the volumes they mount, against a fake kernel."""

from __future__ import annotations

import pytest
from fake_kernel import fake_kernel, socket_dir  # noqa: F401  (fixtures)
from test_client_shapes import RUN

from agentos import AgentOSClient, NotFound

DATA = {"volume": "data", "bytes": 512 << 20, "used_bytes": None,
        "created_at": "2026-11-29T08:00:00Z", "owned": True, "read_only": False}
GIVEN = {**DATA, "volume": "refs", "used_bytes": 4096, "owned": False, "read_only": True}


def test_volumes_are_made_listed_and_removed_by_name(fake_kernel):
    fake = fake_kernel([{"success": True, "volume": DATA},
                        {"success": True, "volume": DATA},
                        {"success": True, "volumes": [DATA, GIVEN]},
                        {"success": True, "removed": True},
                        {"success": False, "code": "not_found", "error": "no volume 'refs'"}])
    with AgentOSClient(fake.path, timeout=5) as client:
        assert client.create_volume("data", bytes="512M") == DATA
        assert client.create_volume("data") == DATA
        assert client.volumes() == [DATA, GIVEN]
        assert client.remove_volume("data") is True
        with pytest.raises(NotFound):
            client.remove_volume("refs")
    assert fake.json_requests() == [
        {"op": "create_volume", "volume": "data", "bytes": 512 << 20},
        {"op": "create_volume", "volume": "data"},
        {"op": "volumes"},
        {"op": "remove_volume", "volume": "data"},
        {"op": "remove_volume", "volume": "refs"},
    ]


def test_volumes_to_mount_may_be_dicts_or_tuples_and_go_as_dicts(fake_kernel):
    spawned = {"success": True, "id": 7, "name": "w", "pid": 42, "status": "running",
               "isolation": {}}
    fake = fake_kernel([RUN, spawned, RUN])
    with AgentOSClient(fake.path, timeout=5) as client:
        client.exec("print(1)", volumes=[("data", "/data"), ("refs", "/mnt/refs", True),
                                         {"name": "out", "path": "/workspace/out"}])
        client.spawn("w", command=["/bin/true"], volumes=[{"name": "data", "path": "/data",
                                                            "read_only": True}])
        client.exec("print(1)", volumes=[])
    run, spawn, plain = fake.json_requests()
    assert run["volumes"] == [
        {"name": "data", "path": "/data", "read_only": False},
        {"name": "refs", "path": "/mnt/refs", "read_only": True},
        {"name": "out", "path": "/workspace/out"},
    ]
    assert spawn["volumes"] == [{"name": "data", "path": "/data", "read_only": True}]
    assert "volumes" not in plain


@pytest.mark.parametrize("volumes", [
    "data:/data",
    {"name": "data", "path": "/data"},
    [("data",)],
    [("data", "/data", "ro")],
    ["data:/data"],
])
def test_a_volume_that_is_not_a_dict_or_a_tuple_is_refused_before_sending(socket_dir, volumes):
    client = AgentOSClient(socket_dir / "none.sock")
    with pytest.raises(TypeError):
        client.exec("print(1)", volumes=volumes)
    assert not client.connected
