"""Model FLOPs of a rank's training, and the peak they are measured against (MFU).

MFU is the model's FLOPs per second over the GPU's dense peak. The numerator comes from
one counted training pass: `torch.utils.flop_counter.FlopCounterMode` over the third
training forward and its backward (the first ones may build lazy modules or caches),
divided by that batch's samples; or from the user (`flops_per_sample`, `flops_per_token`),
which wins. The exported counter is that count times the samples (tokens) trained, so
gradient accumulation and a varying batch need nothing more. The counted step runs slower
(every op goes through a Python dispatch mode once); it falls in the warm-up the operator
never judges. Optimizer FLOPs are not model FLOPs and are not counted, as every library
that prints MFU does.

The denominator is `peaks.lookup` for the device's product name and the precision the
matmuls run in (autocast's, else the parameters', TF32 when allowed).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Final

from gpujob_trainer import contract, peaks
from gpujob_trainer.snapshot import Peak

log = logging.getLogger("gpujob_trainer")

MEASURE_AT: Final = 3
"""The training forward whose FLOPs are counted and whose precision is read (1-based;
forwards under no_grad or inside evaluating() do not count)."""


def cuda_uuid(index: int) -> str:
    """The NVML-style UUID (`GPU-…`) of a CUDA device, as the NVML series label it."""
    import torch

    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def cuda_name(index: int) -> str | None:
    """The product name of a CUDA device (the name NVML reports); None when CUDA cannot
    name it (telemetry never stops training)."""
    try:
        import torch

        return str(torch.cuda.get_device_name(index))
    except Exception:
        return None


def _batch(args: Any, kwargs: Any) -> int:
    """Samples in a forward's input: its first argument, else its first keyword argument
    (`model(**batch)`, `model(input_ids=...)`)."""
    from gpujob_trainer.hooks import batch_size

    first = args[0] if args else next(iter(kwargs.values()), None) if kwargs else None
    try:
        return max(1, batch_size(first)) if first is not None else 1
    except Exception:
        return 1


class FlopsCount:
    """What a rank knows of its FLOPs: given, counted once, or not (yet)."""

    def __init__(
        self,
        *,
        per_sample: float | None = None,
        per_token: float | None = None,
        measure: bool = True,
        peak_tflops: float | None = None,
    ) -> None:
        self.per_sample = per_sample
        self.per_token = per_token
        self.per_pass: float | None = None
        """FLOPs of the counted forward and backward (used when no samples are counted)."""
        self._measure = measure and per_sample is None and per_token is None
        self._override = peak_tflops if peak_tflops and peak_tflops > 0 else None
        self._batch = 1
        self._device: str | None = None
        self._param_dtype = "torch.float32"
        self._dtype: str | None = None
        """The precision seen while counting (autocast's, else the parameters')."""
        self._cuda = False
        self._peaks: dict[tuple[str | None, str], Peak] = {}
        self._warned = False

    def given(self, *, per_sample: float | None, per_token: float | None) -> None:
        self.per_sample, self.per_token = per_sample, per_token
        self._measure = False

    def refuse(self, why: str) -> None:
        """No count can be trusted here (said once); a given figure still counts."""
        if self._measure:
            self._measure = False
            log.warning("gpujob: model FLOPs not counted, so no MFU: %s", why)

    def note_device(self, name: str | None) -> None:
        """The product name of the rank's (first) GPU; None on CPU."""
        self._device = name
        self._cuda = name is not None

    def note_params(self, dtype: str) -> None:
        self._param_dtype = dtype

    def begin(self, args: Any, kwargs: Any) -> Any:
        """Read the training precision from this forward's context (autocast) and, unless
        the FLOPs were given, open a counter around it and the backward that follows."""
        try:
            import torch

            self._dtype = self._precision(torch)
            if not self._measure:
                return None
            from torch.utils.flop_counter import FlopCounterMode

            mode = FlopCounterMode(display=False)
            mode.__enter__()
        except Exception as exc:  # an old torch, a mode conflict: no MFU, training goes on
            self._give_up(exc)
            return None
        self._batch = _batch(args, kwargs)
        return mode

    def end(self, mode: Any) -> None:
        try:
            mode.__exit__(None, None, None)
            counted = float(mode.get_total_flops())
        except Exception as exc:
            self._give_up(exc)
            tracker = getattr(mode, "mod_tracker", None)  # its module hooks must not stay
            try:
                if tracker is not None:
                    tracker.__exit__(None, None, None)
            except Exception:
                pass
            return
        if counted > 0 and self.per_sample is None and self.per_token is None:
            self.per_pass = counted
            self.per_sample = counted / self._batch
            log.info(
                "gpujob: model FLOPs %.3g per sample (%.3g per forward and backward of %d)",
                self.per_sample,
                counted,
                self._batch,
            )

    def _give_up(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            log.warning("gpujob: model FLOPs not counted, so no MFU: %s", exc)

    def _precision(self, torch: Any) -> str:
        kind = "cuda" if self._cuda else "cpu"
        autocast: str | None = None
        try:
            if torch.is_autocast_enabled(kind):
                autocast = str(torch.get_autocast_dtype(kind))
        except TypeError:  # a torch whose autocast calls take no device type
            if torch.is_autocast_enabled():
                autocast = str(torch.get_autocast_gpu_dtype())
        tf32 = bool(torch.backends.cuda.matmul.allow_tf32) or (
            torch.get_float32_matmul_precision() != "highest"
        )
        return peaks.dtype_of(self._param_dtype, autocast, tf32)

    def dtype(self) -> str:
        """The training precision: as seen while counting, else the parameters'."""
        if self._dtype is not None:
            return self._dtype
        tf32 = False
        torch = sys.modules.get("torch")
        if torch is not None and self._cuda:
            tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
        return peaks.dtype_of(self._param_dtype, None, tf32)

    def total(self, steps: int, samples: int, tokens: int | None) -> float | None:
        """Model FLOPs of the work done so far (None while unknown)."""
        if self.per_token is not None and tokens:
            return self.per_token * tokens
        if self.per_sample is not None and samples:
            return self.per_sample * samples
        if self.per_pass is not None:
            return self.per_pass * steps
        return None

    def peak(self) -> Peak:
        """The peak FLOP/s for this rank's GPU and precision, or why there is none."""
        dtype = self.dtype()
        key = (self._device, dtype)
        got = self._peaks.get(key)
        if got is None:
            if self._override is not None and dtype != "fp8":
                value, reason = self._override * 1e12, contract.PEAK_OK
            elif not self._device:
                value, reason = None, contract.PEAK_NO_GPU
            else:
                value, reason = peaks.lookup(self._device, dtype)
            got = self._peaks[key] = Peak(value, self._device or "", dtype, reason)
        return got
