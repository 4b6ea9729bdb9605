"""A sandbox's files through `agentos e2b`, driven by E2B's own Python
SDK: envd's `filesystem` service and `/files`, onto the kernel's file
ops in the sandbox's session, as its one user sees its files."""

from __future__ import annotations

import gzip
import json
import time
import urllib.error
import urllib.request
from typing import Iterator, Optional

import pytest

from conftest import Kernel, root_kernel
from e2b_face import E2bFace, create, face, made  # noqa: F401

import e2b
from e2b import FileType, NotFoundException


@pytest.fixture(scope="module")
def kernel() -> Iterator[Optional[Kernel]]:
    yield from root_kernel("E2B sandboxes' files (file ops in sessions)")


@pytest.fixture
def sandbox(face, made) -> e2b.Sandbox:
    return create(face, made)


def files_call(face: E2bFace, sandbox: e2b.Sandbox, method: str, query: str,
               body: Optional[bytes] = None, headers: Optional[dict] = None,
               token: Optional[str] = None) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"{face.url}/files?{query}", data=body, method=method,
        headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983",
                 "X-Access-Token": token or sandbox._envd_access_token, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_files_are_written_read_listed_moved_and_removed(sandbox):
    info = sandbox.files.write("notes/a.txt", "hello")
    assert (info.path, info.name) == ("/home/user/notes/a.txt", "a.txt")
    assert sandbox.files.read("notes/a.txt") == "hello"
    assert sandbox.files.read("/home/user/notes/a.txt", format="bytes") == b"hello"
    # A command sees what the SDK wrote, and the SDK what a command wrote.
    assert sandbox.commands.run("cat ~/notes/a.txt").stdout == "hello"
    sandbox.commands.run("printf 'from bash' > /tmp/b.txt")
    assert sandbox.files.read("/tmp/b.txt") == "from bash"
    entry = sandbox.files.get_info("notes/a.txt")
    assert entry.type == FileType.FILE and entry.size == 5, entry
    assert entry.permissions == "-rw-r--r--" and entry.mode == 0o644, entry
    assert sandbox.files.exists("notes/a.txt") and not sandbox.files.exists("nope")
    assert sandbox.files.make_dir("notes/sub/deeper") is True
    assert sandbox.files.make_dir("notes/sub/deeper") is False
    listed = {e.name: e.type for e in sandbox.files.list("notes")}
    assert listed == {"a.txt": FileType.FILE, "sub": FileType.DIR}, listed
    deep = {e.path for e in sandbox.files.list("notes", depth=3)}
    assert "/home/user/notes/sub/deeper" in deep, deep
    moved = sandbox.files.rename("notes/a.txt", "/tmp/a.txt")
    assert moved.path == "/tmp/a.txt"
    sandbox.files.remove("notes")
    assert not sandbox.files.exists("notes")
    with pytest.raises(NotFoundException):
        sandbox.files.read("notes/a.txt")
    sandbox.commands.run("ln -s /tmp/a.txt ~/link")
    assert sandbox.files.get_info("link").type == FileType.SYMLINK


def test_many_files_binary_and_large_ones_round_trip(sandbox):
    written = sandbox.files.write_files([
        {"path": "many/one.txt", "data": "1"},
        {"path": "/tmp/two.bin", "data": bytes(range(256))},
    ])
    assert [w.path for w in written] == ["/home/user/many/one.txt", "/tmp/two.bin"]
    assert sandbox.files.read("/tmp/two.bin", format="bytes") == bytes(range(256))
    big = bytes(i % 251 for i in range(3 * 1024 * 1024 + 17))
    started = time.monotonic()
    sandbox.files.write("big.bin", big)
    wrote = time.monotonic() - started
    started = time.monotonic()
    assert sandbox.files.read("big.bin", format="bytes") == big
    read = time.monotonic() - started
    print(f"3 MiB: up {wrote * 1000:.0f} ms, down {read * 1000:.0f} ms")
    assert sandbox.commands.run("stat -c %s ~/big.bin").stdout.strip() == str(len(big))
    sandbox.files.write("empty.txt", "")
    assert sandbox.files.read("empty.txt") == ""


def test_uploads_by_octet_stream_gzip_and_metadata(face, sandbox):
    status, body = files_call(face, sandbox, "POST", "path=up%2Fraw.txt", b"raw bytes",
                              {"Content-Type": "application/octet-stream",
                               "X-Metadata-Owner": "me"})
    assert status == 200, body
    assert json.loads(body) == [{"path": "/home/user/up/raw.txt", "name": "raw.txt",
                                 "type": "file", "metadata": {"owner": "me"}}]
    assert sandbox.files.get_info("up/raw.txt").metadata == {"owner": "me"}
    packed = gzip.compress(b"z" * 100000)
    status, body = files_call(face, sandbox, "POST", "path=up/z.txt", packed,
                              {"Content-Type": "application/octet-stream",
                               "Content-Encoding": "gzip"})
    assert status == 200, body
    assert sandbox.files.read("up/z.txt") == "z" * 100000
    status, body = files_call(face, sandbox, "GET", "path=up%2Fraw.txt")
    assert (status, body) == (200, b"raw bytes")


