"""A real SAML 2.0 identity provider on loopback: nanoidp, in a virtualenv of its own
(`make nanoidp`: a program the tests start, with pins of its own), started by the test."""

from __future__ import annotations

import base64
import html
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from lxml import etree

from tests.support.live import free_port, stop, wait_for_port
from tests.support.paths import ROOT

SAML = "urn:oasis:names:tc:SAML:2.0:assertion"
DSIG = "http://www.w3.org/2000/09/xmldsig#"
NANOIDP = ROOT / "var" / "nanoidp" / "bin" / "python"


@dataclass
class SamlIdp:
    url: str
    cert: str  # the signing certificate's base64 body

    @property
    def entity_id(self) -> str:
        return f"{self.url}/saml"

    @property
    def sso_url(self) -> str:
        return f"{self.url}/saml/sso"

    def provider_entry(self, pid: str = "nano", **more: Any) -> dict[str, Any]:
        return {
            "type": "saml",
            "id": pid,
            "name": "Nano SAML",
            "entity_id": self.entity_id,
            "sso_url": self.sso_url,
            "x509cert": self.cert,
            **more,
        }

    def sign_in(self, redirect: str, username: str, password: str) -> tuple[str, dict[str, str]]:
        """At the IdP, as `username`: the ACS URL and the form the browser would post."""
        with httpx.Client() as client:
            page = client.get(redirect)
            assert page.status_code == 200, page.text
            fields = dict(re.findall(r'name="([^"]+)"\s+value="([^"]*)"', page.text))
            fields = {k: html.unescape(v) for k, v in fields.items()}
            fields.update(username=username, password=password)
            answer = client.post(self.sso_url, data=fields)
            assert answer.status_code == 200, answer.text
        action = html.unescape(re.search(r'action="([^"]+)"', answer.text).group(1))  # type: ignore[union-attr]
        form = dict(re.findall(r'name="(SAMLResponse|RelayState)" value="([^"]*)"', answer.text))
        form = {k: html.unescape(v) for k, v in form.items()}
        form["SAMLResponse"] = signature_after_issuer(form["SAMLResponse"])
        return action, form


def signature_after_issuer(response_b64: str) -> str:
    """nanoidp appends the assertion's signature as its last child; SAML's schema puts it
    right after the Issuer (as Okta, Entra ID and Keycloak do), and python3-saml in strict
    mode refuses anything else. Moving it there changes no signed byte: the signature is
    over the assertion without itself (the enveloped-signature transform)."""
    root = etree.fromstring(base64.b64decode(response_b64))
    for assertion in root.iter(f"{{{SAML}}}Assertion"):
        signature = assertion.find(f"{{{DSIG}}}Signature")
        issuer = assertion.find(f"{{{SAML}}}Issuer")
        if signature is not None and issuer is not None:
            issuer.addnext(signature)
    return base64.b64encode(etree.tostring(root)).decode()


def write_config(directory: Path, port: int, users: dict[str, dict[str, Any]]) -> None:
    subprocess.run(
        [str(NANOIDP), "-m", "nanoidp", "init"], cwd=directory, check=True, capture_output=True
    )
    config = directory / "config"
    settings = yaml.safe_load((config / "settings.yaml").read_text())
    settings["server"] = {"host": "127.0.0.1", "port": port}
    settings["oauth"]["issuer"] = f"http://127.0.0.1:{port}"
    settings["saml"]["export_groups"] = True
    (config / "settings.yaml").write_text(yaml.safe_dump(settings))
    (config / "users.yaml").write_text(yaml.safe_dump({"config_version": 1, "users": users}))


@contextmanager
def saml_idp(directory: Path, users: dict[str, dict[str, Any]]) -> Iterator[SamlIdp]:
    if not NANOIDP.exists():
        pytest.skip("SAML tests need nanoidp in var/nanoidp: `make nanoidp`.")
    port = free_port()
    write_config(directory, port, users)
    log = directory / "nanoidp.log"
    proc = subprocess.Popen(
        [str(NANOIDP), "-m", "nanoidp", "--config", str(directory / "config"), "--port", str(port)],
        cwd=directory,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, proc, log)
        url = f"http://127.0.0.1:{port}"
        pem = httpx.get(f"{url}/saml/cert.pem").text
        body = "".join(line for line in pem.splitlines() if "CERTIFICATE" not in line)
        yield SamlIdp(url, body)
    finally:
        stop(proc)


def acs_path(action: str) -> str:
    return urlsplit(action).path
