"""OAuth test parts: a client metadata document served over https from another loopback
port (a real TLS server with a test CA, trustme), and PKCE."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import secrets
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme


@dataclass
class DocumentServer:
    """Serves JSON documents by path over https on 127.0.0.1 (`documents` may change)."""

    port: int
    ca_file: Path
    documents: dict[str, Any] = field(default_factory=dict)
    fetched: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def client(self, path: str, redirect_uris: list[str], name: str = "Test Client") -> str:
        """Publish a client metadata document at `path`; its URL (the client_id)."""
        client_id = self.url(path)
        self.documents[path] = {
            "client_id": client_id,
            "client_name": name,
            "client_uri": self.url("/"),
            "redirect_uris": redirect_uris,
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }
        return client_id


@contextmanager
def document_server(tmp: Path) -> Iterator[DocumentServer]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    ca_file = tmp / "test-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server_box: dict[str, DocumentServer] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            docs = server_box["s"]
            docs.fetched.append(self.path)
            document = docs.documents.get(self.path)
            if isinstance(document, dict) and "$redirect" in document:  # a 302 elsewhere
                self.send_response(302)
                self.send_header("Location", str(document["$redirect"]))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps(document).encode() if document is not None else b"{}"
            self.send_response(200 if document is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    server_box["s"] = DocumentServer(port=httpd.server_address[1], ca_file=ca_file)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_box["s"]
    finally:
        httpd.shutdown()
        httpd.server_close()


def pkce() -> tuple[str, str]:
    """A code verifier and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