def test_a_directory_is_watched(sandbox):
    sandbox.files.make_dir("watched")
    handle = sandbox.files.watch_dir("watched", recursive=True)
    sandbox.files.write("watched/new.txt", "x")
    sandbox.commands.run("mkdir ~/watched/d && touch ~/watched/d/inner")
    seen: list = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen += handle.get_new_events()
        names = {(e.name, e.type.value) for e in seen}
        if ("new.txt", "create") in names and ("d/inner", "create") in names:
            break
        time.sleep(0.2)
    assert ("new.txt", "create") in names and ("d/inner", "create") in names, seen
    # Events already read are not read again.
    assert all((e.name, e.type.value) not in names for e in handle.get_new_events())
    handle.stop()


def test_paths_users_and_tokens_are_checked(face, made, sandbox):
    for query in ("path=%2Fetc%2Fshadow", "path=..%2F..%2F..%2Fetc%2Fshadow"):
        status, body = files_call(face, sandbox, "GET", query)
        assert status in (400, 403, 404), (query, status, body)
    status, body = files_call(face, sandbox, "POST", "path=%2Fetc%2Fx", b"x",
                              {"Content-Type": "application/octet-stream"})
    assert status == 403, body
    status, body = files_call(face, sandbox, "GET", "path=a&username=bob")
    assert status == 401, body
    status, body = files_call(face, sandbox, "POST", "path=a", b"x",
                              {"Content-Type": "text/plain"})
    assert status == 400, body
    status, body = files_call(face, sandbox, "POST", "path=a", b"not gzip",
                              {"Content-Type": "application/octet-stream",
                               "Content-Encoding": "gzip"})
    assert status == 400, body
    # Another key's sandbox token does not reach this sandbox's files.
    bobs = create(face, made, key="bob")
    sandbox.files.write("mine.txt", "alice's")
    status, body = files_call(face, sandbox, "GET", "path=mine.txt",
                              token=bobs._envd_access_token)
    assert status == 401, body
    status, body = files_call(face, bobs, "GET", "path=mine.txt")
    assert status == 404, body


def test_a_signed_url_reaches_its_sandboxs_file_alone_until_it_expires(face, made, sandbox):
    sandbox.files.write("shared.txt", "for the link")
    url = sandbox.download_url("shared.txt")
    assert url.startswith(face.url + "/files?"), url
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.read() == b"for the link"
    expiring = sandbox.download_url("shared.txt", use_signature_expiration=60)
    with urllib.request.urlopen(expiring, timeout=30) as response:
        assert response.read() == b"for the link"
    for bad in (url.replace("shared.txt", "other.txt", 1), url[:-2] + "xx",
                sandbox.download_url("shared.txt", use_signature_expiration=-5)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bad, timeout=30)
        assert refused.value.code == 401, bad
    # Bob's sandbox's signature reaches Bob's sandbox, not Alice's.
    bobs = create(face, made, key="bob")
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(bobs.download_url("shared.txt"), timeout=30)
    assert missing.value.code == 404
    upload = sandbox.upload_url("up/signed.txt")
    boundary = "xyzzy"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"ignored.txt\"\r\nContent-Type: text/plain\r\n\r\nuploaded\r\n"
            f"--{boundary}--\r\n").encode()
    request = urllib.request.Request(
        upload, data=body, method="POST",
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.loads(response.read())[0]["path"] == "/home/user/up/signed.txt"
    assert sandbox.files.read("up/signed.txt") == "uploaded"


def test_a_directory_is_watched_as_a_stream_by_the_async_sdk(face, sandbox):
    import asyncio

    async def watch() -> list:
        seen: list = []
        same = await e2b.AsyncSandbox.connect(sandbox.sandbox_id, api_key=face.keys["alice"])
        await same.files.make_dir("streamed")
        handle = await same.files.watch_dir("streamed", on_event=seen.append)
        await same.files.write("streamed/x.txt", "x")
        for _ in range(50):
            if any(event.name == "x.txt" for event in seen):
                break
            await asyncio.sleep(0.1)
        await handle.stop()
        return seen

    seen = asyncio.run(watch())
    assert any(e.name == "x.txt" and e.type.value == "create" for e in seen), seen


def test_a_gzip_bomb_is_stopped_at_the_upload_bound(kernel):
    from e2b_face import e2b_face

    with e2b_face(kernel.socket_path, key_names=("alice",),
                  extra=("--max-upload-mib", "1")) as small:
        sandbox = e2b.Sandbox.create(api_key=small.keys["alice"], api_url=small.url,
                                     sandbox_url=small.url)
        try:
            bomb = gzip.compress(bytes(64 << 20), compresslevel=9)
            assert len(bomb) < 128 << 10
            started = time.monotonic()
            status, body = files_call(small, sandbox, "POST", "path=bomb.bin", bomb,
                                      {"Content-Type": "application/octet-stream",
                                       "Content-Encoding": "gzip"})
            assert status == 413, body
            assert time.monotonic() - started < 10
            # What was written before the bound stays: no more than it.
            written = int(sandbox.commands.run("stat -c %s ~/bomb.bin").stdout)
            assert 0 < written <= 1 << 20, written
        finally:
            sandbox.kill()
