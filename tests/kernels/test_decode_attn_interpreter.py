"""The flash-decoding attention kernel (``quarl_kernels.decode_attn``) on CPU through ``TRITON_INTERPRET=1``.

Against an fp32 SDPA of the same bf16/fp16 inputs (``attn_mask=valid[:, None, None, :]``): GQA group
sizes 7 (Qwen2.5-7B), 1 and 8, D 128 and 64, L not a multiple of the 64-slot tile, strided cache
views (the ``[:, :, :L]`` prefix of a ``[B, H_kv, S, D]`` cache, S > L, and a ``[:, :L]`` view of
``valid [B, S]``), random masks with left padding and holes, a row whose only valid slot is the
last one, one split (one launch) and several (partials + the combine kernel), the default split
count and explicit ones. Bound: ``atol = rtol = 1e-2`` on outputs of magnitude <= ~1 -- the kernel
sums in fp32 in its own order and, as FlashAttention, rounds the softmax weights ``p`` to the cache
dtype before ``p @ v`` (<= 2^-8 relative each in bf16), then rounds ``o`` to bf16 (2^-9); measured
~1e-3 here. Also: the same inputs give bit-equal outputs twice (deterministic combine), one split
and many agree to the bound, a row with no valid slot gives zeros (not NaN), the split heuristic's
numbers for the 7B / 14B shapes, and ``torch.ops.quarl.decode_attention`` reaching the kernel
through the CPU test seam. The interpreter runs the Triton program, not the machine code, so a
second test compiles the launches for sm_90 here (tensor-core dots, cp.async-pipelined K/V tiles,
no spills); ``test_decode_attn_gpu.py`` runs the GPU build (and CUDA-graph capture).

Skipped unless Triton is importable (and NumPy < 2.3 for the interpreter), as the other interpreter
tests; CPU CI has no Triton. Run here with the side venv of docs/kernels.md:
``PYTHONPATH=$PWD:$PWD/kernels .venv-triton/bin/python -m pytest -q tests/kernels/test_decode_attn_interpreter.py``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

ROOT = Path(__file__).resolve().parents[2]


SCRIPT = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from quarl_kernels import decode_attn as da
    from quarl_kernels import fused_ops

    def inputs(B, HK, G, D, L, S, dtype, seed):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(B, HK, G, D, generator=g).to(dtype)
        kc = torch.randn(B, HK, S, D, generator=g).to(dtype)  # the static cache [B, H_kv, S, D]
        vc = torch.randn(B, HK, S, D, generator=g).to(dtype)
        vs = torch.rand(B, S, generator=g) > 0.2  # holes
        for b in range(B):
            vs[b, : (b * 37) % max(1, L // 2)] = False  # left padding
        vs[:, L - 1] = True  # the slot being written is always valid
        if B > 1:
            vs[B - 1, : L - 1] = False  # the last row: only the last slot
        return q, kc[:, :, :L], vc[:, :, :L], vs[:, :L]

    def ref(q, k, v, valid, scale):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=valid[:, None, None, :],
                                              scale=scale)

    CASES = [  # B, H_kv, G, D, L, S, splits, dtype
        (1, 4, 7, 128, 200, 256, None, torch.bfloat16),  # Qwen2.5-7B group, strided, default split (4)
        (2, 2, 7, 128, 130, 130, 1, torch.bfloat16),  # one launch, contiguous, L % 128 = 2
        (3, 2, 1, 64, 257, 320, 3, torch.bfloat16),  # G = 1 (MHA), D = 64, a 1-slot last tile
        (2, 1, 8, 64, 192, 256, 2, torch.float16),  # G = 8, fp16
        (2, 2, 5, 128, 100, 128, 7, torch.bfloat16),  # Qwen2.5-14B group; 7 asked, 1 tile -> 1 split
    ]
    for i, (B, HK, G, D, L, S, splits, dt) in enumerate(CASES):
        q, k, v, valid = inputs(B, HK, G, D, L, S, dt, i)
        assert not k.is_contiguous() or S == L
        scale = D ** -0.5
        o = da.decode_attention(q, k, v, valid, scale, splits=splits)
        assert o.shape == q.shape and o.dtype == dt and not o.isnan().any()
        r = ref(q, k, v, valid, scale)
        err = (o.float() - r).abs().max().item()
        print("case", i, (B, HK, G, D, L, S, splits), "max |o - ref|", f"{err:.2e}")
        torch.testing.assert_close(o.float(), r, atol=1e-2, rtol=1e-2)
        if B > 1:  # weight exactly 1 on one slot: o is that slot's v, bit for bit
            assert torch.equal(o[B - 1], v[B - 1, :, L - 1:L].expand(HK, G, D))
        assert torch.equal(o, da.decode_attention(q, k, v, valid, scale, splits=splits))  # deterministic

    # one split vs many on the same inputs: the same function up to the rounding of p and o
    q, k, v, valid = inputs(2, 2, 7, 128, 320, 384, torch.bfloat16, 9)
    one, many = (da.decode_attention(q, k, v, valid, 0.1, splits=s) for s in (1, 5))
    torch.testing.assert_close(one.float(), many.float(), atol=1e-2, rtol=1e-2)

    # no valid slot in a row (never made by the engine): zeros, with one split and with several
    valid2 = valid.clone()
    valid2[0] = False
    for s in (1, 5):
        o = da.decode_attention(q, k, v, valid2, 0.1, splits=s)
        assert torch.equal(o[0], torch.zeros_like(o[0])), s
        torch.testing.assert_close(o[1].float(), ref(q, k, v, valid2, 0.1)[1], atol=1e-2, rtol=1e-2)

    # the split heuristic (132 SMs): no split once B * H_kv programs cover the SMs, else ~2 waves
    # (128-slot tiles: 10 in 1280 slots)
    assert [da.num_splits(b * 4, 1280, 132) for b in (1, 8, 64)] == [10, 5, 1]  # 7B
    assert [da.num_splits(b * 8, 1280, 132) for b in (1, 8, 64)] == [10, 5, 1]  # 14B
    assert da.num_splits(4, 2304, 132) == 18 and da.num_splits(4, 10, 132) == 1
    assert [da.num_splits(b * 4, 1280, 132, block_n=64) for b in (1, 8, 64)] == [20, 7, 1]  # 64-slot tiles
    # tile size: 128 slots below two waves of (row, KV head) programs, 64 from there
    assert [da.block_n_for(bh, 132) for bh in (4, 32, 256, 264, 512)] == [128, 128, 128, 64, 64]

    # head dims the kernel does not take are refused (the op falls back to SDPA for them)
    try:
        da.decode_attention(torch.zeros(1, 1, 2, 80), torch.zeros(1, 1, 4, 80), torch.zeros(1, 1, 4, 80),
                            torch.ones(1, 4, dtype=torch.bool), 1.0)
        raise AssertionError("D = 80 accepted")
    except ValueError as e:
        assert "head dim 80" in str(e)

    # the custom op reaches the kernel on CPU through the test seam (else it runs SDPA)
    q, k, v, valid = inputs(2, 2, 7, 128, 130, 192, torch.bfloat16, 3)
    assert not fused_ops.decode_attn_kernel_applies(q, k, v, valid)
    fused_ops._ATTN_ON_CPU = True
    assert fused_ops.decode_attn_kernel_applies(q, k, v, valid)
    assert torch.equal(fused_ops.decode_attention(q, k, v, valid, 0.1), da.decode_attention(q, k, v, valid, 0.1))
    print("OK")
""")


