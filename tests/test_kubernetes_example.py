"""examples/kubernetes/: no cluster runs here, so its DaemonSet is checked
for what can be checked on one machine: it parses as Kubernetes objects,
its config is one agentosd accepts, and it gives agentosd the host paths
and the capabilities the systemd unit gives it — no more, no fewer."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from conftest import REPO, binary

EXAMPLE = REPO / "examples" / "kubernetes" / "agentosd-daemonset.yaml"
UNIT = REPO / "scripts" / "service" / "agentosd.service.in"


def objects() -> dict[str, dict]:
    loaded = list(yaml.safe_load_all(EXAMPLE.read_text()))
    return {item["kind"]: item for item in loaded}


def unit_setting(name: str) -> str:
    found = re.findall(rf"^{name}=(.*)$", UNIT.read_text(), re.M)
    assert len(found) == 1, (name, found)
    return found[0].strip()


def test_the_daemonset_parses_and_its_pods_are_its_own():
    made = objects()
    assert set(made) == {"ConfigMap", "DaemonSet"}
    daemonset = made["DaemonSet"]
    assert daemonset["apiVersion"] == "apps/v1"
    spec = daemonset["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    mounted = {mount["name"] for mount in container["volumeMounts"]}
    assert mounted == {volume["name"] for volume in pod["volumes"]}
    config = next(v for v in pod["volumes"] if "configMap" in v)
    assert config["configMap"]["name"] == made["ConfigMap"]["metadata"]["name"]
    # The database's password comes from a secret, never the config.
    env = {item["name"]: item for item in container["env"]}
    assert "secretKeyRef" in env["AGENTOS_FLEET_DATABASE"]["valueFrom"]
    assert "database" not in made["ConfigMap"]["data"]["agentosd.toml"].split("#")[0]


def test_its_config_is_one_agentosd_accepts(tmp_path: Path):
    config = tmp_path / "agentosd.toml"
    config.write_text(objects()["ConfigMap"]["data"]["agentosd.toml"])
    checked = subprocess.run([binary("agentosd"), "--config", str(config), "--check-config"],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def test_its_host_paths_and_capabilities_are_the_systemd_units():
    pod = objects()["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    host_paths = {volume["hostPath"]["path"] for volume in pod["volumes"] if "hostPath" in volume}
    unit_paths = {
        f"/var/lib/{unit_setting('StateDirectory')}",
        f"/var/log/{unit_setting('LogsDirectory')}",
        # The socket's directory, which the daemon makes itself.
        "/run/agentos",
    }
    if unit_setting("Delegate") == "yes":
        unit_paths.add("/sys/fs/cgroup")
    assert host_paths == unit_paths
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for volume in pod["volumes"]:
        if "hostPath" in volume:
            assert mounts[volume["name"]] == volume["hostPath"]["path"], volume
    security = container["securityContext"]
    assert security["privileged"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    added = {f"CAP_{name}" for name in security["capabilities"]["add"]}
    assert added == set(unit_setting("CapabilityBoundingSet").split())
