"""The CUDA kernels compile with NVRTC for Ampere and Hopper, no GPU needed."""

from __future__ import annotations

import pytest
import torch

from srupp_asr import kernels

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy (the gpu/dev extra) is not installed")


@pytest.mark.parametrize("cols", kernels.CUDA_COLUMN_CHOICES)
@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
@pytest.mark.parametrize("dtype", list(kernels.CUDA_TYPES))
def test_cuda_source_compiles_to_ptx(dtype, arch, cols):
    ptx = kernels.compile_ptx(dtype, arch, cols)
    assert ".entry sru_forward" in ptx and ".entry sru_backward" in ptx
    assert f".target sm_{arch.split('_')[1]}" in ptx


def test_compile_errors_carry_the_nvrtc_log(monkeypatch):
    monkeypatch.setattr(kernels, "cuda_source", lambda: 'extern "C" __global__ void k() { undeclared(); }')
    with pytest.raises(RuntimeError, match="undeclared"):
        kernels.compile_ptx(torch.float32)
