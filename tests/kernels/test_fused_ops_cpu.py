"""quarl_kernels.fused_ops on CPU: the references are HF's modules and quarl's quantizer bit for bit,
the custom ops run them off-GPU (schemas, fake impls, tracing), bad arguments get clear errors;
the Triton kernels themselves run under ``TRITON_INTERPRET=1`` against the references on odd
shapes, and compile for sm_90 (both skipped without Triton; the GPU file checks the fast path).

Interpreter bounds: the residual add, RoPE and the FP8 bytes and scales (of the kernel's own
``y``) must be *equal*. The norm output ``y`` may differ from the reference by one rounding step on
a few elements, because the fp32 sum of squares is added in another order (``rstd`` moves by an
fp32 ulp, which flips a bf16/fp16 rounding now and then): <= 2 ulps of the output (one for the
normalized value, one for the product with the weight), on < 1% of elements. ``silu * up``: <= 2
ulps on < 0.1% (one for silu, one for the product): PyTorch's CPU silu uses a vectorized exp, the
interpreter NumPy's; on the GPU both sides use CUDA's ``expf``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from quarl_kernels import fused_ops
from quarl_kernels.fused_ops import rms_norm_reference, rope_reference, silu_mul_reference

from quarl.quant.formats.fp8 import quantize_act_1x128

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETER_OK = HAS_TRITON and tuple(map(int, np.__version__.split(".")[:2])) < (2, 3)


def _hf_norms():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    return [LlamaRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm]


def _norm_module(cls, n: int, dtype, seed: int = 0):
    torch.manual_seed(seed)
    m = cls(n, eps=1e-6).to(dtype)
    with torch.no_grad():
        m.weight.copy_(1 + 0.2 * torch.randn(n))
    return m


# --- references ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [576, 128])
def test_reference_is_the_hf_module_bit_for_bit(dtype, n):
    x, r = torch.randn(3, 5, n).to(dtype), torch.randn(3, 5, n).to(dtype)
    for cls in _hf_norms():
        m = _norm_module(cls, n, dtype)
        y, h = rms_norm_reference(x, m.weight, m.variance_epsilon)
        assert torch.equal(y, m(x)) and h is x
        y, h = rms_norm_reference(x, m.weight, m.variance_epsilon, residual=r)
        hh = r + x  # the engine's `h = h + o`
        assert torch.equal(h, hh) and torch.equal(y, m(hh))


def test_noise_equals_aqn_writing_the_weight_in_place():
    from quarl.rl.aqn import AQN, AQNConfig
    from tests.engine.conftest import make_model

    model = make_model("qwen2", dtype=torch.bfloat16)
    aqn = AQN(model, AQNConfig(sigma_start=0.05, sigma_end=0.01, num_stages=4), total_steps=4)
    name, norm = next(iter(aqn.modules.items()))
    clean = norm.weight.detach().clone()
    x = torch.randn(2, 7, clean.shape[0]).to(torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    z = torch.randn(clean.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float32) * aqn.sigma(1)
    with aqn.perturb(1, g):  # the first target draws first
        noisy = norm(x)
    y, _ = rms_norm_reference(x, clean, norm.variance_epsilon, noise=z)
    assert torch.equal(y, noisy), name
    assert not torch.equal(y, norm(x))  # the weights are clean again and the noise mattered


def test_rope_reference_is_hf_apply_rotary_pos_emb():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = torch.randn(2, 6, 5, 64).to(torch.bfloat16), torch.randn(2, 2, 5, 64).to(torch.bfloat16)
    cos, sin = torch.randn(2, 5, 64).to(torch.bfloat16), torch.randn(2, 5, 64).to(torch.bfloat16)
    rq, rk = rope_reference(q, k, cos, sin)
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(rq, hq) and torch.equal(rk, hk)


# --- ops on CPU ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ops_on_cpu_return_the_references(dtype):
    n = 384
    x, r = torch.randn(4, n).to(dtype), torch.randn(4, n).to(dtype)
    w, z = (1 + 0.1 * torch.randn(n)).to(dtype), torch.randn(n) * 0.01
    y, h = rms_norm_reference(x, w, 1e-5, r, z)
    assert torch.equal(fused_ops.rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5)[0])
    yy, hh = fused_ops.rms_norm(x, w, 1e-5, residual=r, noise=z)
    assert torch.equal(yy, y) and torch.equal(hh, h)
    yy, hh, q, s = fused_ops.rms_norm(x, w, 1e-5, residual=r, noise=z, fp8_out=True)
    qr, sr = quantize_act_1x128(y)
    assert torch.equal(yy, y) and torch.equal(hh, h) and torch.equal(s, sr)
    assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and s.shape == (4, 3)
    yy, q, s = fused_ops.rms_norm(x, w, 1e-5, fp8_out=True)
    assert torch.equal(q.view(torch.uint8), quantize_act_1x128(rms_norm_reference(x, w, 1e-5)[0])[0].view(torch.uint8))

    q4, k4 = torch.randn(2, 3, 6, 8).to(dtype).transpose(1, 2), torch.randn(2, 3, 2, 8).to(dtype).transpose(1, 2)
    cos, sin = torch.randn(2, 3, 8).to(dtype), torch.randn(2, 3, 8).to(dtype)
    qo, ko = fused_ops.rope_qk(q4, k4, cos, sin)
    rq, rk = rope_reference(q4, k4, cos, sin)
    assert torch.equal(qo, rq) and torch.equal(ko, rk) and qo.stride() == q4.stride()
    v4 = torch.randn(2, 3, 2, 8).to(dtype).transpose(1, 2)
    kc, vc = torch.zeros(2, 2, 5, 8, dtype=dtype), torch.zeros(2, 2, 5, 8, dtype=dtype)
    slot = torch.tensor([3, 0, 4])
    qo = fused_ops.rope_qk_cache(q4, k4, v4, cos, sin, kc, vc, slot)
    assert torch.equal(qo, rq) and torch.equal(kc[:, :, slot], rk) and torch.equal(vc[:, :, slot], v4)
    assert not kc[:, :, [1, 2]].any() and not vc[:, :, [1, 2]].any()

    g, u = torch.randn(3, 100).to(dtype), torch.randn(3, 100).to(dtype)
    assert torch.equal(fused_ops.silu_mul(g, u), silu_mul_reference(g, u))

    qa, kc, vc = torch.randn(2, 2, 7, 64).to(dtype), torch.randn(2, 2, 40, 64).to(dtype), torch.randn(2, 2, 40, 64).to(dtype)
    valid = torch.rand(2, 40) > 0.3
    valid[:, 29] = True
    k, v, ok = kc[:, :, :30], vc[:, :, :30], valid[:, :30]  # the engine's strided prefix views
    o = fused_ops.decode_attention(qa, k, v, ok, 0.125)
    assert torch.equal(o, fused_ops.decode_attention_reference(qa, k, v, ok, 0.125)) and o.is_contiguous()
    assert torch.equal(fused_ops.decode_attention_reference(qa, k, v, ok, 0.125),
                       F.scaled_dot_product_attention(qa, k, v, attn_mask=ok[:, None, None, :], scale=0.125))


def test_bad_arguments_name_the_problem():
    x, w = torch.randn(2, 576), torch.ones(576)
    with pytest.raises(ValueError, match="multiple of 128"):
        fused_ops.rms_norm(x, w, 1e-6, fp8_out=True)  # SmolLM2's hidden size has no 1x128 blocks
    with pytest.raises(ValueError, match=r"weight must be \[576\]"):
        fused_ops.rms_norm(x, torch.ones(512), 1e-6)
    with pytest.raises(ValueError, match="residual must match"):
        fused_ops.rms_norm(x, w, 1e-6, residual=torch.randn(2, 576).to(torch.bfloat16))
    with pytest.raises(ValueError, match="AQN's fp32 vector"):
        fused_ops.rms_norm(x, w, 1e-6, noise=torch.randn(576).to(torch.bfloat16))
    with pytest.raises(ValueError, match="rope_qk expects"):
        fused_ops.rope_qk(torch.randn(1, 2, 3, 7), torch.randn(1, 2, 3, 7), torch.randn(1, 3, 7), torch.randn(1, 3, 7))
    with pytest.raises(ValueError, match="rope_qk_cache expects"):  # the slot must be int64 [L]
        q4, k4 = torch.randn(1, 2, 1, 8), torch.randn(1, 1, 1, 8)
        fused_ops.rope_qk_cache(q4, k4, k4, torch.randn(1, 1, 8), torch.randn(1, 1, 8), torch.zeros(1, 1, 4, 8),
                                torch.zeros(1, 1, 4, 8), torch.tensor([2], dtype=torch.int32))
    with pytest.raises(ValueError, match="one shape and dtype"):
        fused_ops.silu_mul(torch.randn(2, 4), torch.randn(2, 5))
    with pytest.raises(ValueError, match="decode_attention expects"):
        fused_ops.decode_attention(torch.randn(1, 2, 3, 64), torch.randn(1, 2, 9, 64), torch.randn(1, 2, 9, 64),
                                   torch.ones(1, 8, dtype=torch.bool), 1.0)  # valid must be [B, L]


def test_opcheck_schemas_and_fake_impls():
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    x, r, w, z = torch.randn(3, 256), torch.randn(3, 256), torch.randn(256), torch.randn(256)
    ops = torch.ops.quarl
    torch.library.opcheck(ops.rms_norm.default, (x, w, 1e-6, z), test_utils=utils)
    torch.library.opcheck(ops.add_rms_norm.default, (x, r, w, 1e-6, None), test_utils=utils)
    # the schema checker compares outputs bitwise through a path without float8 support
    fp8_utils = ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(ops.rms_norm_fp8.default, (x, w, 1e-6, None), test_utils=fp8_utils)
    torch.library.opcheck(ops.add_rms_norm_fp8.default, (x, r, w, 1e-6, z), test_utils=fp8_utils)
    q, k = torch.randn(2, 3, 4, 8).transpose(1, 2), torch.randn(2, 3, 1, 8).transpose(1, 2)
    torch.library.opcheck(ops.rope_qk.default, (q, k, torch.randn(2, 3, 8), torch.randn(2, 3, 8)), test_utils=utils)
    torch.library.opcheck(ops.rope_qk_cache.default, (q, k, torch.randn(2, 3, 1, 8).transpose(1, 2), torch.randn(2, 3, 8),
                                                      torch.randn(2, 3, 8), torch.zeros(2, 1, 6, 8), torch.zeros(2, 1, 6, 8),
                                                      torch.tensor([5, 1, 2])), test_utils=utils)
    torch.library.opcheck(ops.silu_mul.default, (torch.randn(5, 7), torch.randn(5, 7)), test_utils=utils)
    kc, vc = torch.randn(2, 2, 16, 64), torch.randn(2, 2, 16, 64)
    valid = torch.ones(2, 16, dtype=torch.bool)
    torch.library.opcheck(ops.decode_attention.default, (torch.randn(2, 2, 3, 64), kc[:, :, :9], vc[:, :, :9],
                                                         valid[:, :9], 0.125), test_utils=utils)


def test_traces_under_torch_compile_fullgraph():
    w = torch.randn(128)

    def step(x, r):
        y, h = fused_ops.rms_norm(x, w, 1e-6, residual=r)
        return fused_ops.silu_mul(y, y) + h

    x, r = torch.randn(2, 128), torch.randn(2, 128)
    out = torch.compile(step, fullgraph=True, backend="aot_eager")(x, r)
    assert torch.equal(out, step(x, r))

    def attend(q, k, v, valid):
        return fused_ops.decode_attention(q, k[:, :, :5], v[:, :, :5], valid[:, :5], 0.125) * 2

    q, k, v = torch.randn(1, 2, 4, 64), torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64)
    valid = torch.ones(1, 8, dtype=torch.bool)
    assert torch.equal(torch.compile(attend, fullgraph=True, backend="aot_eager")(q, k, v, valid), attend(q, k, v, valid))


# --- the Triton kernels under the interpreter ------------------------------------------------------
INTERPRETER_SCRIPT = textwrap.dedent("""
    import math
    import torch
    from quarl_kernels import act, norm, rope
    from quarl_kernels.fused_ops import rms_norm_reference, rope_reference, silu_mul_reference
    from quarl.quant.formats.fp8 import quantize_act_1x128

    def ulps(a, b):  # |a - b| in units of b's last place
        mant = 7 if b.dtype == torch.bfloat16 else 10
        bf = b.float()
        ulp = torch.exp2(torch.floor(torch.log2(bf.abs().clamp_min(1e-30))) - mant)
        return ((a.float() - bf).abs() / ulp).nan_to_num(0.0)

    torch.manual_seed(0)
    n_checked = 0
    for dtype in (torch.bfloat16, torch.float16):
        # hidden: SmolLM2 576 (not a multiple of 128), Qwen2.5-7B 3584, a non-power-of-two 1000,
        # one head (Qwen3 q_norm rows of 128 and 80); batch 1 and 3, prefill-like 2 x 5 rows
        for shape in ((1, 576), (3, 576), (1, 3584), (3, 3584), (3, 1000), (2, 5, 128), (7, 80)):
            n = shape[-1]
            for res in (False, True):
                for noisy in (False, True):
                    x = (torch.randn(shape) * 2).to(dtype)
                    r = torch.randn(shape).to(dtype) if res else None
                    w = (1 + 0.3 * torch.randn(n)).to(dtype)
                    z = torch.randn(n) * 0.02 if noisy else None
                    fp8 = n % 128 == 0
                    y, h, q, s = norm.rms_norm(x, w, 1e-6, r, z, fp8)
                    yr, hr = rms_norm_reference(x, w, 1e-6, r, z)
                    if res:
                        assert torch.equal(h, hr), ("residual", dtype, shape)
                    else:
                        assert h is None
                    e = ulps(y, yr)
                    frac = (e > 0).float().mean().item()
                    assert e.max() <= 2 and frac < 0.01, ("norm", dtype, shape, res, noisy, e.max(), frac)
                    if fp8:
                        qr, sr = quantize_act_1x128(y)
                        assert torch.equal(s, sr) and s.shape == (*shape[:-1], n // 128), ("scale", dtype, shape)
                        assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)), ("fp8", dtype, shape)
                    n_checked += 1
        # an all-zero row: eps scales, zero bytes, no NaN
        x = torch.zeros(2, 256).to(dtype)
        y, _, q, s = norm.rms_norm(x, torch.ones(256).to(dtype), 1e-6, None, None, True)
        qr, sr = quantize_act_1x128(y)
        assert torch.equal(s, sr) and torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and not y.isnan().any()

        # RoPE: decode (L = 1) and prefill layouts as the engine passes them ([B, L, H, D] views
        # transposed to [B, H, L, D]), GQA head counts, D = 64, 128 and a non-power-of-two 80
        for B, L, H, HK, D in ((1, 1, 28, 4, 128), (3, 1, 7, 1, 64), (2, 5, 9, 3, 80), (1, 33, 40, 8, 128)):
            q4 = torch.randn(B, L, H, D).to(dtype).transpose(1, 2)
            k4 = torch.randn(B, L, HK, D).to(dtype).transpose(1, 2)
            table = torch.randn(64, D).to(dtype), torch.randn(64, D).to(dtype)
            pos = torch.randint(0, 64, (B, L))
            cos, sin = table[0][pos], table[1][pos]
            qo, ko = rope.rope_qk(q4, k4, cos, sin)
            rq, rk = rope_reference(q4, k4, cos, sin)
            assert torch.equal(qo, rq) and torch.equal(ko, rk), ("rope", dtype, B, L, H, HK, D)
            qc = q4.contiguous()  # a contiguous [B, H, L, D] input as well
            assert torch.equal(rope.rope_qk(qc, k4, cos, sin)[0], rq)
            # with the K/V cache write (a decode step's: the engine's [B, H_kv, S, D] cache slices, slot per l)
            v4 = torch.randn(B, L, HK, D).to(dtype).transpose(1, 2)
            kc = torch.full((B + 1, HK, L + 6, D), 7.0).to(dtype)[:B]  # a row-slice view of a bigger cache
            vc = torch.full((B + 1, HK, L + 6, D), 7.0).to(dtype)[:B]
            slot = torch.randperm(L + 6)[:L]
            qo = rope.rope_qk_cache(q4, k4, v4, cos, sin, kc, vc, slot)
            assert torch.equal(qo, rq) and torch.equal(kc[:, :, slot], rk) and torch.equal(vc[:, :, slot], v4), \
                ("rope+cache", dtype, B, L, H, HK, D)
            rest = torch.ones(L + 6, dtype=torch.bool)
            rest[slot] = False
            assert bool((kc[:, :, rest] == 7).all()) and bool((vc[:, :, rest] == 7).all())

        # SiLU * up: sizes that end inside a block, large |gate| (exp overflow) included
        for shape in ((1, 18944), (3, 1000), (5, 7)):
            g, u = (torch.randn(shape) * 6).to(dtype), torch.randn(shape).to(dtype)
            g.view(-1)[:2] = torch.tensor([-100.0, 100.0]).to(dtype)
            o = act.silu_mul(g, u)
            # PyTorch's CPU silu (vectorized exp) and NumPy's exp may differ in the last fp32 bit
            e = ulps(o, silu_mul_reference(g, u))
            assert e.max() <= 2 and (e > 0).float().mean() < 1e-3, ("silu", dtype, shape, e.max())
    print("checked", n_checked, "norm cases")
    print("OK")
