"""HTTP (0x50) against a real agentosd: the kernel makes a request for its
caller, to what the caller's network allows — for an operator, the
configured default policy — and decides every redirect again.

The upstream is the tests' httpbin stand-in on the host's loopback, named
``httpbin.test`` through ``[network] resolve``, its CA trusted through
``[network] extra_ca``. The requests are what a hostile caller would
send: a redirect to the metadata address, a name outside the policy,
smuggled headers, an answer too large.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

import httpbin_standin
from agentos import AgentOSClient
from agentos.errors import BadRequest, LimitExceeded, PermissionDenied, Timeout
from conftest import Kernel, kernel_with

# The largest body a reply holds in these tests.
MAX_BODY = 4096


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Kernel, httpbin_standin.StandIn]]:
    directory = Path(tempfile.mkdtemp(prefix="agentos-http-"))
    stand_in = httpbin_standin.StandIn(directory, ["httpbin.test", "outside.test"])
    config = textwrap.dedent(f"""
        [exec]
        max_file_bytes = {MAX_BODY}

        [network]
        extra_ca = "{stand_in.ca}"
        default_allow = ["httpbin.test", "127.0.0.1/32"]

        [network.resolve]
        "httpbin.test" = "127.0.0.1"
        "outside.test" = "127.0.0.1"
        "metadata.test" = "169.254.169.254"
        """)
    try:
        with kernel_with(config) as kernel:
            yield kernel, stand_in
    finally:
        stand_in.close()
        shutil.rmtree(directory, ignore_errors=True)


def base(stand_in: httpbin_standin.StandIn) -> str:
    return f"https://httpbin.test:{stand_in.https_port}"


def test_a_get_comes_back_with_status_headers_and_body(served):
    kernel, stand_in = served
    with AgentOSClient(kernel.socket_path) as client:
        reply = client.http(f"{base(stand_in)}/get?foo=bar&num=123",
                            headers={"X-Custom-Header": "AgentOSTest"})
    assert reply["success"] is True and reply["status_code"] == 200, reply
    assert reply["headers"]["content-type"] == "application/json", reply
    echoed = json.loads(reply["body"])
    assert echoed["args"] == {"foo": "bar", "num": "123"}
    sent = {name.lower(): value for name, value in echoed["headers"].items()}
    assert sent["x-custom-header"] == "AgentOSTest"
    assert reply["url"] == f"{base(stand_in)}/get?foo=bar&num=123"


def test_a_post_sends_its_body_and_a_status_is_an_answer(served):
    kernel, stand_in = served
    with AgentOSClient(kernel.socket_path) as client:
        posted = client.http(f"{base(stand_in)}/post", method="POST",
                             headers={"Content-Type": "application/json"},
                             body=json.dumps({"name": "AgentOS"}))
        assert json.loads(posted["body"])["json"] == {"name": "AgentOS"}
        missing = client.http(f"{base(stand_in)}/status/404")
        assert missing["success"] is True and missing["status_code"] == 404
        plain = client.http(f"http://httpbin.test:{stand_in.http_port}/get")
        assert plain["status_code"] == 200


def test_a_redirect_is_followed_only_where_the_policy_allows(served):
    kernel, stand_in = served
    with AgentOSClient(kernel.socket_path) as client:
        inside = client.http(f"{base(stand_in)}/redirect-to?url=/get%3Fhop%3D1")
        assert inside["status_code"] == 200
        assert inside["url"] == f"{base(stand_in)}/get?hop=1"
        for target in ("http://169.254.169.254/latest/meta-data/",
                       "http://metadata.test/latest/meta-data/",
                       f"https://outside.test:{stand_in.https_port}/get"):
            seen_before = len(stand_in.seen)
            with pytest.raises(PermissionDenied):
                client.http(f"{base(stand_in)}/redirect-to?url={target}")
            # The redirect came; nothing was asked of the target.
            assert len(stand_in.seen) == seen_before + 1
        with pytest.raises(BadRequest, match="http"):
            client.http(f"{base(stand_in)}/redirect-to?url=file:///etc/passwd")


def test_names_and_addresses_outside_the_policy_are_refused(served):
    kernel, stand_in = served
    with AgentOSClient(kernel.socket_path) as client:
        for url in (f"https://outside.test:{stand_in.https_port}/get",
                    "http://169.254.169.254/",
                    "http://metadata.test/",
                    "http://[::1]:9/",
                    "http://10.0.0.1/"):
            with pytest.raises(PermissionDenied):
                client.http(url)


def test_smuggled_headers_and_other_schemes_are_refused(served):
    kernel, stand_in = served
    with AgentOSClient(kernel.socket_path) as client:
        for headers in ({"Host": "outside.test"}, {"Transfer-Encoding": "chunked"},
                        {"Content-Length": "0"}, {"Proxy-Authorization": "x"},
                        {"X-Split": "a\r\nHost: outside.test"}):
            with pytest.raises(BadRequest, match="headers"):
                client.http(f"{base(stand_in)}/get", headers=headers)
        for url in ("file:///etc/passwd", "gopher://httpbin.test/",
                    f"https://user:pw@httpbin.test:{stand_in.https_port}/"):
            with pytest.raises(BadRequest, match="url"):
                client.http(url)
    assert not any(seen["headers"].get("Host") == "outside.test" for seen in stand_in.seen)


def test_time_and_size_are_bounded(served):
    kernel, stand_in = served
    with AgentOSClient(kernel.socket_path) as client:
        with pytest.raises(Timeout):
            client.http(f"{base(stand_in)}/delay/3", timeout=1)
        binary = client.http(f"{base(stand_in)}/bytes/{MAX_BODY}")
        assert binary["body_encoding"] == "base64" and len(binary["body"]) > MAX_BODY
        with pytest.raises(LimitExceeded, match="longer than"):
            client.http(f"{base(stand_in)}/bytes/{MAX_BODY + 1}")
        with pytest.raises(BadRequest, match="timeout"):
            client.http(f"{base(stand_in)}/get", timeout=100000)


def test_a_connection_lowered_without_http_is_refused(served):
    kernel, stand_in = served
    with AgentOSClient(kernel.socket_path) as client:
        client.set_permissions(level="standard")
        with pytest.raises(PermissionDenied, match="http"):
            client.http(f"{base(stand_in)}/get")


def test_without_a_default_policy_an_operator_reaches_nothing():
    with kernel_with() as kernel, AgentOSClient(kernel.socket_path) as client:
        with pytest.raises(PermissionDenied, match="default_allow"):
            client.http("http://127.0.0.1:9/")