@needs_interpreter
def test_decode_attention_under_triton_interpreter():
    run_interpreted(SCRIPT)




@needs_triton
def test_decode_attention_compiles_for_sm90():
    """The launches as ``decode_attn.launches`` makes them for 7B / 14B decode shapes (strided cache
    views, runtime arguments specialized as Triton does at launch) lower for Hopper: ``q k^T`` and
    ``p v`` on the tensor cores (``mma.sync`` at 16 query rows), the K/V tiles pipelined through
    shared memory (``cp.async``), ``ex2`` for the softmax, and -- where the wheel ships ``cuobjdump``
    -- no register spills, in both the attention and the combine kernel."""
    import torch
    from quarl_kernels import decode_attn as da

    from tests.kernels.sm90_sass import compile_launch, stack_bytes

    built = []
    for B, HK, G, D, L, S in ((1, 4, 7, 128, 1280, 2048), (64, 8, 5, 128, 2304, 2560), (8, 2, 8, 64, 1280, 1536)):
        q = torch.empty(B, HK, G, D, dtype=torch.bfloat16)
        kc, vc = (torch.empty(B, HK, S, D, dtype=torch.bfloat16) for _ in range(2))
        valid = torch.ones(B, S, dtype=torch.bool)
        for splits in (1, 4):
            _, todo = da.launches(q, kc[:, :, :L], vc[:, :, :L], valid[:, :L], D ** -0.5, splits=splits)
            assert len(todo) == (1 if splits == 1 else 2)
            for la in todo:
                k, _ = compile_launch(la, fp_fusion=True, INTERPRET=False)  # as launched: FP contraction on
                if la.kernel is da._decode_attn_kernel:
                    ptx = k.asm["ptx"]
                    assert "mma.sync" in ptx and "ex2.approx" in ptx and "cp.async" in ptx, (B, HK, G, D, splits)
                built.append(k)
    for k in built:
        assert stack_bytes(k) in (0, None), "ptxas spilled registers"
