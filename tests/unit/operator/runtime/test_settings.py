"""The operator's settings: every GPUJOB_* variable read once, a bad one refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpujob_operator import api
from gpujob_operator.lifecycle import backoff
from gpujob_operator.runtime import faults, peers
from gpujob_operator.runtime.settings import Settings, SettingsError, from_env


def test_an_empty_environment_gives_the_documented_defaults() -> None:
    s = from_env({})
    assert s == Settings()
    assert s.standalone and s.default_gang == api.GANG_NONE and not s.kueue
    assert s.retry == backoff.RETRY and s.restart_backoff == backoff.Policy(10.0, 360.0)
    assert s.peering_lifetime == peers.DEFAULT_LIFETIME and s.fault_exit_at is None


def test_every_variable_is_read() -> None:
    s = from_env(
        {
            "GPUJOB_DEFAULT_GANG": "Kueue",
            "GPUJOB_KUEUE": "1",
            "GPUJOB_PEERING": "gpujob",
            "GPUJOB_PEERING_CLUSTERWIDE": "1",
            "GPUJOB_PEERING_LIFETIME": "20",
            "POD_ID": "gpujob-abc",
            "GPUJOB_SCRAPE_CONCURRENCY": "2",
            "GPUJOB_SCRAPE_TIMEOUT": "0.5",
            "GPUJOB_WATCH_SERVER_TIMEOUT": "60",
            "GPUJOB_WORKER_LIMIT": "7",
            "GPUJOB_RETRY_BASE_SECONDS": "0.25",
            "GPUJOB_RETRY_MAX_SECONDS": "4",
            "GPUJOB_RESTART_BACKOFF_BASE_SECONDS": "1",
            "GPUJOB_RESTART_BACKOFF_MAX_SECONDS": "2",
            "GPUJOB_GANG_GRACE_SECONDS": "3",
            "GPUJOB_LIVENESS": "http://127.0.0.1:9/healthz",
            "GPUJOB_OPERATOR_METRICS_PORT": "0",
            "GPUJOB_OPERATOR_METRICS_ADDR": "127.0.0.1",
            "GPUJOB_FAULT_EXIT_AT": faults.BETWEEN_POD_DELETES,
            "GPUJOB_FORECAST_INTERVAL": "2.5",
            "GPUJOB_GC_FREEZE_SECONDS": "0",
            "GPUJOB_GC_THAW_SECONDS": "90",
            "GPUJOB_WEBHOOK_PORT": "9443",
            "GPUJOB_WEBHOOK_ADDR": "127.0.0.1",
            "GPUJOB_WEBHOOK_CERT": "/tls/tls.crt",
            "GPUJOB_WEBHOOK_KEY": "/tls/tls.key",
            "GPUJOB_WEBHOOK_CA": "/tls/ca.crt",
            "GPUJOB_WEBHOOK_REGISTER": "gpujob-dev",
        }
    )
    assert s == Settings(
        default_gang="Kueue",
        kueue=True,
        peering="gpujob",
        peering_clusterwide=True,
        peering_lifetime=20,
        pod_id="gpujob-abc",
        scrape_concurrency=2,
        scrape_timeout=0.5,
        watch_server_timeout=60,
        worker_limit=7,
        retry=backoff.Policy(0.25, 4.0, backoff.RETRY_JITTER),
        restart_backoff=backoff.Policy(1.0, 2.0),
        gang_grace_seconds=3.0,
        liveness="http://127.0.0.1:9/healthz",
        metrics_port=0,
        metrics_addr="127.0.0.1",
        fault_exit_at=faults.BETWEEN_POD_DELETES,
        forecast_interval=2.5,
        gc_freeze_seconds=0.0,
        gc_thaw_seconds=90.0,
        webhook_port=9443,
        webhook_addr="127.0.0.1",
        webhook_cert="/tls/tls.crt",
        webhook_key="/tls/tls.key",
        webhook_ca="/tls/ca.crt",
        webhook_register="gpujob-dev",
    )
    assert not s.standalone and s.webhook


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("GPUJOB_DEFAULT_GANG", "native", "one of None, Native, Kueue"),
        ("GPUJOB_KUEUE", "yes", "0 or 1"),
        ("GPUJOB_SCRAPE_CONCURRENCY", "0", "an integer >= 1"),
        ("GPUJOB_SCRAPE_TIMEOUT", "nan", "a number of seconds > 0"),
        ("GPUJOB_RETRY_MAX_SECONDS", "nonsense", "a number of seconds >= 0"),
        ("GPUJOB_GANG_GRACE_SECONDS", "-1", "a number of seconds >= 0"),
        ("GPUJOB_FORECAST_INTERVAL", "inf", "a number of seconds >= 0"),
        ("GPUJOB_GC_FREEZE_SECONDS", "-5", "a number of seconds >= 0 (0: off)"),
        ("GPUJOB_GC_THAW_SECONDS", "0", "a number of seconds > 0"),
        ("GPUJOB_OPERATOR_METRICS_PORT", "70000", "a port 0..65535"),
        ("GPUJOB_FAULT_EXIT_AT", "somewhere", "one of after-status-write"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(name: str, value: str, says: str) -> None:
    with pytest.raises(SettingsError) as err:
        from_env({name: value})
    assert str(err.value).startswith(f"{name}={value!r}: must be {says}")


def test_a_webhook_port_needs_its_certificate_and_key() -> None:
    assert not from_env({}).webhook
    with pytest.raises(SettingsError, match="GPUJOB_WEBHOOK_PORT=9443: needs GPUJOB_WEBHOOK_CERT"):
        from_env({"GPUJOB_WEBHOOK_PORT": "9443", "GPUJOB_WEBHOOK_CERT": "/c"})
    with pytest.raises(SettingsError, match="GPUJOB_WEBHOOK_PORT='-1': must be a port"):
        from_env({"GPUJOB_WEBHOOK_PORT": "-1"})


def test_a_backoff_cap_below_its_base_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"GPUJOB_RETRY_MAX_SECONDS=0\.5 must be >= the base"):
        from_env({"GPUJOB_RETRY_BASE_SECONDS": "2", "GPUJOB_RETRY_MAX_SECONDS": "0.5"})


def test_blank_values_mean_unset() -> None:
    assert from_env({"GPUJOB_WORKER_LIMIT": " ", "GPUJOB_PEERING": ""}) == Settings()


def test_the_operator_refuses_to_start_with_a_bad_setting_and_says_why() -> None:
    """The process ends before kopf starts (no API server is needed to see it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOB_")}
    env["GPUJOB_DEFAULT_GANG"] = "gang"
    res = subprocess.run(
        [sys.executable, "-m", "gpujob_operator", "operator", "--metrics-port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        "gpujob operator: GPUJOB_DEFAULT_GANG='gang': must be one of None, Native, Kueue"
    )


def test_peering_variables_count_only_with_peering() -> None:
    """A standalone replica ignores them; with peering they are read and checked."""
    loose = {"GPUJOB_PEERING_LIFETIME": "3", "GPUJOB_PEERING_CLUSTERWIDE": "1"}
    assert from_env(loose) == Settings()
    with pytest.raises(SettingsError, match=r"GPUJOB_PEERING_LIFETIME='3': must be whole"):
        from_env({**loose, "GPUJOB_PEERING": "gpujob"})


def test_zero_means_no_backoff_and_no_grace_and_an_empty_liveness_means_none() -> None:
    s = from_env(
        {
            "GPUJOB_RESTART_BACKOFF_BASE_SECONDS": "0",
            "GPUJOB_RESTART_BACKOFF_MAX_SECONDS": "0",
            "GPUJOB_GANG_GRACE_SECONDS": "0",
            "GPUJOB_LIVENESS": "",
        }
    )
    assert s.restart_backoff == backoff.Policy(0.0, 0.0)
    assert s.gang_grace_seconds == 0.0 and s.liveness is None


def test_the_job_endpoint_guards_are_read_and_a_bad_one_refused(tmp_path: object) -> None:
    from pathlib import Path

    from gpujob_operator.lifecycle.endpoints import PolicySettings

    assert from_env({}).job_network_policy is None and from_env({}).endpoint_token_key is None
    peer = {"podSelector": {"matchLabels": {"app": "op"}}}
    s = from_env(
        {"GPUJOB_JOB_NETWORK_POLICY": json.dumps({"metricsFrom": [peer], "otherPortsOpen": False})}
    )
    assert s.job_network_policy == PolicySettings(metrics_from=(peer,), other_ports_open=False)
    for bad in ("{", "[]", '{"metricsFrom": {}}', '{"metricsFrom": [{}]}', '{"otherPortsOpen": 1}'):
        with pytest.raises(SettingsError, match="GPUJOB_JOB_NETWORK_POLICY"):
            from_env({"GPUJOB_JOB_NETWORK_POLICY": bad})

    key = Path(str(tmp_path)) / "key"
    key.write_bytes(b"0123456789abcdef0123456789abcdef\n")
    s = from_env({"GPUJOB_ENDPOINT_TOKEN_KEY_FILE": str(key)})
    assert s.endpoint_token_key == b"0123456789abcdef0123456789abcdef"
    key.write_bytes(b"short")
    with pytest.raises(SettingsError, match="at least 32 bytes"):
        from_env({"GPUJOB_ENDPOINT_TOKEN_KEY_FILE": str(key)})
    with pytest.raises(SettingsError, match="cannot be read"):
        from_env({"GPUJOB_ENDPOINT_TOKEN_KEY_FILE": str(key) + ".missing"})


def test_the_host_port_range_is_read_inclusive_and_checked() -> None:
    assert from_env({}).host_port_range == (20000, 30000)
    assert from_env({"GPUJOB_HOST_PORT_RANGE": "40000-40999"}).host_port_range == (40000, 41000)
    for bad in ("9100", "500-900", "3000-2000", "a-b", "40000-70000"):
        with pytest.raises(SettingsError, match="GPUJOB_HOST_PORT_RANGE"):
            from_env({"GPUJOB_HOST_PORT_RANGE": bad})
