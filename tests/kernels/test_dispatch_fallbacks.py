"""``wo_gemm.wo_matmul``'s fallbacks, on CPU (the launches are stubbed): a Gluon kernel that a
newer Triton cannot build, and a dense path with no memory for its transient BF16 weight,
must both degrade to the fused Triton kernel instead of failing the step.

Skipped unless Triton is importable (the CPU CI has none)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="quarl_kernels needs Triton (CPU CI has none)")



def test_wo_matmul_falls_back_when_gluon_fails_to_compile(monkeypatch):
    """A Triton whose Gluon cannot build the kernel must not take decode down: wo_matmul warns
    once and sends the call (and every later one) to the Triton tensor-core kernel."""
    import torch
    import triton
    from quarl_kernels import wo_gemm
    from quarl_kernels.ops import _packed_weight

    from quarl.quant import get_format, make_config

    mma_decode = pytest.importorskip("quarl_kernels.mma_decode", reason="needs Gluon (Triton >= 3.5)")

    cfg = make_config("nvfp4")
    q = get_format("nvfp4").quantize(torch.randn(64, 128) * 0.05, cfg)
    t = q.tensors
    pw = _packed_weight(t["weight_packed"], t["weight_scale"], None, t["weight_global_scale"], "nvfp4", 16, 64, 128)
    x = torch.randn(4, 128).to(torch.bfloat16)

    def broken(*a, **k):
        raise triton.compiler.errors.CompilationError("src", None, "gluon API moved")

    taken = []
    monkeypatch.setattr(wo_gemm, "_MMA_DECODE_BROKEN", None)
    monkeypatch.setattr(wo_gemm, "_interpreting", lambda: False)
    monkeypatch.setattr(mma_decode, "mma_decode_supported", lambda x2, pw: True)
    monkeypatch.setattr(mma_decode, "launch_mma_decode", broken)
    monkeypatch.setattr(wo_gemm, "launch_fwd", lambda x2, pw, c, epi=None: taken.append(c) or "tc")
    with pytest.warns(UserWarning, match="falls back to the Triton tensor-core kernel"):
        assert wo_gemm.wo_matmul(x, pw) == "tc"
    assert wo_gemm._MMA_DECODE_BROKEN and wo_gemm._mma_decode() is None
    assert wo_gemm.wo_matmul(x, pw) == "tc" and len(taken) == 2  # no second try, no second warning


def test_dense_path_out_of_memory_falls_back_to_the_fused_kernel(monkeypatch):
    """No room for the dense path's transient BF16 weight must not fail the step: the call
    (forward and backward) runs the fused kernel, which needs no extra memory."""
    import torch
    from quarl_kernels import dense, wo_gemm

    def oom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    fused = []
    monkeypatch.setattr(wo_gemm, "_DENSE_OOM_WARNED", False)
    monkeypatch.setattr(dense, "use_dense", lambda m: True)
    monkeypatch.setattr(dense, "dense_matmul", oom)
    monkeypatch.setattr(dense, "dense_matmul_t", oom)
    monkeypatch.setattr(wo_gemm, "_mma_decode", lambda: None)
    monkeypatch.setattr(wo_gemm, "launch_fwd", lambda x2, pw, c, epi=None: fused.append("fwd") or "fused")
    monkeypatch.setattr(wo_gemm, "launch_bwd", lambda dy2, pw, c: fused.append("bwd") or "fused")
    pw = wo_gemm.PackedWeight(0, 16, 64, 128, torch.zeros(64, 16, dtype=torch.int32), torch.zeros(64, 2, dtype=torch.int32),
                              None, torch.ones(1), True)
    x = torch.zeros(512, 128, dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match="transient 64x128 BF16 weight"):
        assert wo_gemm.wo_matmul(x, pw) == "fused"
    assert wo_gemm.wo_matmul_t(torch.zeros(512, 64, dtype=torch.bfloat16), pw) == "fused"
    assert fused == ["fwd", "bwd"]


def test_an_optional_kernel_this_triton_cannot_provide_is_reported_not_raised():
    """The Gluon kernels load through ``_import_kernel``: a module that cannot be imported (no Gluon, an API that
    moved) comes back as None with the reason, which the loaders keep so the process asks only once."""
    from quarl_kernels import wo_gemm

    mod, why = wo_gemm._import_kernel("no_such_kernel")
    assert mod is None and why.startswith("ModuleNotFoundError")
    mod, why = wo_gemm._import_kernel("launch")
    assert why is None and hasattr(mod, "finish_splits")
    assert wo_gemm._build_failure(ValueError("first line\nsecond")) == "ValueError: first line"
