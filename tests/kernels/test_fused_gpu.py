"""GPU correctness of the fused engine kernels (``quarl_kernels.fused_ops``) and of the engine using them.

Bounds, and why:

* residual add ``h``, RoPE, FP8 bytes and scales: **equal** to PyTorch on the same device. The kernels
  replay PyTorch's rounding sequence (each bf16/fp16 op rounded once, RNE), and the FP8 quantizer
  is checked against ``quantize_act_1x128`` of the kernel's own ``y`` -- including CUDA PyTorch's
  ``amax / 448 == amax * fp32(1/448)``.
* RMSNorm ``y``: <= 2 ulps of the output on < 1% of the elements. The fp32 sum of squares is added
  in a different order than PyTorch's reduction, so ``rstd`` can move by an fp32 ulp and flip the
  rounding of the normalized value (1 ulp), which the product with the weight can turn into 2.
* ``silu(gate) * up``: <= 2 ulps on < 0.1% (same ``expf`` and IEEE division as PyTorch's kernel,
  so equality is expected -- the test prints the count -- but two builds of ``expf`` agreeing to
  the bit is not a documented guarantee).
* engine, bf16: teacher-forced logits of the fused engine are as close to an fp32 copy of the same
  weights as the unfused engine's are (fused-vs-unfused distance <= half the unfused-vs-fp32
  distance); greedy tokens equal the unfused engine's except where the two best logits are within
  the bf16 noise; CUDA-graph replays equal the eager runs they were captured from bit for bit and
  follow in-place norm updates (AQN).

Before each kernel call the caching allocator is handed back a block full of NaN, so an output
element a kernel forgot to write shows up as a mismatch.

Run on a CUDA machine: ``pytest -q -m gpu tests/kernels/test_fused_gpu.py`` (~1 min incl. Triton compiles).
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("triton", reason="the fused kernels need Triton (CPU CI has none)")
from quarl_kernels import fused_ops
from quarl_kernels.fused_ops import rms_norm_reference, rope_reference, silu_mul_reference

from quarl.engine import GREEDY_TOP_P, DecoderRunner, FastGenerator
from quarl.engine.rollout import SamplingParams, left_pad
from quarl.quant.formats.fp8 import quantize_act_1x128
from tests.engine.conftest import PAD, VOCAB, make_model, prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = [torch.bfloat16, torch.float16]


def _poison(nbytes: int = 64 << 20) -> None:
    """Fill a large cached block with NaN and free it: the next allocations reuse NaN memory."""
    torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0xFF)


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units of b's last place (b's dtype)."""
    mant = {torch.bfloat16: 7, torch.float16: 10}[b.dtype]
    bf = b.float()
    ulp = torch.exp2(torch.floor(torch.log2(bf.abs().clamp_min(1e-30))) - mant)
    return ((a.float() - bf).abs() / ulp).nan_to_num(0.0)


# --- RMSNorm ----------------------------------------------------------------------------------------
NORM_SHAPES = [  # rows x hidden: SmolLM2 576, Qwen2.5-0.5B 896, 7B 3584, 14B 5120, Qwen3 head rows 128
    (1, 576), (3, 896), (1, 3584), (8, 3584), (64, 5120), (2048, 3584), (7, 28, 128), (3, 1000),
]


FLAGS = [(False, False), (True, False), (True, True), (False, True)]  # residual, noise
NORM_CASES = [(torch.bfloat16, shape, *f) for shape in NORM_SHAPES for f in FLAGS] + [
    (torch.float16, shape, *f) for shape in ((1, 3584), (7, 28, 128), (3, 1000)) for f in FLAGS[::2]
]


