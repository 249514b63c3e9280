"""A small kubelet stand-in: registers GPU nodes and runs bound pods as local processes.

Why: without a kubelet no pod ever runs, and a mock would not tell us whether the
operator's pods really launch a torchrun gang, or whether the chart's Deployment really
runs the operator. The real scheduler binds pods to the nodes registered here; this
agent runs each container's command with the pod's env, gives every pod its own
127.0.0.0/8 address (a ``hostNetwork`` pod its node's: every node has a loopback address
of its own), and reports status as a kubelet would.

What it does like a kubelet: env (downward API, ConfigMap/Secret refs, the
``KUBERNETES_SERVICE_*`` variables pointing at the loopback API server); volumes
(emptyDir, hostPath, configMap, secret, downwardAPI, projected, including the
``kube-api-access-*`` service-account token from the TokenRequest API, refreshed at 80%
of its lifetime); startup/liveness/readiness probes (httpGet, tcpSocket, exec) with the
Ready condition; ``restartPolicy`` Always/OnFailure with crash-loop back-off; init
containers one after another to completion before the regular containers (a failed one
fails the pod under ``restartPolicy: Never``, else it is retried), and native sidecars
(init containers with ``restartPolicy: Always``: the next starts once the sidecar is
started, they restart while the pod runs, count towards Ready, and are stopped last-first
once the regular containers are done, which alone decide the phase), reported in
``initContainerStatuses`` and the ``Initialized`` condition (:mod:`initorder`); the
``/containerLogs`` endpoint (``kubectl logs``, ``-f``, ``--previous``, ``-c <init>``) on
loopback TLS, one per node at its address. ``hostPort`` is not enforced (the scheduler's
NodePorts filter keeps such pods apart); a hostNetwork pod keeps a UTS namespace with the
pod's hostname rather than the node's. DRA: the agent is the driver ``gpu.gpujob.dev``
(one ResourceSlice per node, a DeviceClass) and gives containers their claims' devices in
``GPUJOB_DRA_DEVICES`` (:mod:`dra`).

Isolation per pod (when root and ``unshare`` exists): a mount and UTS namespace, so the
pod sees its own hostname, its volumes at their mount paths, and an /etc/hosts that maps
its headless-service peers' DNS names (``<hostname>.<subdomain>[.<ns>.svc.cluster.local]``)
to their addresses. The network namespace is shared with the host: processes that bind
0.0.0.0 on the same port in two pods collide, so pods bind their pod IP (the gpujob
trainer and the chart's operator do). Images are not pulled: see :mod:`images`.

This module is the ``python -m gpujob_localcluster.nodeagent`` command; the agent's loop
is :mod:`agent`, its nodes :mod:`nodes`, the pods' files :mod:`podfiles`, the container
runtime :mod:`containers`, the init order :mod:`initorder`, status and Events
:mod:`podstatus`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from kubernetes import config

from gpujob_localcluster import images
from gpujob_localcluster.agent import NodeAgent
from gpujob_localcluster.nodes import NodeShape

log = logging.getLogger("gpujob.nodeagent")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--node-prefix", default="gpu-node")
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--cpu", default="16")
    p.add_argument("--memory", default="64Gi")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--ready-file")
    p.add_argument(
        "--no-isolation", action="store_true", help="run pods without mount/UTS namespaces"
    )
    p.add_argument("--kubelet-cert", help="serving certificate of the kubelet API (kubectl logs)")
    p.add_argument("--kubelet-key", help="its key")
    p.add_argument("--client-ca", help="CA whose client certificates may call the kubelet API")
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="REPOSITORY=DOCKERFILE",
        help="map an image to the Dockerfile whose ENTRYPOINT/CMD it runs (repeatable)",
    )
    p.add_argument(
        "--node-ip",
        action="append",
        default=None,
        metavar="ADDRESS",
        help="each node's loopback address, in node order (default: 127.255.<random>.<i+1>)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    names = [f"{args.node_prefix}-{i}" for i in range(args.nodes)]
    tls = None
    if args.kubelet_cert and args.kubelet_key and args.client_ca:
        tls = (Path(args.kubelet_cert), Path(args.kubelet_key), Path(args.client_ca))
    extra = dict(item.split("=", 1) for item in args.image)
    agent = NodeAgent(
        api,
        names,
        NodeShape(args.gpus_per_node, args.cpu, args.memory),
        Path(args.state_dir),
        isolate=not args.no_isolation,
        kubelet_tls=tls,
        image_table=images.load_table(extra),
        node_ips=args.node_ip,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    agent.nodes.register()
    log.info(
        "nodes %s ready (pod isolation: %s, kubelet API: %s)",
        ", ".join(f"{n} at {ip}" for n, ip in agent.nodes.addresses.items()),
        agent.runtime.isolate,
        ", ".join(f"{s.host}:{s.port}" for s in agent.kubelets.values()) or "off",
    )
    if args.ready_file:
        Path(args.ready_file).write_text("ready\n")
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
