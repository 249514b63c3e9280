"""Prometheus alerting rules for gpujob, generated from code like the dashboards.

``python -m gpujob_operator.generate`` writes ``charts/gpujob/files/gpujob.rules.yaml``: a
plain rules file (``promtool check rules`` reads it; a Prometheus without the Prometheus
Operator can load it) whose ``groups`` the chart's PrometheusRule embeds verbatim, so both
forms are always the same rules. Each alert has a one-line ``summary`` and a runbook-style
``description``: what it means, how to look, what usually fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from gpujob_operator.observability import opfamilies
from gpujob_operator.observability.opfamilies import OPERATOR_JOB
from gpujob_trainer import contract

RULES_FILE: Final = Path("charts") / "gpujob" / "files" / "gpujob.rules.yaml"
JOB_KEY: Final = "namespace, job_name"
RUNNING: Final = (
    f'on ({JOB_KEY}) ({opfamilies.JOB_PHASE.name}{{phase="{opfamilies.PHASE_RUNNING}"}} == 1)'
)
"""Every verdict alert's gate: a verdict describes the running attempt, never a restarting,
suspended or finished job's (whatever series an older operator or a stale status left)."""
INSPECT = (
    "Inspect: kubectl -n {{ $labels.namespace }} describe gputrainingjob {{ $labels.job_name }}"
)


@dataclass(frozen=True)
class Alert:
    """One alerting rule."""

    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": " ".join(self.expr.split()),
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


JOB_ALERTS: Final = (
    Alert(
        "GPUJobStalled",
        f"(max by ({JOB_KEY}) ({opfamilies.JOB_STALLED.name}) == 1) and {RUNNING}",
        "2m",
        "warning",
        "GPUTrainingJob {{ $labels.namespace }}/{{ $labels.job_name }} stopped making progress.",
        "No rank finished an optimizer step for longer than the job's stall timeout "
        "(spec.monitoring.stallTimeoutSeconds, or k x the median step time; before the first "
        "step spec.monitoring.startupTimeoutSeconds) and no rank is busy (changing phase, or "
        "in a checkpoint or an evaluation for less than busyTimeoutSeconds). Usual causes: a "
        "rank that died or hangs in a collective (NCCL/gloo watchdog), a deadlocked DataLoader, "
        "a hung filesystem. " + INSPECT + " (status.bottleneck and the Stalled condition), then "
        "kubectl logs on each <job>-node-<i> pod; py-spy dump on a rank shows where it waits. "
        "Set spec.runPolicy.restartOnStall to restart the gang automatically.",
    ),
    Alert(
        "GPUJobFailed",
        f'{opfamilies.JOB_PHASE.name}{{phase="Failed"}} == 1',
        "0m",
        "warning",
        "GPUTrainingJob {{ $labels.namespace }}/{{ $labels.job_name }} failed.",
        "The job is in phase Failed: a rank failed more often than spec.runPolicy.backoffLimit "
        "allows, exited with a non-retryable code, or hit activeDeadlineSeconds. status.failure "
        "names the root-cause pod, exit code, reason (e.g. OOMKilled) and the last log lines. "
        + INSPECT
        + ". Fix the cause and create the job again (failed jobs are not retried). "
        "The alert clears when the job is deleted (ttlSecondsAfterFinished does it for you).",
    ),
    Alert(
        "GPUJobBottleneckPersisting",
        f'({opfamilies.JOB_VERDICT.name}{{verdict!~"Healthy|Stalled|ComputeBound"}} == 1) '
        f"and {RUNNING}",
        "30m",
        "info",
        "GPUTrainingJob {{ $labels.namespace }}/{{ $labels.job_name }} has been "
        "{{ $labels.verdict }} for 30 minutes.",
        "The operator's analysis has reported the same bottleneck for half an hour: the GPUs "
        "are paid for but wait. status.bottleneck holds the evidence and the advice: InputBound "
        "(more DataLoader workers, pin_memory, prefetch), TransferBound (pinned memory, "
        "non_blocking copies, prefetch to the GPU), CommunicationBound (bucket size, "
        "gradient accumulation with no_sync, network), Straggler (the named rank's node, GPU or "
        "rank-specific work in its step; status.bottleneck.breakdown splits each rank's step), "
        "CheckpointBound (async or sharded checkpoints, a longer interval), EvalBound (evaluate "
        "less often, on fewer batches), "
        "MemoryPressure (activation checkpointing, AMP, smaller micro-batch), Throttled (power "
        "cap, cooling), GPUUnderutilized (bigger batch, CUDA graphs, torch.compile), "
        "DataParallelImbalance (torchrun and DDP instead of nn.DataParallel). ComputeBound is "
        "left out: a job busy computing is what a healthy job looks like (its MFU says how "
        "efficiently). "
        + INSPECT
        + " and open the 'gpujob / Job' dashboard for the per-rank step time breakdown.",
    ),
    Alert(
        "GPUJobGPUsUnderutilized",
        f"avg by ({JOB_KEY}) (avg_over_time({contract.GPU_UTILIZATION.name}[15m])) < 0.5",
        "15m",
        "warning",
        "GPUs of GPUTrainingJob {{ $labels.namespace }}/{{ $labels.job_name }} are "
        "{{ $value | humanizePercentage }} busy.",
        "Mean NVML GPU utilization across the gang stayed below 50% for 15 minutes (from the "
        "ranks' own metrics). The verdict in status.bottleneck says why when the operator knows "
        "(input, communication, a straggler); otherwise the model is too small for the GPU: raise "
        "the batch size, use CUDA graphs / torch.compile, remove host synchronisations (.item(), "
        "printing tensors). " + INSPECT + ".",
    ),
    Alert(
        "GPUJobMetricsUnavailable",
        f"({opfamilies.JOB_METRICS_AVAILABLE.name} == 0) and {RUNNING}",
        "10m",
        "warning",
        "The operator cannot read the metrics of GPUTrainingJob {{ $labels.namespace }}/"
        "{{ $labels.job_name }}.",
        "The job runs but its ranks' /metrics endpoints do not answer the operator, so progress, "
        "ETA and bottleneck verdicts are unknown (MetricsAvailable=False says why). Check that "
        "the training script calls gpujob_trainer.init() (or serves the contract's metrics) on "
        "GPUJOB_METRICS_PORT + LOCAL_RANK, that spec.training.metricsPort matches, and that no "
        "NetworkPolicy blocks the operator from the pods. " + INSPECT + ".",
    ),
    Alert(
        "GPUJobHardwareFault",
        f"max by ({JOB_KEY}, node_rank, gpu, UUID) "
        f"(increase({contract.GPU_XID_ERRORS.name}[10m]) > 0 "
        f"or increase({contract.GPU_ECC_UNCORRECTED.name}[10m]) > 0)",
        "0m",
        "critical",
        "GPU {{ $labels.UUID }} of GPUTrainingJob {{ $labels.namespace }}/{{ $labels.job_name }} "
        "reports hardware errors.",
        "NVML reported a critical XID error or an uncorrected ECC error on this GPU in the last "
        "10 minutes. Such GPUs corrupt or crash training. Cordon and drain the node that runs "
        "node rank {{ $labels.node_rank }} of the job (kubectl get pod -o wide), have the GPU "
        "checked (nvidia-smi -q, dmesg for Xid), and restart the job elsewhere.",
    ),
)

