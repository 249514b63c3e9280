"""The local CA reissues a certificate whose names changed, and reuses one that did not."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpujob_localcluster.pki import Pki


def names_in(cert: Path) -> str:
    out = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-ext", "subjectAltName"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout


def test_a_serving_certificate_follows_the_addresses_it_is_asked_for(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    first = pki.issue("kubelet", "agent", sans=("IP:127.0.0.1", "IP:127.255.143.1"))
    issued = first.cert.read_bytes()
    assert (
        pki.issue("kubelet", "agent", sans=("IP:127.0.0.1", "IP:127.255.143.1")).cert.read_bytes()
        == issued
    )
    # A second start of the cluster picked other node addresses: the old certificate would
    # fail "x509: certificate is valid for ... not 127.255.119.1".
    again = pki.issue("kubelet", "agent", sans=("IP:127.0.0.1", "IP:127.255.119.1"))
    assert again.cert.read_bytes() != issued
    assert "127.255.119.1" in names_in(again.cert) and "127.255.143.1" not in names_in(again.cert)


def test_a_certificate_from_before_the_record_is_reissued(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    old = pki.issue("kubelet", "agent", sans=("IP:127.255.1.1",))
    (tmp_path / "kubelet.for").unlink()  # a folder written by an older version
    assert "127.255.2.1" in names_in(pki.issue("kubelet", "agent", sans=("IP:127.255.2.1",)).cert)
    assert old.cert.exists()
