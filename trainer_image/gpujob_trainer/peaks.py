"""Dense peak FLOP/s per GPU product and training precision: the denominator of MFU.

Model FLOPs utilisation is the model FLOP/s a rank achieves divided by what its GPU could do
at the precision its matmuls run in, so every rank needs that peak. The figures are dense
(no 2:4 structured sparsity): NVIDIA's datasheets print the sparse figure for most tensor
rows, and every MFU in the literature and in the training libraries is quoted against the
dense one, so a sparse denominator would halve our MFU next to everyone else's. A product
that is missing here, or a part clocked differently from its datasheet, can be given its
peak per job with `spec.monitoring.peakTFLOPSPerGPU`, which `lookup` takes as an override.

Plain data and string matching only: importing this module never imports torch or NVML.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpujob_trainer import contract

TERA = 1e12


@dataclass(frozen=True)
class Peak:
    """One table row: a GPU product and its dense peak FLOP/s per training precision."""

    product: str
    """Short name of the product (`H100 SXM`), what `product()` answers."""
    match: tuple[str, ...]
    """Tokens that must all appear in the normalised device name (see `tokens`)."""
    flops: Mapping[str, float]
    """Dense peak FLOP/s by precision: `bf16`, `fp16`, `tf32`, `fp32`; never `fp8`."""


def _row(product: str, match: str, bf16: float, tf32: float, fp32: float) -> Peak:
    """A row from TFLOP/s figures; FP16 and BF16 run at the same tensor rate on all of these."""
    flops = {"bf16": bf16 * TERA, "fp16": bf16 * TERA, "tf32": tf32 * TERA, "fp32": fp32 * TERA}
    return Peak(product, tuple(match.split()), MappingProxyType(flops))


# Dense TFLOP/s: BF16/FP16 tensor, TF32 tensor, FP32 (CUDA cores, no tensor cores). Where a
# datasheet prints only the sparse figure (marked *), the row holds half of it.
#
# Rows are tried in order and the first whose tokens all appear in the name wins, so a
# variant comes before the row that holds the family's remaining names: "H100 NVL" and
# "H100 PCIe" before "H100 SXM", which also takes "NVIDIA H100 80GB HBM3". Names are split
# into whole tokens, so "h20" never matches "H200", "a10" never matches "A100" or "A10G", and
# "h200" never matches "GH200".
#
# Left out on purpose (they report `unknown_device`; give the job an override):
# - A10G (AWS G5): NVIDIA publishes no datasheet for it; the tensor rates quoted for it differ
#   from the A10's and from each other, and a guessed denominator is a wrong MFU that looks
#   right.
# - GB200, B100, B300, H800, A800: not needed yet; each has its own figures.
PEAKS: tuple[Peak, ...] = (
    # NVIDIA HGX B200 specifications (HGX platform page), per-GPU figures at 1,000 W: 4.5 PF*
    # FP16/BF16, 2.2 PF* TF32, 75 TF FP32. The 80 TF FP32 seen elsewhere is the 1,200 W B200
    # of GB200 NVL72 in the same table; an HGX/DGX B200 node is the 1,000 W part.
    _row("B200", "b200", 2250.0, 1100.0, 75.0),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: the same Hopper GPU, SMs and clocks as
    # H100 SXM, so the H100 SXM figures (the datasheet prints them rounded: 990 / 494 / 67).
    _row("GH200", "gh200", 989.4, 494.7, 66.9),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column: 1,671* BF16, 835* TF32, 60 FP32.
    _row("H200 NVL", "h200 nvl", 835.5, 417.5, 60.0),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: 1,979* BF16, 989* TF32, 67
    # FP32; H200 is the H100 SXM GPU with more memory, so the H100 SXM figures below.
    _row("H200 SXM", "h200", 989.4, 494.7, 66.9),
    # NVIDIA HGX H20 product brief (a China-market part, absent from the public datasheet
    # pages): 148 BF16/FP16, 74 TF32, 44 FP32, all dense.
    _row("H20", "h20", 148.0, 74.0, 44.0),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column (per GPU): 1,671* BF16, 835*
    # TF32, 60 FP32.
    _row("H100 NVL", "h100 nvl", 835.5, 417.5, 60.0),
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 PCIe column (dense figures):
    # 756.5 BF16, 378 TF32, 51.2 FP32.
    _row("H100 PCIe", "h100 pcie", 756.5, 378.0, 51.2),
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5 column (dense figures):
    # 989.4 BF16, 494.7 TF32, 66.9 FP32 (the datasheet rounds them: 1,979* / 989* / 67).
    _row("H100 SXM", "h100", 989.4, 494.7, 66.9),
    # NVIDIA A100 Tensor Core GPU datasheet: 312 BF16/FP16, 156 TF32, 19.5 FP32, the same for
    # the 40 GB and 80 GB parts and for PCIe and SXM ("A100-PCIE-40GB", "A100 80GB PCIe").
    _row("A100 PCIe", "a100 pcie", 312.0, 156.0, 19.5),
    # NVIDIA A100 Tensor Core GPU datasheet, as above ("A100-SXM4-80GB", "A100-SXM4-40GB").
    _row("A100 SXM", "a100", 312.0, 156.0, 19.5),
    # NVIDIA L40S GPU datasheet: 733* BF16/FP16 (362.05 dense), 366* TF32, 91.6 FP32.
    _row("L40S", "l40s", 362.05, 183.0, 91.6),
    # NVIDIA L40 GPU datasheet: 362.1* BF16/FP16 (181.05 dense), 181* TF32, 90.5 FP32.
    _row("L40", "l40", 181.05, 90.5, 90.5),
    # NVIDIA L4 Tensor Core GPU datasheet: 242* BF16/FP16, 120* TF32, 30.3 FP32.
    _row("L4", "l4", 121.0, 60.0, 30.3),
    # NVIDIA A10 Tensor Core GPU datasheet: 125 BF16/FP16 (250*), 62.5 TF32 (125*), 31.2 FP32.
    _row("A10", "a10", 125.0, 62.5, 31.2),
)

_NOT_ALNUM = re.compile(r"[^a-z0-9]+")


def tokens(device_name: str) -> frozenset[str]:
    """The device name lower-cased and split at every run of characters that are not letters
    or digits: "NVIDIA A100-SXM4-80GB" and "nvidia a100 sxm4 80gb" give the same tokens."""
    return frozenset(_NOT_ALNUM.split(device_name.lower())) - {""}


def find(device_name: str | None) -> Peak | None:
    """The table row for a device name as NVML or CUDA spells it, or None.

    A MIG instance ("NVIDIA A100-SXM4-40GB MIG 1g.5gb") gets None: it has a fraction of the
    GPU's SMs, so the whole GPU's peak would understate its MFU.
    """
    if not device_name:
        return None
    have = tokens(device_name)
    if "mig" in have:
        return None
    for peak in PEAKS:
        if have.issuperset(peak.match):
            return peak
    return None


def product(device_name: str | None) -> str | None:
    """The table row's short name for a device name ("H100 SXM", "H200 NVL"), or None."""
    peak = find(device_name)
    return peak.product if peak is not None else None