OPERATOR_ALERTS: Final = (
    Alert(
        "GPUJobOperatorDown",
        f'absent(up{{job="{OPERATOR_JOB}"}} == 1)',
        "5m",
        "critical",
        "The gpujob operator is down or not scraped.",
        "Prometheus has no healthy target with job=" + OPERATOR_JOB + " for 5 minutes. While "
        "the operator is down, running pods keep training but nobody restarts failed gangs, "
        "creates new jobs' pods or updates progress. Check the operator Deployment (kubectl -n "
        "<release namespace> get deploy,pods -l app.kubernetes.io/name=gpujob), its logs and "
        "events, and that the ServiceMonitor selects the operator's metrics Service.",
    ),
    Alert(
        "GPUJobOperatorErrors",
        f'sum(rate({opfamilies.ERRORS.name}{{source="reconcile"}}[10m])) '
        f"/ sum(rate({opfamilies.RECONCILES.name}[10m])) > 0.1",
        "15m",
        "warning",
        "More than 10% of the gpujob operator's reconciles fail.",
        "Reconcile errors by reason are on the 'gpujob / Operator' dashboard. api_403 means the "
        "operator's RBAC lacks a permission (compare its Role/ClusterRole with the chart), "
        "api_409/api_422 a conflict or a refused object, timeout an overloaded API server. The "
        "operator's log has the stack traces.",
    ),
)


def groups() -> dict[str, Any]:
    """The rules file: one group for jobs, one for the operator."""
    return {
        "groups": [
            {"name": "gpujob.jobs", "rules": [a.rule() for a in JOB_ALERTS]},
            {"name": "gpujob.operator", "rules": [a.rule() for a in OPERATOR_ALERTS]},
        ]
    }


def render() -> str:
    header = "# Generated by python -m gpujob_operator.generate; do not edit.\n"
    return header + yaml.safe_dump(groups(), sort_keys=False, width=100, allow_unicode=True)


def artefacts() -> dict[Path, str]:
    """The committed rules file the chart's PrometheusRule embeds."""
    return {RULES_FILE: render()}