@pytest.mark.parametrize("dtype,shape,res,noisy", NORM_CASES)
def test_rms_norm_matches_reference(dtype, shape, res, noisy):
    torch.manual_seed(hash((shape, res, noisy)) % 1000)
    n = shape[-1]
    x = (torch.randn(shape, device="cuda") * 3).to(dtype)
    r = torch.randn(shape, device="cuda").to(dtype) if res else None
    w = (1 + 0.3 * torch.randn(n, device="cuda")).to(dtype)
    z = torch.randn(n, device="cuda") * 0.02 if noisy else None
    fp8 = n % 128 == 0
    assert fused_ops.kernel_applies(x, w)
    _poison()
    out = fused_ops.rms_norm(x, w, 1e-6, residual=r, noise=z, fp8_out=fp8)
    out = out if isinstance(out, tuple) else (out,)
    y = out[0]
    yr, hr = rms_norm_reference(x, w, 1e-6, r, z)
    if res:
        assert torch.equal(out[1], hr), "the residual stream must be PyTorch's add exactly"
    e = ulps(y, yr)
    frac = (e > 0).float().mean().item()
    print(f"rms_norm {dtype} {shape} res={res} noise={noisy}: {frac:.2e} of outputs off, max {e.max().item()} ulp")
    assert e.max() <= 2 and frac < 0.01
    if fp8:
        q, s = out[-2], out[-1]
        qr, sr = quantize_act_1x128(y)  # on CUDA: PyTorch's own quantizer of the kernel's y
        assert torch.equal(s, sr) and torch.equal(q.view(torch.uint8), qr.view(torch.uint8))
    if noisy:  # passing Z == AQN writing (w.float() + Z).to(w.dtype) into the weight
        w_aqn = (w.float() + z).to(dtype)
        # the same kernel variant: fp8_out compiles another reduction order (H200: 2-ulp differences)
        again = fused_ops.rms_norm(x, w_aqn, 1e-6, residual=r, fp8_out=fp8)
        again = again if isinstance(again, tuple) else (again,)
        assert torch.equal(again[0], y)


def test_rms_norm_strided_rows_and_zero_rows():
    h = torch.randn(3, 9, 3584, device="cuda").to(torch.bfloat16)
    o = torch.randn(3, 9, 3584, device="cuda").to(torch.bfloat16)
    w = torch.randn(3584, device="cuda").to(torch.bfloat16)
    y, hh = fused_ops.rms_norm(o[:, -1], w, 1e-5, residual=h[:, -1])  # the engine's last-position slice
    yr, hr = rms_norm_reference(o[:, -1], w, 1e-5, h[:, -1])
    assert torch.equal(hh, hr) and ulps(y, yr).max() <= 2
    zero = torch.zeros(2, 256, device="cuda", dtype=torch.bfloat16)
    y, q, s = fused_ops.rms_norm(zero, w[:256], 1e-6, fp8_out=True)
    qr, sr = quantize_act_1x128(y)
    assert torch.equal(s, sr) and torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and not y.isnan().any()


# --- RoPE ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,L,H,HK,D", [(1, 1, 28, 4, 128), (64, 1, 40, 8, 128), (3, 17, 14, 2, 64),
                                        (2, 300, 9, 3, 80), (8, 1, 32, 32, 128)])
def test_rope_is_bit_exact(dtype, B, L, H, HK, D):
    torch.manual_seed(B * L + H)
    q = torch.randn(B, L, H, D, device="cuda").to(dtype).transpose(1, 2)  # the engine's views
    k = torch.randn(B, L, HK, D, device="cuda").to(dtype).transpose(1, 2)
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device="cuda").float() / D))
    emb = torch.arange(4096, device="cuda")[:, None].float() * inv
    emb = torch.cat((emb, emb), -1)
    pos = torch.randint(0, 4096, (B, L), device="cuda")
    cos, sin = emb.cos().to(dtype)[pos], emb.sin().to(dtype)[pos]  # [B, L, D] as DecoderRunner gathers them
    _poison()
    qo, ko = fused_ops.rope_qk(q, k, cos, sin)
    rq, rk = rope_reference(q, k, cos, sin)
    assert torch.equal(qo, rq) and torch.equal(ko, rk)
    # a decode step's K/V write in the same launch: the engine's cache row-slices, one slot per position
    v = torch.randn(B, L, HK, D, device="cuda").to(dtype).transpose(1, 2)
    kc = torch.full((B + 2, HK, L + 9, D), 3.0, device="cuda").to(dtype)[:B]
    vc = torch.full((B + 2, HK, L + 9, D), 3.0, device="cuda").to(dtype)[:B]
    slot = torch.randperm(L + 9, device="cuda")[:L]
    qo = fused_ops.rope_qk_cache(q, k, v, cos, sin, kc, vc, slot)
    assert torch.equal(qo, rq) and torch.equal(kc[:, :, slot], rk) and torch.equal(vc[:, :, slot], v)
    rest = torch.ones(L + 9, dtype=torch.bool, device="cuda")
    rest[slot] = False
    assert bool((kc[:, :, rest] == 3).all()) and bool((vc[:, :, rest] == 3).all())