def lookup(
    device_name: str | None, dtype: str, override_tflops: float | None = None
) -> tuple[float | None, str]:
    """Dense peak FLOP/s of a GPU at a training precision, and why it is missing if it is.

    Returns (FLOP/s, `contract.PEAK_OK`), or (None, reason) with reason one of
    `contract.PEAK_NO_GPU` (no device name: the rank trains on CPU),
    `contract.PEAK_FP8` and `contract.PEAK_UNKNOWN_DEVICE`, checked in that order.

    FP8 gets no peak, override or not: FP8 training recipes keep parts of the model
    (attention, normalisation, the first and last layers, often the weight gradients) in
    BF16, so neither the FP8 nor the BF16 rate is an honest denominator for the whole step.

    `override_tflops` (the job's `spec.monitoring.peakTFLOPSPerGPU`, in TFLOP/s) replaces the
    table for every device and precision but FP8, known device or not.

    Raises ValueError for a precision outside `contract.PEAK_DTYPES`, or an override that is
    not a finite number above 0.
    """
    if dtype not in contract.PEAK_DTYPES:
        raise ValueError(f"unknown precision {dtype!r}; expected one of {contract.PEAK_DTYPES}")
    if override_tflops is not None and not (math.isfinite(override_tflops) and override_tflops > 0):
        raise ValueError(f"peak TFLOP/s override must be above 0, got {override_tflops!r}")
    if not device_name or not device_name.strip():
        return None, contract.PEAK_NO_GPU
    if dtype == "fp8":
        return None, contract.PEAK_FP8
    if override_tflops is not None:
        return override_tflops * TERA, contract.PEAK_OK
    peak = find(device_name)
    if peak is None:
        return None, contract.PEAK_UNKNOWN_DEVICE
    return peak.flops[dtype], contract.PEAK_OK


def _bare(torch_dtype: str) -> str:
    """ "torch.bfloat16" -> "bfloat16"; a bare name stays as it is."""
    name = torch_dtype.strip().lower()
    return name.removeprefix("torch.")


def dtype_of(param_dtype: str, autocast_dtype: str | None, tf32: bool) -> str:
    """The precision the matmuls run in (one of `contract.PEAK_DTYPES`), from dtype names as
    `str(torch.dtype)` spells them ("torch.bfloat16"; the "torch." prefix is optional).

    An autocast dtype of bfloat16 or float16 wins. Otherwise the parameters' dtype decides:
    bfloat16 -> bf16, float16 -> fp16, any float8 -> fp8, float32 -> tf32 when TF32 matmuls
    are allowed (`torch.backends.cuda.matmul.allow_tf32`) else fp32, and anything else
    (float64, …) -> fp32, the nearest peak the table has.
    """
    if autocast_dtype:
        low = _bare(autocast_dtype)
        if low == "bfloat16":
            return "bf16"
        if low in ("float16", "half"):
            return "fp16"
    name = _bare(param_dtype)
    if name == "bfloat16":
        return "bf16"
    if name in ("float16", "half"):
        return "fp16"
    if name.startswith("float8"):
        return "fp8"
    if name in ("float32", "float"):
        return "tf32" if tf32 else "fp32"
    return "fp32"
