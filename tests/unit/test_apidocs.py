"""The committed API reference matches the model."""

from __future__ import annotations

from gpujob_operator import apidocs, crd


def test_api_reference_is_current() -> None:
    committed = (crd.repo_root() / apidocs.DOC_PATH).read_text()
    assert committed == apidocs.render(), (
        "docs/api.md drifted: run python -m gpujob_operator.apidocs"
    )


def test_reference_covers_every_run_policy_field() -> None:
    text = apidocs.render()
    for field in (
        "backoffLimit",
        "retryableExitCodes",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
        "cleanPodPolicy",
        "suspend",
        "restartOnStall",
    ):
        assert f"`spec.runPolicy.{field}`" in text
    assert "`status.progress.etaSeconds`" in text and "`status.bottleneck.verdict`" in text
