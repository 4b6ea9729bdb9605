"""A hibernated session carries its template through the fleet: a session
opened from a template on one node wakes on a node that never built it,
which keeps the template's image (checked against its hash) and lists it
as its own; a node that built a template of that name from the same
packages uses its own; one whose template of that name was built from
other packages refuses the session by name, and the fleet keeps it. Each
node runs in a network namespace of its own, with a stand-in package
index there to build its templates from."""

from __future__ import annotations

import contextlib

import pytest
from agentos import AgentOSClient, AgentOSError
from fleet_harness import fleet, wait_for
from package_index_standin import serving
from test_session_disks import INDEX_HOST

# pip, a build and a wake, on two busy cores.
SLOW_MS = 300_000


def client_of(node) -> AgentOSClient:
    return AgentOSClient(node.socket_path, timeout=360)


def templates_from(address: str) -> str:
    return ("[exec]\ntemplate_disk_bytes = 268435456\n"
            f'template_index_url = "http://{address}/simple/"\n'
            f'template_index_hosts = ["{INDEX_HOST}/32"]\n')


def kept_rows(f) -> list[str]:
    """The fleet's hibernated sessions, as `name|template`."""
    text = f.postgres.sql(
        "SELECT name || '|' || coalesce(convert_from(template, 'UTF8')::json->>'name', '-')"
        " FROM agentos_sessions ORDER BY name", "agentos")
    return [line for line in text.splitlines() if line]


def build(node, template: str, package: str) -> None:
    with client_of(node) as client:
        built = client.build_template(template, [package], timeout_ms=SLOW_MS)
        assert built["ok"], built


def hibernate_from_template(node, session: str, template: str, code: str) -> None:
    with client_of(node) as client:
        ran = client.exec(code, session=session, template=template, timeout_ms=SLOW_MS)
        assert ran["ok"], ran
        assert client.pause_session(session, hibernate=True)["state"] == "hibernated"


def test_a_session_carries_its_template_to_a_node_without_it_and_not_onto_another_one():
    with fleet() as f, contextlib.ExitStack() as stack:
        n1 = f.node("n1", start=False)
        n2 = f.node("n2", start=False)
        for node in (n1, n2):
            address = stack.enter_context(serving(f"{INDEX_HOST}:0", node.host.wrap()))
            node.config += "\n" + templates_from(address)
            node.start()
            wait_for(f"{node.name} in the fleet", node.is_joined, timeout=20)
        build(n1, "probe", "agentos-probe")
        build(n1, "same", "agentos-probe")
        build(n2, "same", "agentos-probe")
        build(n1, "tools", "agentos-probe")
        build(n2, "tools", "agentos-probe==1.0.0")

        # A session from n1's template, with a global, wakes on n2, which
        # never built the template: it keeps n1's, and the session imports
        # what it holds.
        hibernate_from_template(n1, "s", "probe", "import agentos_probe\nx = 41")
        wait_for("s kept with its template", lambda: kept_rows(f) == ["s|probe"], timeout=60)
        with client_of(n2) as client:
            woken = client.exec("import agentos_probe\nprint(agentos_probe.VALUE, x + 1)",
                                session="s", timeout_ms=SLOW_MS)
            assert woken["ok"], woken
            assert woken["stdout"] == "from the stand-in index 42\n", woken
            listed = {t["template"]: t for t in client.templates()}
            assert listed["probe"]["packages"] == ["agentos-probe"], listed
            # Its programs are first on PATH, from the template it came with.
            path = client.exec("echo $PATH", "bash", session="s", timeout_ms=SLOW_MS)
            assert "/opt/template/bin" in path["stdout"].split(":"), path
            # In use by the session, the template stays.
            with pytest.raises(AgentOSError) as busy:
                client.remove_template("probe")
            assert busy.value.code == "busy", busy.value
        assert kept_rows(f) == []

        # A session from n1's "same" wakes on n2 with n2's own "same",
        # built from the same packages (its own image stays).
        with client_of(n2) as client:
            same_before = {t["template"]: t for t in client.templates()}["same"]
        hibernate_from_template(n1, "u", "same", "z = 5")
        wait_for("u kept with its template", lambda: kept_rows(f) == ["u|same"], timeout=60)
        with client_of(n2) as client:
            woken = client.exec("import agentos_probe\nprint(z)", session="u",
                                timeout_ms=SLOW_MS)
            assert woken["stdout"] == "5\n", woken
            assert {t["template"]: t for t in client.templates()}["same"] == same_before

        # A session from n1's "tools" does not wake on n2, whose "tools"
        # was built from other packages: refused by name, kept by the
        # fleet, and woken where the template is the same.
        hibernate_from_template(n1, "t", "tools", "y = 7")
        wait_for("t kept with its template", lambda: kept_rows(f) == ["t|tools"], timeout=60)
        with client_of(n2) as client:
            with pytest.raises(AgentOSError) as refused:
                client.exec("print(y)", session="t", timeout_ms=SLOW_MS)
            assert refused.value.code == "unavailable", refused.value
            said = str(refused.value)
            assert 'template "tools"' in said and "agentos-probe==1.0.0" in said, said
        assert kept_rows(f) == ["t|tools"]
        with client_of(n1) as client:
            back = client.exec("print(y)", session="t", timeout_ms=SLOW_MS)
            assert back["stdout"] == "7\n", back
        assert kept_rows(f) == []


def test_a_damaged_template_image_is_not_kept_and_the_session_stays_kept():
    with fleet() as f, contextlib.ExitStack() as stack:
        n1 = f.node("n1", start=False)
        address = stack.enter_context(serving(f"{INDEX_HOST}:0", n1.host.wrap()))
        n1.config += "\n" + templates_from(address)
        n1.start()
        wait_for("n1 in the fleet", n1.is_joined, timeout=20)
        n2 = f.node("n2")
        build(n1, "probe", "agentos-probe")
        hibernate_from_template(n1, "s", "probe", "x = 1")
        wait_for("s kept", lambda: kept_rows(f) == ["s|probe"], timeout=60)
        # The template's image, changed in the database: its first part.
        f.postgres.sql(
            "UPDATE agentos_session_contents SET content = overlay(content placing "
            "'\\xdeadbeef'::bytea from 2000) WHERE part = 0 AND hash = "
            "(SELECT convert_from(template, 'UTF8')::json->>'hash' FROM agentos_sessions)",
            "agentos")
        with client_of(n2) as client:
            with pytest.raises(AgentOSError) as refused:
                client.exec("print(x)", session="s", timeout_ms=SLOW_MS)
            said = str(refused.value)
            assert refused.value.code == "unavailable" and "damaged" in said, said
            assert [t["template"] for t in client.templates()] == []
        assert kept_rows(f) == ["s|probe"]
