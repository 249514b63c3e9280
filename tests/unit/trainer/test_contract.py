"""The metrics contract: Prometheus naming rules, and the import rules of gpujob_trainer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpujob_trainer import contract


def test_names_follow_prometheus_conventions() -> None:
    names = [m.name for m in contract.ALL_METRICS]
    assert len(names) == len(set(names))
    for m in contract.ALL_METRICS:
        assert m.name.startswith(
            ("gpujob_train_", "gpujob_gpu_", "gpujob_cuda_", "gpujob_profile_")
        ), m.name
        assert m.type in ("counter", "gauge", "histogram"), m.name  # never a summary
        assert m.name.endswith("_total") == (m.type == "counter"), m.name
        if m.unit:
            assert m.family.endswith("_" + m.unit), m.name
        assert len(set(m.labels)) == len(m.labels), m.name
        assert m.help.strip(), m.name


def test_required_metric_set() -> None:
    want = {
        "gpujob_train_steps_total": "counter",
        "gpujob_train_target_steps": "gauge",
        "gpujob_train_samples_total": "counter",
        "gpujob_train_tokens_total": "counter",
        "gpujob_train_epoch": "gauge",
        "gpujob_train_loss": "gauge",
        "gpujob_train_step_duration_seconds": "histogram",
        "gpujob_train_phase_seconds_total": "counter",
        "gpujob_train_compute_seconds_total": "counter",
        "gpujob_train_last_step_timestamp_seconds": "gauge",
        "gpujob_train_heartbeat_timestamp_seconds": "gauge",
        "gpujob_train_clock_timestamp_seconds": "gauge",
        "gpujob_train_current_phase": "gauge",
        "gpujob_train_start_step": "gauge",
        "gpujob_train_model_flops_total": "counter",
        "gpujob_train_peak_flops_per_second": "gauge",
        "gpujob_train_device_info": "gauge",
        "gpujob_gpu_utilization_ratio": "gauge",
        "gpujob_gpu_memory_used_bytes": "gauge",
        "gpujob_gpu_memory_total_bytes": "gauge",
        "gpujob_gpu_power_watts": "gauge",
        "gpujob_gpu_power_limit_watts": "gauge",
        "gpujob_gpu_temperature_celsius": "gauge",
        "gpujob_gpu_sm_clock_hertz": "gauge",
        "gpujob_gpu_clock_event_active": "gauge",
        "gpujob_gpu_xid_errors_total": "counter",
        "gpujob_gpu_ecc_uncorrected_errors_total": "counter",
        "gpujob_gpu_pcie_rx_bytes_per_second": "gauge",
        "gpujob_gpu_pcie_tx_bytes_per_second": "gauge",
        "gpujob_gpu_sm_active_ratio": "gauge",
        "gpujob_gpu_tensor_active_ratio": "gauge",
        "gpujob_gpu_profiling_available": "gauge",
        "gpujob_cuda_memory_reserved_bytes": "gauge",
        "gpujob_cuda_alloc_retries_total": "counter",
        "gpujob_cuda_ooms_total": "counter",
        "gpujob_gpu_telemetry_available": "gauge",
        "gpujob_profile_step_seconds": "gauge",
    }
    assert {m.name: m.type for m in contract.ALL_METRICS} == want


def test_labels() -> None:
    for m in contract.TRAIN_METRICS:
        assert m.labels[:3] == ("rank", "local_rank", "node_rank"), m.name
    assert contract.PHASE_SECONDS.labels[-1] == "phase"
    for m in contract.GPU_METRICS:
        assert {"gpu", "UUID"} <= set(m.labels), m.name
    assert contract.GPU_CLOCK_EVENT.labels[-1] == "reason"
    for m in contract.CUDA_METRICS:
        assert set(contract.RANK_LABELS) | {"UUID"} == set(m.labels), m.name
    assert contract.PROFILE_STEP_SECONDS.labels == (*contract.RANK_LABELS, "part")


def test_profile_names() -> None:
    """The names issue 41's trainer, operator and CLI share (docs of the contract)."""
    assert contract.PROFILE_PATH == "/debug/profile"
    assert contract.PROFILE_PATH.startswith(contract.DEBUG_PREFIX)  # the token guards it
    assert (contract.PROFILE_MAX_STEPS, contract.PROFILE_DEFAULT_STEPS) == (50, 5)
    assert contract.ENV_PROFILE_DIR == "GPUJOB_PROFILE_DIR"
    assert contract.PROFILE_PARTS == ("compute", "communication", "copy", "idle")


def test_phases_and_env() -> None:
    assert contract.PHASES == (
        "data_wait",
        "h2d",
        "forward",
        "backward",
        "optimizer",
        "comm_wait",
        "checkpoint",
        "eval",
        "other",
    )
    assert set(contract.BUSY_PHASES) == {"checkpoint", "eval"}
    assert set(contract.COMPUTE_PHASES) == {"forward", "backward", "optimizer"}
    assert contract.DEFAULT_METRICS_PORT == 9400
    assert contract.metrics_port(9400, 3) == 9403
    for name in ("GPUJOB_METRICS_PORT", "GPUJOB_TOTAL_STEPS", "RANK", "LOCAL_RANK"):
        assert name in contract.ENV_TRAINER
    assert set(contract.THROTTLE_REASONS) <= set(contract.CLOCK_EVENT_REASONS)
    assert list(contract.STEP_DURATION_BUCKETS) == sorted(contract.STEP_DURATION_BUCKETS)


def test_counter_family_name() -> None:
    assert contract.STEPS.family == "gpujob_train_steps"
    assert contract.EPOCH.family == "gpujob_train_epoch"


@pytest.mark.parametrize(
    "module", ["gpujob_trainer", "gpujob_trainer.contract", "gpujob_trainer.integrations"]
)
def test_import_is_light(module: str) -> None:
    """Importing the package (or the contract) loads no torch, NVML, HTTP client, operator or
    training framework (the integrations import theirs in their own modules)."""
    code = (
        f"import sys, {module}\n"
        "heavy = {'torch', 'pynvml', 'kopf', 'gpujob_operator', 'prometheus_client',"
        " 'transformers', 'lightning', 'pytorch_lightning'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