# --- SiLU * up ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 18944), (8, 13824), (64, 18944), (3, 1001)])
def test_silu_mul_matches_pytorch(dtype, shape):
    torch.manual_seed(shape[0])
    g = (torch.randn(shape, device="cuda") * 4).to(dtype)
    u = torch.randn(shape, device="cuda").to(dtype)
    _poison()
    o = fused_ops.silu_mul(g, u)
    e = ulps(o, silu_mul_reference(g, u))
    n_off = int((e > 0).sum())
    print(f"silu_mul {dtype} {shape}: {n_off} of {o.numel()} outputs differ from PyTorch (max {e.max().item()} ulp)")
    assert e.max() <= 2 and n_off <= 1e-3 * o.numel()


# --- the engine -----------------------------------------------------------------------------------------
def greedy(T: int):
    return SamplingParams(temperature=1.0, top_p=GREEDY_TOP_P / 10, max_new_tokens=T)


def _models(kind: str = "qwen2"):
    bf16 = make_model(kind, dtype=torch.bfloat16, device="cuda")
    return bf16, copy.deepcopy(bf16).float()  # the same (bf16-valued) weights in fp32: the truth


def _teacher_forced_logits(runner, rows, tokens):
    """Prefill, then decode ``tokens [N, T]`` one by one -> logits ``[N, T + 1, V]`` (fp32)."""
    ids, mask = left_pad(rows, PAD, runner.device)
    N, P = ids.shape
    T = tokens.shape[1]
    st = runner.new_state(N, P + T + 1)
    out = [runner.prefill(st, ids, mask)]
    st.pos[:N] = mask.sum(dim=1, keepdim=True)
    st.slot.fill_(P)
    for t in range(T):
        st.tok[:N, 0] = tokens[:, t]
        runner.decode(st, N, P + t + 1)
        out.append(st.logits[:N].clone())
        st.slot.add_(1)
        st.pos.add_(1)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@torch.no_grad()
def test_fused_engine_logits_are_as_accurate_as_unfused(kind):
    bf16, fp32 = _models(kind)
    rows = prompts((5, 11, 2, 8))
    tokens = torch.randint(3, VOCAB, (len(rows), 12), device="cuda")
    fused, unfused = DecoderRunner(bf16, fused=True), DecoderRunner(bf16, fused=False)
    assert fused.fused_on() and not unfused.fused_on()
    lf = _teacher_forced_logits(fused, rows, tokens)
    lu = _teacher_forced_logits(unfused, rows, tokens)
    lt = _teacher_forced_logits(DecoderRunner(fp32, fused=True), rows, tokens)  # fp32: PyTorch path
    e_f, e_u, d = (lf - lt).norm().item(), (lu - lt).norm().item(), (lf - lu).norm().item()
    print(f"{kind}: |fused - fp32| {e_f:.4g}  |unfused - fp32| {e_u:.4g}  |fused - unfused| {d:.4g}")
    assert d <= 0.5 * e_u and e_f <= 1.25 * e_u


def _count_kernels(fn) -> tuple[int, set[str]]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    names = [e.name for e in prof.events() if e.device_type == cuda and "memcpy" not in e.name.lower()
             and "memset" not in e.name.lower()]
    return len(names), set(names)


@torch.no_grad()
def test_fused_decode_step_runs_the_kernels_and_launches_fewer():
    bf16, _ = _models("qwen3")
    rows = prompts((5, 9))
    counts = {}
    for flag in (True, False):
        r = DecoderRunner(bf16, fused=flag)
        ids, mask = left_pad(rows, PAD, r.device)
        st = r.new_state(len(rows), ids.shape[1] + 4)
        r.prefill(st, ids, mask)
        st.slot.fill_(ids.shape[1])
        L = ids.shape[1] + 1
        r.decode(st, len(rows), L)  # warm (Triton compiles)
        counts[flag] = _count_kernels(lambda r=r, st=st, L=L: r.decode(st, len(rows), L))
    n_fused, names = counts[True]
    n_unfused, _ = counts[False]
    layers = bf16.config.num_hidden_layers
    print(f"decode step kernels ({layers} layers): fused {n_fused}, unfused {n_unfused}")
    for k in ("_rms_norm_kernel", "_rope_kernel", "_silu_mul_kernel"):
        assert any(k in n for n in names), (k, sorted(names))
    assert n_fused < n_unfused


