"""Shared by the FP8 linear's tests (test_fp8_linear.py, test_fp8_gemm.py, test_fp8_operands.py)."""

import pytest
import torch

# the GPU tests: cuBLAS's blockwise FP8 scaled_mm and DeepGEMM's kernels are SM90 (Hopper) here
_NO_SM90 = not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0)


def needs_sm90(test):
    return pytest.mark.gpu(pytest.mark.skipif(_NO_SM90, reason="needs an SM90 GPU")(test))


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())
