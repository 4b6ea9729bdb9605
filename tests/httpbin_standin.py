"""A local stand-in for httpbin.org's endpoints that HTTP tests use, over
HTTPS with a certificate from a test CA (and plain HTTP), for names the
kernel is told to resolve to it with ``[network] resolve`` and a CA it is
told to trust with ``[network] extra_ca``.

As a program, it serves one name on one address until stopped, writing
its CA where the kernel's config can name it::

    python3 tests/httpbin_standin.py --name httpbin.org --listen 127.0.0.7:443 \\
        --dir /tmp/httpbin-standin

Endpoints: ``/get``, ``/post`` (and ``/put``, ``/patch``, ``/delete``),
``/headers``, ``/delay/N``, ``/status/N``, ``/bytes/N``,
``/redirect-to?url=…``.
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import ipaddress
import json
import ssl
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Iterable

METHODS_WITH_BODY = ("POST", "PUT", "PATCH", "DELETE")


def make_certificates(directory: Path, names: Iterable[str]) -> tuple[Path, Path, Path]:
    """A test CA, and a server certificate it signed for ``names`` (and
    127.0.0.1): the paths of the CA, the certificate and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    names = list(names)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentos test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(n) for n in names]
            + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_path, cert_path, key_path = (directory / n for n in ("ca.pem", "server.pem", "server.key"))
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return ca_path, cert_path, key_path


class Handler(http.server.BaseHTTPRequestHandler):
    """httpbin's answers, as JSON; every request's path and headers are
    kept in the server's ``seen``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def answer(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length).decode(errors="replace") if length else ""
        headers = {k: v for k, v in self.headers.items()}
        self.server.seen.append({"method": self.command, "path": self.path, "headers": headers})
        args = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.strip("/").split("/")
        status, extra, body = 200, {}, None
        if parts[0] == "delay" and len(parts) == 2:
            time.sleep(min(float(parts[1]), 10))
        elif parts[0] == "status" and len(parts) == 2:
            status, body = int(parts[1]), b""
        elif parts[0] == "bytes" and len(parts) == 2:
            body = b"\xff" * int(parts[1])
        elif parts[0] == "redirect-to":
            status, body = int(args.get("status_code", 302)), b""
            extra["Location"] = args["url"]
        if body is None:
            reply = {"args": args, "headers": headers, "url": f"https://{headers.get('Host')}{self.path}"}
            if parts[0] == "headers":
                reply = {"headers": headers}
            elif self.command in METHODS_WITH_BODY:
                reply["data"] = data
                try:
                    reply["json"] = json.loads(data) if data else None
                except ValueError:
                    reply["json"] = None
            body = json.dumps(reply, indent=2).encode()
            extra["Content-Type"] = "application/json"
        self.send_response(status)
        for name, value in extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = answer


class StandIn:
    """An HTTPS (and a plain HTTP) server answering as httpbin does."""

    def __init__(self, directory: Path, names: Iterable[str],
                 https: tuple[str, int] = ("127.0.0.1", 0),
                 plain: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.ca, cert, key = make_certificates(directory, names)
        self.https = http.server.ThreadingHTTPServer(https, Handler)
        self.http = http.server.ThreadingHTTPServer(plain, Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.https.socket = context.wrap_socket(self.https.socket, server_side=True)
        self.seen: list[dict] = []
        for server in (self.https, self.http):
            server.seen = self.seen
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.https_port = self.https.server_address[1]
        self.http_port = self.http.server_address[1]

    def close(self) -> None:
        for server in (self.https, self.http):
            server.shutdown()
            server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", action="append", required=True,
                        help="a name the certificate is for (repeatable)")
    parser.add_argument("--listen", default="127.0.0.7:443", help="HTTPS address")
    parser.add_argument("--plain", default="127.0.0.7:80", help="plain HTTP address")
    parser.add_argument("--dir", type=Path, required=True, help="where the CA is written")
    options = parser.parse_args()
    host, port = options.listen.rsplit(":", 1)
    plain_host, plain_port = options.plain.rsplit(":", 1)
    stand_in = StandIn(options.dir, options.name, (host, int(port)),
                       (plain_host, int(plain_port)))
    print(f"serving {', '.join(options.name)} on https://{options.listen} and "
          f"http://{options.plain}; CA: {stand_in.ca}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        stand_in.close()


if __name__ == "__main__":
    main()