""")


@pytest.mark.skipif(not INTERPRETER_OK, reason="needs Triton and NumPy < 2.3 for the Triton interpreter")
def test_kernels_under_triton_interpreter():
    path = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *sys.path])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", INTERPRETER_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), r.stdout + r.stderr[-3000:]


# --- they lower for Hopper (no GPU needed) --------------------------------------------------------
def _compile_sm90(fn, sig: dict, const: dict, warps: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {**sig, **{k: "constexpr" for k in const}}
    src = ASTSource(fn=fn, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps,
                                                                           "enable_fp_fusion": False})


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton (CPU CI has none)")
def test_kernels_compile_for_sm90():
    from quarl_kernels import act, norm, rope

    ints = lambda *names: {k: "i32" for k in names}
    nsig = {"x_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "z_ptr": "*fp32", "y_ptr": "*bf16",
            "h_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32",
            **ints("M", "N", "stride_xm", "stride_rm", "stride_ym", "stride_hm", "stride_qm", "stride_sm"),
            "eps": "fp32", "inv_n": "fp32"}
    for fp8, res, noise, bm, bn in ((True, True, True, 1, 4096), (False, True, False, 1, 8192),
                                    (False, False, False, 32, 128), (True, False, False, 4, 1024)):
        const = {"HAS_RES": res, "HAS_NOISE": noise, "FP8": fp8, "SCALE_RECIP": True, "BLOCK_M": bm, "BLOCK_N": bn,
                     "INTERPRET": False}
        k = _compile_sm90(norm._rms_norm_kernel, nsig, const, norm.tile_config(bm, bn)[2])
        ptx = k.asm["ptx"]
        assert "div.full" not in ptx and "fma.rn.f32" not in ptx, "approximate division or contraction crept in"
        assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx and "div.rn.f32" in ptx) == fp8
        assert "0f3B124925" in ptx or not fp8  # the fp32(1/448) CUDA PyTorch multiplies by

    rsig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "c_ptr": "*bf16", "s_ptr": "*bf16", "qo_ptr": "*bf16",
            "ko_ptr": "*bf16", **ints("L", "H", "HK", "D", "sqb", "sqh", "sql", "skb", "skh", "skl", "sqob", "sqoh",
                                      "sqol", "skob", "skoh", "skol", "scb", "scl", "ssb", "ssl")}
    rsig.update({"v_ptr": "*bf16", "vo_ptr": "*bf16", "slot_ptr": "*i64",
                 **ints("svb", "svh", "svl", "svob", "svoh", "svol")})
    bh, bd, warps = rope.tile_config(128, 28)
    for cache in (False, True):
        k = _compile_sm90(rope._rope_kernel, rsig, {"BLOCK_H": bh, "BLOCK_D": bd, "INTERPRET": False, "CACHE": cache},
                          warps)
        assert "fma.rn" not in k.asm["ptx"]  # each product is rounded to bf16 before the sum

    asig = {"g_ptr": "*bf16", "u_ptr": "*bf16", "o_ptr": "*bf16", "n": "i32"}
    k = _compile_sm90(act._silu_mul_kernel, asig, {"BLOCK": act.BLOCK, "INTERPRET": False}, 4)
    ptx = k.asm["ptx"]
    assert "div.rn.f32" in ptx and "div.full" not in ptx
