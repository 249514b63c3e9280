"""The shell commands the end-to-end user flow runs, spelled exactly as README.md shows them.

``test_user_flow.py`` runs each of these literally (``shlex.split``, no shell) from the
repository root, with ``KUBECONFIG`` pointing at a kubeconfig whose context namespace is the
test's own, and asserts that it ran every one; ``test_readme.py`` imports the list and fails
when README.md shows a command that neither this flow, ``make demo``, the Makefile nor
another test runs.
"""

from __future__ import annotations

from typing import Final

from tests.support.kube import GET_COLUMNS

RELEASE: Final = "gpujob"
SYSTEM_NS: Final = "gpujob-system"
JOB: Final = "cpu-example"
SAMPLE: Final = "crds/samples/cpu-2x2-example.yaml"
CRD_NAME: Final = "gputrainingjobs.gpujob.dev"
HEADER: Final = GET_COLUMNS

# The chart, as on any cluster: the node agent runs its Deployment's pod like a kubelet.
HELM_INSTALL: Final = (
    f"helm install {RELEASE} charts/gpujob --namespace {SYSTEM_NS} --create-namespace"
)
OPERATOR_ROLLOUT: Final = (
    f"kubectl -n {SYSTEM_NS} rollout status deployment/{RELEASE} --timeout=180s"
)
OPERATOR_LOGS: Final = f"kubectl -n {SYSTEM_NS} logs deployment/{RELEASE}"
HELM_MANIFEST: Final = f"helm get manifest {RELEASE} --namespace {SYSTEM_NS}"
CRD_ESTABLISHED: Final = f"kubectl wait --for=condition=Established crd/{CRD_NAME} --timeout=60s"
EXPLAIN: Final = "kubectl explain gputrainingjob.spec.monitoring"
APPLY: Final = f"kubectl apply -f {SAMPLE}"
GET: Final = "kubectl get gputrainingjobs"
WATCH: Final = "kubectl get gputrainingjobs --watch"
WIDE: Final = "kubectl get gtj -o wide"
PODS: Final = f"kubectl get pods -l gpujob.dev/job-name={JOB} -o wide"
DESCRIBE: Final = f"kubectl describe gputrainingjob {JOB}"
STATUS_YAML: Final = f"kubectl get gputrainingjob {JOB} -o yaml"
EVENTS: Final = f"kubectl get events --field-selector involvedObject.name={JOB}"
RANK_LOGS: Final = f"kubectl logs {JOB}-node-0 --tail 5"
DIAGNOSE_HELP: Final = "gpujob diagnose --help"
DELETE_JOB: Final = f"kubectl delete gputrainingjob {JOB}"
HELM_UNINSTALL: Final = f"helm uninstall {RELEASE} --namespace {SYSTEM_NS}"
GET_CRD: Final = f"kubectl get crd {CRD_NAME}"
DELETE_SYSTEM_NS: Final = f"kubectl delete namespace {SYSTEM_NS}"
DELETE_CRD: Final = f"kubectl delete crd {CRD_NAME}"

E2E_COMMANDS: Final = (
    HELM_INSTALL,
    HELM_MANIFEST,
    CRD_ESTABLISHED,
    OPERATOR_ROLLOUT,
    EXPLAIN,
    APPLY,
    GET,
    WATCH,
    WIDE,
    PODS,
    DESCRIBE,
    STATUS_YAML,
    EVENTS,
    RANK_LOGS,
    DIAGNOSE_HELP,
    DELETE_JOB,
    OPERATOR_LOGS,
    HELM_UNINSTALL,
    GET_CRD,
    DELETE_SYSTEM_NS,
    DELETE_CRD,
)
"""Every command the user flow runs, in order; the flow asserts it ran exactly these."""
