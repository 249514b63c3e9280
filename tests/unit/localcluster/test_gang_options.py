"""The local cluster's gang options, pure parts: control-plane flags and Kueue's wiring."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from gpujob_localcluster.controlplane import GANG_RUNTIME_CONFIG, ControlPlane
from gpujob_localcluster.kueue import EXTERNAL_FRAMEWORK, manager_config, webhook_configurations

MANIFESTS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-kueue-x-k8s-io-v1beta2-workload}
  failurePolicy: Fail
  name: mworkload.kb.io
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  sideEffects: None
"""


def test_gang_option_enables_the_gate_in_every_component_and_both_api_versions() -> None:
    assert ControlPlane(Path("/x")).gates() == []
    assert ControlPlane(Path("/x"), gang_scheduling=True).gates() == [
        "--feature-gates",
        "GenericWorkload=true",
    ]
    assert "scheduling.k8s.io/v1beta1=true" in GANG_RUNTIME_CONFIG
    assert "scheduling.k8s.io/v1alpha3=true" in GANG_RUNTIME_CONFIG


def test_kueue_webhooks_point_at_loopback_with_the_local_ca_and_skip_pod_hooks() -> None:
    (mutating,) = webhook_configurations(MANIFESTS, "https://127.0.0.1:9443", b"CA")
    assert mutating["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    (hook,) = mutating["webhooks"]
    assert hook["name"] == "mworkload.kb.io"
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-kueue-x-k8s-io-v1beta2-workload",
        "caBundle": base64.b64encode(b"CA").decode(),
    }


def test_kueue_config_is_loopback_only_and_knows_gpujob_as_external_framework() -> None:
    cfg = manager_config(9443, 8081, Path("/certs"))
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": "/certs"}
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:8081"
    assert cfg["metrics"]["bindAddress"] == "0"
    assert cfg["integrations"]["externalFrameworks"] == [EXTERNAL_FRAMEWORK]
    assert EXTERNAL_FRAMEWORK == "GPUTrainingJob.v1alpha1.gpujob.dev"
    yaml.safe_dump(cfg)
