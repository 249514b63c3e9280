"""The dense peak table: which row a device name finds, and the peak and reason it gets."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpujob_trainer import contract, peaks

T = 1e12

# (name as NVML / CUDA spell it, row, dense bf16, tf32, fp32 in TFLOP/s)
NAMES = [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4, 494.7, 66.9),
    ("NVIDIA H100", "H100 SXM", 989.4, 494.7, 66.9),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5, 378.0, 51.2),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5, 417.5, 60.0),
    ("NVIDIA H200", "H200 SXM", 989.4, 494.7, 66.9),
    ("NVIDIA H200 141GB HBM3e", "H200 SXM", 989.4, 494.7, 66.9),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5, 417.5, 60.0),
    ("NVIDIA H20", "H20", 148.0, 74.0, 44.0),
    ("NVIDIA GH200 480GB", "GH200", 989.4, 494.7, 66.9),
    ("NVIDIA B200", "B200", 2250.0, 1100.0, 75.0),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM", 312.0, 156.0, 19.5),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM", 312.0, 156.0, 19.5),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe", 312.0, 156.0, 19.5),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe", 312.0, 156.0, 19.5),
    ("NVIDIA L40S", "L40S", 362.05, 183.0, 91.6),
    ("NVIDIA L40", "L40", 181.05, 90.5, 90.5),
    ("NVIDIA L4", "L4", 121.0, 60.0, 30.3),
    ("NVIDIA A10", "A10", 125.0, 62.5, 31.2),
]


@pytest.mark.parametrize(("name", "row", "bf16", "tf32", "fp32"), NAMES)
def test_each_name_finds_its_row_and_dense_figures(
    name: str, row: str, bf16: float, tf32: float, fp32: float
) -> None:
    assert peaks.product(name) == row
    assert peaks.lookup(name, "bf16") == (pytest.approx(bf16 * T), contract.PEAK_OK)
    assert peaks.lookup(name, "fp16") == (pytest.approx(bf16 * T), contract.PEAK_OK)
    assert peaks.lookup(name, "tf32") == (pytest.approx(tf32 * T), contract.PEAK_OK)
    assert peaks.lookup(name, "fp32") == (pytest.approx(fp32 * T), contract.PEAK_OK)


@pytest.mark.parametrize(
    ("name", "row"),
    [
        # near names that a substring match would confuse
        ("NVIDIA H20", "H20"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        # case, spacing and dashes
        ("nvidia h100 80gb hbm3", "H100 SXM"),
        ("NVIDIA  H100-PCIe", "H100 PCIe"),
        ("NVIDIA H100_NVL", "H100 NVL"),
        ("nvidia a100 pcie 40gb", "A100 PCIe"),
        ("NVIDIA A100 SXM4 80GB", "A100 SXM"),
        ("  NVIDIA H200-NVL  ", "H200 NVL"),
        ("nvidia l40s", "L40S"),
    ],
)
def test_matching_is_by_whole_token(name: str, row: str) -> None:
    assert peaks.product(name) == row


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA A10G",  # left out on purpose: no NVIDIA datasheet, and it must not fall to A10
        "NVIDIA H800",
        "NVIDIA GB200",
        "NVIDIA A100X",
        "NVIDIA GeForce RTX 4090",
        "Tesla T4",
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a slice of the GPU: the full peak would be wrong
        "cpu",
    ],
)
def test_unknown_devices(name: str) -> None:
    assert peaks.product(name) is None
    assert peaks.lookup(name, "bf16") == (None, contract.PEAK_UNKNOWN_DEVICE)


@pytest.mark.parametrize("name", ["", "   ", None])
def test_no_gpu(name: str | None) -> None:
    assert peaks.product(name) is None
    assert peaks.lookup(name, "bf16") == (None, contract.PEAK_NO_GPU)
    assert peaks.lookup(name, "bf16", override_tflops=100.0) == (None, contract.PEAK_NO_GPU)


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "NVIDIA A10G", "Tesla T4"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "tf32", "fp32"])
def test_override_wins_for_any_device_and_precision(name: str, dtype: str) -> None:
    assert peaks.lookup(name, dtype, override_tflops=123.5) == (
        pytest.approx(123.5e12),
        contract.PEAK_OK,
    )


@pytest.mark.parametrize("override", [None, 500.0])
@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "NVIDIA B200", "Tesla T4"])
def test_fp8_has_no_peak(name: str, override: float | None) -> None:
    assert peaks.lookup(name, "fp8", override_tflops=override) == (None, contract.PEAK_FP8)


@pytest.mark.parametrize("dtype", ["int8", "fp64", "BF16", "bfloat16", "torch.bfloat16", ""])
def test_bad_precision_raises(dtype: str) -> None:
    with pytest.raises(ValueError, match="precision"):
        peaks.lookup("NVIDIA H100 80GB HBM3", dtype)
    with pytest.raises(ValueError, match="precision"):
        peaks.lookup("", dtype)


@pytest.mark.parametrize("override", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_override_raises(override: float) -> None:
    with pytest.raises(ValueError, match="override"):
        peaks.lookup("NVIDIA H100 80GB HBM3", "bf16", override_tflops=override)


def test_table_shape() -> None:
    products = [p.product for p in peaks.PEAKS]
    assert len(products) == len(set(products))
    for p in peaks.PEAKS:
        assert set(p.flops) == {"bf16", "fp16", "tf32", "fp32"}, p.product
        assert set(p.flops) <= set(contract.PEAK_DTYPES)
        assert all(isinstance(v, float) and v > 1e12 for v in p.flops.values()), p.product
        # tensor rates: fp16 runs with bf16, tf32 at half of it on every product listed
        assert p.flops["fp16"] == p.flops["bf16"], p.product
        assert p.flops["tf32"] == pytest.approx(p.flops["bf16"] / 2, rel=0.03), p.product
        # no row is shadowed by one earlier in the table: its own tokens find it
        assert peaks.product(" ".join(p.match)) == p.product
    with pytest.raises(TypeError):
        peaks.PEAKS[0].flops["bf16"] = 1.0  # type: ignore[index]


@pytest.mark.parametrize(
    ("param", "autocast", "tf32", "want"),
    [
        ("torch.bfloat16", None, False, "bf16"),
        ("torch.float16", None, False, "fp16"),
        ("torch.float32", None, True, "tf32"),
        ("torch.float32", None, False, "fp32"),
        ("float32", None, True, "tf32"),
        ("bfloat16", None, True, "bf16"),
        ("torch.float8_e4m3fn", None, False, "fp8"),
        ("torch.float8_e5m2", None, True, "fp8"),
        ("float8_e4m3fnuz", None, False, "fp8"),
        ("torch.float64", None, True, "fp32"),
        ("torch.int8", None, False, "fp32"),
        # autocast wins over the parameters
        ("torch.float32", "torch.bfloat16", True, "bf16"),
        ("torch.float32", "torch.float16", False, "fp16"),
        ("float32", "bfloat16", False, "bf16"),
        ("torch.float8_e4m3fn", "torch.bfloat16", False, "bf16"),
        # an autocast dtype that is neither bf16 nor fp16 leaves the parameters to decide
        ("torch.float32", "torch.float32", True, "tf32"),
        ("torch.bfloat16", "", False, "bf16"),
    ],
)
def test_dtype_of(param: str, autocast: str | None, tf32: bool, want: str) -> None:
    got = peaks.dtype_of(param, autocast, tf32)
    assert got == want
    assert got in contract.PEAK_DTYPES


def test_importing_peaks_imports_no_torch() -> None:
    code = "import sys, gpujob_trainer.peaks; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
