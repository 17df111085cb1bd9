"""Blocked words (``quarl.quant.packed_layout``) on the GPU: every kernel gives the row-major kernels' bits.

``wo_matmul`` / ``wo_matmul_t`` route by M to the GEMV (1 row), ``mma.sync`` (2..16), ``wgmma_decode`` or the TMA
ring (17..384), the fused GEMMs and the dense path (>= 385, also its FP8 variant): each must return, on a weight's
words blocked, exactly the tensor it returns on the same words row-major. A q/k/v group launch likewise. Then the
lifecycle on a model: the engine blocks its policy's 4-bit layers for batched decoding and turns them row-major
for a one-row call, the rollouts (tokens and log-probs) and the trainer's forward are those of the row-major model,
and ``state_dict`` / ``qtensor`` hand back compressed-tensors' bytes.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _weights(spec: str, n: int, k: int, seed: int = 0):
    from tests.kernels.gpu_weights import packed_weights

    return packed_weights(spec, n, k, seed)[1:]


@pytest.mark.parametrize("spec", ["nvfp4", "mxfp4", "int4-g128"])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 24, 64, 200, 2048])
def test_wo_matmul_on_blocked_words_is_bit_equal(spec, m):
    from quarl_kernels import wo_gemm

    n, k = 1536, 1024
    row, blk = _weights(spec, n, k, seed=m)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    assert torch.equal(wo_gemm.wo_matmul(x, blk), wo_gemm.wo_matmul(x, row))
    dy = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    assert torch.equal(wo_gemm.wo_matmul_t(dy, blk), wo_gemm.wo_matmul_t(dy, row))


@pytest.mark.parametrize("which", ["RING_CONFIGS[0]", "RING_CONFIGS[2]", "WIDE_CONFIGS[0]", "WIDE_CONFIGS[3]"])
def test_ring_configs_on_blocked_words_are_bit_equal(which):
    """The TMA ring at 64 and 128 rows a CTA (one or two [64, 8] boxes a step), decode and wide token tiles; 1600
    rows: the last 128-row CTA's second band lies past N (its box TMA-zero-filled, never stored)."""
    from quarl_kernels import wgmma_ring as wr

    name, i = which.rstrip("]").split("[")
    cfg = getattr(wr, name)[int(i)]
    row, blk = _weights("nvfp4", 1600, 1024)
    for m in ((32, 64) if name == "RING_CONFIGS" else (128, 200)):
        x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
        assert torch.equal(wr.launch_wgmma_ring(x, blk, cfg), wr.launch_wgmma_ring(x, row, cfg)), (which, m)


@pytest.mark.parametrize("m", [2048, 4096])
def test_fp8_dense_path_on_blocked_words_is_bit_equal(m, monkeypatch):
    from quarl_kernels import dense_fp8, wo_gemm

    monkeypatch.setenv(dense_fp8.ENV, "1")
    monkeypatch.setenv(dense_fp8.MIN_GFLOP_ENV, "0")
    row, blk = _weights("nvfp4", 2048, 1024)
    x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
    assert dense_fp8.takes(m, blk)
    assert torch.equal(wo_gemm.wo_matmul(x, blk), wo_gemm.wo_matmul(x, row))


@pytest.mark.parametrize("m", [1, 4, 16])
def test_group_launch_on_blocked_words_is_bit_equal(m):
    from quarl_kernels import wo_gemm
    from quarl_kernels.launch import Epilogue

    pairs = [_weights("nvfp4", n, 1024, seed=n) for n in (1024, 256, 256)]
    x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
    epis = [Epilogue(None, None, None, 0.0)] * 3
    assert wo_gemm.group_route(x, [b for _, b in pairs]) is not None  # one launch, as the engine's q/k/v
    want = wo_gemm.wo_matmul_group(x, [r for r, _ in pairs], epis)
    got = wo_gemm.wo_matmul_group(x, [b for _, b in pairs], epis)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_engine_blocks_its_policy_and_rolls_out_the_same(monkeypatch):
    from quarl.engine import FastGenerator
    from quarl.quant import QuantLinear, packed_layout
    from tests.engine.conftest import PAD, full_forward_logprobs, prompts
    from tests.engine.test_engine_gpu import _lora_model, greedy

    rows = prompts()
    monkeypatch.setenv(packed_layout.ENV, "0")
    plain = _lora_model("nvfp4", torch.bfloat16)
    want_sd = {k: v.clone() for k, v in plain.state_dict().items()}
    eng = FastGenerator(plain, PAD, kv_block=8)
    want = eng.generate(rows, greedy(24), n=2)
    want_one = eng.generate(rows[:1], greedy(24), n=1)
    assert eng.last_stats["blocked_layers"] == 0
    monkeypatch.setenv(packed_layout.ENV, "auto")
    model = _lora_model("nvfp4", torch.bfloat16)
    eng = FastGenerator(model, PAD, kv_block=8)
    got = eng.generate(rows, greedy(24), n=2)  # 8 rows a step: blocked
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    blocked = [m for m in layers if packed_layout.is_blocked(m.weight_packed)]
    # the tiny model's k / v (32 rows) stay row-major: not whole 64-row bands
    assert eng.last_stats["blocked_layers"] == len(blocked) > 0 and len(blocked) < len(layers)
    assert eng.graph_error is None
    one = eng.generate(rows[:1], greedy(24), n=1)  # one row a step: row-major again, graphs re-captured
    assert eng.last_stats["blocked_layers"] == 0 and eng.last_stats["graph_captures"] > 0
    assert torch.equal(one.completion_ids, want_one.completion_ids)
    assert torch.equal(one.logprobs, want_one.logprobs)
    again = eng.generate(rows, greedy(24), n=2)
    assert eng.last_stats["blocked_layers"] == len(blocked)
    assert torch.equal(again.completion_ids, want.completion_ids)
    assert torch.equal(got.completion_ids, want.completion_ids)
    assert torch.equal(got.logprobs, want.logprobs)
    # the trainer's forward (autograd path) reads the same blocked buffers
    assert torch.equal(full_forward_logprobs(model, got), full_forward_logprobs(plain, want))
    sd = model.state_dict()
    assert sd.keys() == want_sd.keys() and all(torch.equal(sd[k], want_sd[k]) for k in sd)
    q = blocked[0].qtensor()
    assert q.tensors["weight_packed"].dim() == 2
