"""Run Kueue's manager against the local control plane, its webhooks served on loopback.

The manager is built from its Go module by ``hack/build-kueue.sh`` (cached by version, like
the control plane). No image, Service or cert-manager is involved:

* Kueue's CRDs come from the module (``config/components/crd/bases``);
* its webhook server listens on 127.0.0.1 with a certificate the local CA issues for
  ``IP:127.0.0.1``, and the webhook configurations point at it through
  ``clientConfig.url`` with that CA as ``caBundle``. Only the webhooks of Kueue's own API
  (Workloads, queues, flavors) are registered: gpujob is an external framework (the
  operator creates and watches its jobs' Workloads), so no pod or batch webhook sits in
  the way of other tests' pods;
* Kueue reads its metrics certificate from the fixed path ``/etc/kueue/metrics/certs``
  when it does not manage certificates itself; the manager runs in a private mount
  namespace whose ``/etc`` is an overlay, so that path exists for it alone and the host's
  ``/etc`` is untouched.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpujob_localcluster.controlplane import ControlPlane
from gpujob_localcluster.ports import free_port
from gpujob_localcluster.processes import ClusterError, http_ok, wait_for
from gpujob_localcluster.tools import REPO_ROOT

log = logging.getLogger("gpujob.localcluster")

KUEUE_VERSION = os.environ.get("KUEUE_VERSION", "v0.17.0")
NAMESPACE = "kueue-system"
EXTERNAL_FRAMEWORK = "GPUTrainingJob.v1alpha1.gpujob.dev"
"""How Kueue's Configuration names a job kind whose Workloads an external controller owns."""
METRICS_CERT_DIR = "/etc/kueue/metrics/certs"


class KueueUnavailable(ClusterError):
    """Kueue could not be built or did not start; the message says why."""


def kueue_dir() -> Path:
    """The folder of the built manager, CRDs and webhook manifests (building it if needed)."""
    env = os.environ.get("GPUJOB_KUEUE_DIR")
    if env:
        return Path(env)
    script = REPO_ROOT / "hack" / "build-kueue.sh"
    res = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "KUEUE_VERSION": KUEUE_VERSION},
    )
    if res.returncode != 0:
        raise KueueUnavailable(
            f"hack/build-kueue.sh failed ({res.returncode}):\n{res.stderr[-3000:]}"
        )
    return Path(res.stdout.strip().splitlines()[-1])


def webhook_configurations(manifests: str, base_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations for its own API, pointed at ``base_url`` (pure).

    Every webhook that serves a kueue.x-k8s.io resource is kept with
    ``clientConfig: {url: base_url + path, caBundle}``; the job-type webhooks (pods, Jobs,
    JobSets, ...) are dropped.
    """
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if "kueue-x-k8s-io" not in path:
                continue
            hook = dict(hook, clientConfig={"url": base_url + path, "caBundle": bundle})
            hooks.append(hook)
        doc["metadata"] = {"name": f"kueue-{doc['metadata']['name']}"}
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def manager_config(webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration: loopback only, gpujob as an external framework (pure)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
    }


@dataclass
class Kueue:
    """Kueue's manager as one more component of a :class:`ControlPlane`."""

    cp: ControlPlane

    def start(self, timeout: float = 180.0) -> Kueue:
        src = kueue_dir()
        folder = self.cp.folder / "kueue"
        folder.mkdir(parents=True, exist_ok=True)
        cp = self.cp
        res = cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(src / "crd"))
        if res.returncode != 0:
            raise KueueUnavailable(f"applying Kueue's CRDs failed: {res.stderr.strip()}")
        res = cp.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        if res.returncode != 0:
            raise KueueUnavailable(f"Kueue's CRDs not Established: {res.stderr.strip()}")
        cp.kubectl("create", "namespace", NAMESPACE)

        ident = cp.pki.issue("kueue-webhook", "kueue-webhook", sans=("IP:127.0.0.1",))
        cert_dir = folder / "certs"
        cert_dir.mkdir(exist_ok=True)
        shutil.copy(ident.cert, cert_dir / "tls.crt")
        shutil.copy(ident.key, cert_dir / "tls.key")
        webhook_port, health_port = free_port(), free_port()
        config = folder / "config.yaml"
        config.write_text(yaml.safe_dump(manager_config(webhook_port, health_port, cert_dir)))
        upper, work = folder / "etc-upper", folder / "etc-work"
        for d in (upper, work):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
        script = (
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
            f" && mkdir -p {METRICS_CERT_DIR} && cp {cert_dir}/tls.* {METRICS_CERT_DIR}/"
            f' && exec "$0" "$@"'
        )
        manager = str(src / "kueue")
        args = [
            "unshare", "-m", "--propagation", "private", "sh", "-c", script, manager,
            f"--config={config}", "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=2",
        ]  # fmt: skip
        comp = cp._spawn("kueue", args, env={"KUBECONFIG": str(cp.admin_kubeconfig)})
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{health_port}/readyz"),
            timeout,
            "kueue manager /readyz",
            comp.problem,
        )
        hooks = webhook_configurations(
            (src / "webhook" / "manifests.yaml").read_text(),
            f"https://127.0.0.1:{webhook_port}",
            cp.pki.ca_cert.read_bytes(),
        )
        res = cp.kubectl("apply", "-f", "-", input="---\n".join(yaml.safe_dump(h) for h in hooks))
        if res.returncode != 0:
            raise KueueUnavailable(f"registering Kueue's webhooks failed: {res.stderr.strip()}")
        log.info("kueue %s ready; webhooks on 127.0.0.1:%d", KUEUE_VERSION, webhook_port)
        return self