def test_graphs_capture_fused_kernels_and_follow_in_place_norms():
    """Replays equal the eager warm-up runs they were captured from (same kv buckets, so the same
    attention lengths), and after an in-place norm update they equal a freshly captured engine."""
    bf16, _ = _models("qwen2")
    rows = prompts((6, 3, 9))
    graphs = FastGenerator(bf16, PAD, kv_block=8, fused=True)
    assert graphs.runner.fused_on()
    first = graphs.generate(rows, greedy(20), n=1)  # eager warm-ups + captures + replays
    assert graphs.graph_error is None and graphs.last_stats["graph_captures"] >= 2
    again = graphs.generate(rows, greedy(20), n=1)  # replays only
    assert graphs.last_stats["graph_captures"] == 0
    assert torch.equal(again.completion_ids, first.completion_ids) and torch.equal(again.logprobs, first.logprobs)
    n_graphs = len(graphs._graphs)
    with torch.no_grad():  # AQN writes the norm weights in place: the captured kernels must read them
        for layer in bf16.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.add_(torch.randn_like(norm.weight) * 0.3)
    noisy = graphs.generate(rows, greedy(20), n=1)
    assert len(graphs._graphs) == n_graphs and graphs.last_stats["graph_captures"] == 0
    fresh = FastGenerator(bf16, PAD, kv_block=8, fused=True).generate(rows, greedy(20), n=1)
    assert torch.equal(noisy.completion_ids, fresh.completion_ids) and torch.equal(noisy.logprobs, fresh.logprobs)
    assert not torch.equal(noisy.logprobs, first.logprobs)


@torch.no_grad()
def test_greedy_tokens_fused_equal_unfused_up_to_bf16_ties():
    bf16, fp32 = _models("qwen2")
    rows = prompts((5, 11, 2, 8, 7, 3))
    a = FastGenerator(bf16, PAD, fused=True).generate(rows, greedy(24), n=1).completion_ids
    b = FastGenerator(bf16, PAD, fused=False).generate(rows, greedy(24), n=1).completion_ids
    # the bf16 noise of the logits: teacher-forced unfused bf16 against the fp32 copy, on b's tokens
    lu = _teacher_forced_logits(DecoderRunner(bf16, fused=False), rows, b)
    lt = _teacher_forced_logits(DecoderRunner(fp32), rows, b)
    noise = (lu - lt).abs().max().item()
    diverged = 0
    for i in range(len(rows)):
        diff = (a[i] != b[i]).nonzero()
        if len(diff) == 0:
            continue
        diverged += 1
        t = int(diff[0])
        gap = (lt[i, t, a[i, t]] - lt[i, t, b[i, t]]).abs().item()  # same prefix up to t: same logits row
        assert gap <= 2 * noise, (i, t, gap, noise)
    print(f"greedy: {diverged} of {len(rows)} rows diverge (each at a near-tie); bf16 logit noise {noise:.3g}")
    assert diverged <= len(rows) // 2


def test_compiled_fused_step_traces_the_custom_ops():
    """``compile=True`` traces the fused ops as opaque nodes (fake impls) and agrees with eager."""
    bf16, _ = _models("qwen3")
    rows = prompts((5, 9))
    eager = FastGenerator(bf16, PAD, fused=True).generate(rows, greedy(6), n=1)
    comp = FastGenerator(bf16, PAD, fused=True, compile=True, compile_backend="aot_eager")
    out = comp.generate(rows, greedy(6), n=1)
    assert comp.graph_error is None
    assert torch.equal(out.completion_ids, eager.completion_ids)
    torch.testing.assert_close(out.logprobs, eager.logprobs, atol=1e-3, rtol=0)
