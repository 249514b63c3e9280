"""Certificates and keys for a throwaway local control plane, made with the openssl CLI.

EC keys keep generation fast. Every identity gets a client certificate signed by one
CA: the API server's client-CA authenticator maps CN to the user and O to groups,
which is exactly what RBAC's bootstrap bindings expect for the components.
:func:`kubeconfig` hands one identity (or a bearer token) to a client.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

API_SERVER_SANS = (
    "IP:127.0.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
    "IP:10.96.0.1",
)


@dataclass(frozen=True)
class Identity:
    """A client certificate and its key."""

    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is required to make the local cluster's certificates")
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ec_key(path: Path) -> None:
    _openssl(
        "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(path), cwd=path.parent
    )


class Pki:
    """A CA in ``folder`` that issues serving and client certificates."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca_cert = folder / "ca.crt"
        self.ca_key = folder / "ca.key"
        if not self.ca_cert.exists():
            _ec_key(self.ca_key)
            _openssl(
                "req",
                "-x509",
                "-new",
                "-key",
                str(self.ca_key),
                "-out",
                str(self.ca_cert),
                "-days",
                "3650",
                "-subj",
                "/CN=gpujob-local-ca",
                cwd=folder,
            )

    def issue(
        self, name: str, cn: str, orgs: tuple[str, ...] = (), sans: tuple[str, ...] = ()
    ) -> Identity:
        """Issue a certificate for ``cn`` in groups ``orgs`` (client) or with ``sans`` (server).

        A certificate already in the folder is reused only when it was issued for the same
        subject and names: a restarted cluster that picks new node addresses gets a serving
        certificate for them, not the first start's (which the API server would refuse).
        """
        key = self.folder / f"{name}.key"
        cert = self.folder / f"{name}.crt"
        issued_for = self.folder / f"{name}.for"
        subject = "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"
        wanted = "\n".join((subject, *sans)) + "\n"
        if cert.exists() and issued_for.exists() and issued_for.read_text() == wanted:
            return Identity(cert, key)
        csr = self.folder / f"{name}.csr"
        ext = self.folder / f"{name}.ext"
        _ec_key(key)
        _openssl(
            "req", "-new", "-key", str(key), "-out", str(csr), "-subj", subject, cwd=self.folder
        )
        lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment"]
        lines.append("extendedKeyUsage=serverAuth" if sans else "extendedKeyUsage=clientAuth")
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        ext.write_text("\n".join(lines) + "\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(self.ca_cert),
            "-CAkey",
            str(self.ca_key),
            "-CAcreateserial",
            "-out",
            str(cert),
            "-days",
            "3650",
            "-extfile",
            str(ext),
            cwd=self.folder,
        )
        csr.unlink()
        ext.unlink()
        issued_for.write_text(wanted)
        return Identity(cert, key)

    def service_account_keys(self) -> tuple[Path, Path]:
        """The key pair that signs and verifies service-account tokens."""
        key = self.folder / "sa.key"
        pub = self.folder / "sa.pub"
        if not key.exists():
            _ec_key(key)
            _openssl("ec", "-in", str(key), "-pubout", "-out", str(pub), cwd=self.folder)
        return key, pub


def kubeconfig(
    server: str,
    ca: Path,
    user: str,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> dict:
    """A kubeconfig dict for one user; either a client certificate or a bearer token."""
    creds: dict[str, str] = {}
    if token is not None:
        creds["token"] = token
    if cert is not None and key is not None:
        creds["client-certificate"] = str(cert)
        creds["client-key"] = str(key)
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
