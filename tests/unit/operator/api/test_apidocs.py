"""The API reference rendered from the model covers every field (test_generate compares the committed file)."""

from __future__ import annotations

from gpujob_operator.api import reference


def test_reference_covers_every_run_policy_field() -> None:
    text = reference.render()
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
