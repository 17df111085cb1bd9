"""GPU correctness of the flash-decoding attention kernel (``quarl_kernels.decode_attn``) and of the engine
using it.

Bounds, and why:

* kernel vs an fp32 SDPA of the same bf16 / fp16 inputs: ``atol = rtol = 1e-2`` (outputs are
  weighted means of N(0, 1) values, |o| <~ 1). The kernel sums in fp32 in its own order, rounds the
  softmax weights ``p`` to the cache dtype before ``p @ v`` (as FlashAttention; <= 2^-8 relative per
  weight in bf16) and rounds ``o`` once (2^-9). The CPU interpreter measured ~2e-3.
* one split vs many: the same bound (the partials are combined in fp32, in split order).
* the same call twice, and a CUDA-graph replay vs the eager call it was captured from: **bit-equal**
  (no atomics; the split count is a function of the shapes and the SM count only).
* engine, bf16: teacher-forced logits with the kernel are as close to an fp32 copy of the model as
  with SDPA (``|kernel - fp32| <= 1.25 |sdpa - fp32|``); greedy tokens equal SDPA's except where the
  two best fp32 logits are within the bf16 noise.

Shapes: Qwen2.5-7B (H_kv 4, G 7, D 128) and 14B (H_kv 8, G 5, D 128) at batch 1 / 8 / 64 over
L = 1280 slots of a 2048-slot cache (the engine's strided ``[:, :, :L]`` view), with left padding.
Before each kernel call the caching allocator is handed back a block full of NaN, so an output element
the kernel forgot to write shows up.

Run on a CUDA machine: ``PYTHONPATH=$PWD:$PWD/kernels python -m pytest -q -m gpu tests/kernels/test_decode_attn_gpu.py``
(~1 min incl. Triton compiles).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the decode attention kernel needs Triton (CPU CI has none)")
from quarl_kernels import decode_attn as da
from quarl_kernels import fused_ops

from quarl.engine import GREEDY_TOP_P, DecoderRunner, FastGenerator
from quarl.engine.rollout import SamplingParams, left_pad
from tests.engine.conftest import PAD, VOCAB, prompts, teacher_forced_logits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MODELS = {"7b": (4, 7), "14b": (8, 5)}  # H_kv, G (D = 128)


def _poison(nbytes: int = 256 << 20) -> None:
    """Fill a large cached block with NaN and free it: the next allocations reuse NaN memory."""
    torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0xFF)


def inputs(B, HK, G, D=128, L=1280, S=2048, dtype=torch.bfloat16, seed=0):
    """q [B, H_kv, G, D]; the [:, :, :L] views of a [B, H_kv, S, D] cache; valid [:, :L] of a [B, S] mask
    with per-row left padding, the write slot L - 1 valid, unwritten slots past it zero and invalid."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, HK, G, D, device="cuda", generator=g).to(dtype)
    kc = torch.randn(B, HK, S, D, device="cuda", generator=g).to(dtype)
    vc = torch.randn(B, HK, S, D, device="cuda", generator=g).to(dtype)
    kc[:, :, L:] = 0
    vc[:, :, L:] = 0
    pad = torch.randint(0, L // 2, (B,), device="cuda", generator=g)
    pos = torch.arange(S, device="cuda")
    valid = (pos[None, :] >= pad[:, None]) & (pos[None, :] < L)  # [B, S]
    return q, kc[:, :, :L], vc[:, :, :L], valid[:, :L]


def ref(q, k, v, valid, scale):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=valid[:, None, None, :],
                                          scale=scale)


# --- the kernel ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("B", [1, 8, 64])
def test_kernel_matches_fp32_sdpa(model, B):
    HK, G = MODELS[model]
    q, k, v, valid = inputs(B, HK, G, seed=B)
    assert not k.is_contiguous() and fused_ops.decode_attn_kernel_applies(q, k, v, valid)
    splits = da.num_splits(B * HK, k.shape[2], torch.cuda.get_device_properties(0).multi_processor_count)
    _poison()
    o = fused_ops.decode_attention(q, k, v, valid, 128 ** -0.5)  # through the op: the kernel on CUDA
    r = ref(q, k, v, valid, 128 ** -0.5)
    err = (o.float() - r).abs().max().item()
    print(f"{model} B={B}: {splits} splits, max |o - fp32 sdpa| {err:.2e}")
    assert o.dtype == q.dtype and o.is_contiguous() and not o.isnan().any()
    torch.testing.assert_close(o.float(), r, atol=1e-2, rtol=1e-2)
    assert torch.equal(o, da.decode_attention(q, k, v, valid, 128 ** -0.5))  # deterministic, op == kernel


@pytest.mark.parametrize("dtype,D,G", [(torch.float16, 128, 7), (torch.bfloat16, 64, 8), (torch.bfloat16, 64, 1)])
def test_kernel_dtypes_head_dims_and_groups(dtype, D, G):
    q, k, v, valid = inputs(3, 2, G, D=D, L=777, S=1000, dtype=dtype, seed=G)
    _poison()
    for splits in (None, 1, 5):
        o = da.decode_attention(q, k, v, valid, D ** -0.5, splits=splits)
        torch.testing.assert_close(o.float(), ref(q, k, v, valid, D ** -0.5), atol=1e-2, rtol=1e-2)


def test_splits_agree_and_edge_rows():
    q, k, v, valid = inputs(4, 4, 7, L=1280, seed=3)
    valid = valid.clone()
    valid[1] = False
    valid[1, -1] = True  # only the write slot: o is that slot's v exactly
    valid[2] = False  # no valid slot (never made by the engine): zeros, not NaN
    outs = {s: da.decode_attention(q, k, v, valid, 0.1, splits=s) for s in (1, 3, 20, 64)}
    for s, o in outs.items():
        assert torch.equal(o[1], v[1, :, -1:].expand(4, 7, 128)), s
        assert torch.equal(o[2], torch.zeros_like(o[2])), s
        torch.testing.assert_close(o.float(), outs[1].float(), atol=1e-2, rtol=1e-2)
    keep = torch.tensor([0, 3], device="cuda")
    torch.testing.assert_close(outs[20][keep].float(), ref(q, k, v, valid, 0.1)[keep], atol=1e-2, rtol=1e-2)


def test_other_head_dims_take_sdpa():
    q, k, v, valid = inputs(2, 2, 4, D=80, L=100, S=128)
    assert not fused_ops.decode_attn_kernel_applies(q, k, v, valid)
    out = fused_ops.decode_attention(q, k, v, valid, 0.1)
    assert torch.equal(out, fused_ops.decode_attention_reference(q, k, v, valid, 0.1))


@pytest.mark.parametrize("B", [1, 64])
def test_cuda_graph_capture_and_replay(B):
    """Captured with its workspace from the graph pool; replays equal eager calls bit for bit and read the
    cache and mask in place (new contents, same addresses)."""
    q, k, v, valid = inputs(B, 4, 7, seed=11)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fused_ops.decode_attention(q, k, v, valid, 0.1)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fused_ops.decode_attention(q, k, v, valid, 0.1)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fused_ops.decode_attention(q, k, v, valid, 0.1))
    q2, k2, v2, valid2 = inputs(B, 4, 7, seed=12)
    q.copy_(q2)
    k.copy_(k2)
    v.copy_(v2)
    valid.copy_(valid2)
    g.replay()
    torch.cuda.synchronize()
    eager = fused_ops.decode_attention(q, k, v, valid, 0.1)
    assert torch.equal(out, eager)
    torch.testing.assert_close(out.float(), ref(q, k, v, valid, 0.1), atol=1e-2, rtol=1e-2)


# --- the engine -----------------------------------------------------------------------------------------
def _models(kind: str, head_dim: int = 128):
    from tests.engine.test_decode_attn import attn_model

    bf16 = attn_model(kind, dtype=torch.bfloat16, head_dim=head_dim).cuda()
    fp32 = attn_model(kind, dtype=torch.float32, head_dim=head_dim).cuda()
    return bf16, fp32


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_engine_logits_with_the_kernel_are_as_accurate_as_sdpa(kind):
    bf16, fp32 = _models(kind)
    rows = prompts((70, 5, 200, 33))
    tokens = torch.randint(3, VOCAB, (len(rows), 12), device="cuda")
    on, off = DecoderRunner(bf16), DecoderRunner(bf16, decode_attn=False)
    assert on.fused_on() and on.decode_attn and not off.decode_attn
    lk, ls = teacher_forced_logits(on, rows, tokens), teacher_forced_logits(off, rows, tokens)
    lt = teacher_forced_logits(DecoderRunner(fp32), rows, tokens)  # fp32: SDPA by the eligibility rules
    e_k, e_s, d = (lk - lt).norm().item(), (ls - lt).norm().item(), (lk - ls).norm().item()
    print(f"{kind}: |kernel - fp32| {e_k:.4g}  |sdpa - fp32| {e_s:.4g}  |kernel - sdpa| {d:.4g}")
    assert e_k <= 1.25 * e_s


def _kernel_names(fn) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return {e.name for e in prof.events() if e.device_type == cuda}


@torch.no_grad()
def test_engine_graphs_run_the_kernel_and_greedy_tokens_match_sdpa_up_to_ties():
    bf16, fp32 = _models("qwen2")
    rows = prompts((5, 11, 2, 8, 7, 3))
    greedy = SamplingParams(temperature=1.0, top_p=GREEDY_TOP_P / 10, max_new_tokens=24)
    eng = FastGenerator(bf16, PAD, kv_block=64)
    a = eng.generate(rows, greedy, n=1)
    assert eng.graph_error is None and eng.last_stats["graph_captures"] >= 1
    again = eng.generate(rows, greedy, n=1)  # replays only
    assert torch.equal(again.completion_ids, a.completion_ids) and torch.equal(again.logprobs, a.logprobs)
    b = FastGenerator(bf16, PAD, kv_block=64, decode_attn=False).generate(rows, greedy, n=1)
    lu = teacher_forced_logits(DecoderRunner(bf16, decode_attn=False), rows, b.completion_ids)
    lt = teacher_forced_logits(DecoderRunner(fp32), rows, b.completion_ids)
    noise = (lu - lt).abs().max().item()
    diverged = 0
    for i in range(len(rows)):
        diff = (a.completion_ids[i] != b.completion_ids[i]).nonzero()
        if len(diff) == 0:
            continue
        diverged += 1
        t = int(diff[0])
        gap = (lt[i, t, a.completion_ids[i, t]] - lt[i, t, b.completion_ids[i, t]]).abs().item()
        assert gap <= 2 * noise, (i, t, gap, noise)
    print(f"greedy: {diverged} of {len(rows)} rows diverge (each at a near-tie); bf16 logit noise {noise:.3g}")
    assert diverged <= len(rows) // 2

    r = DecoderRunner(bf16)
    ids, mask = left_pad(rows, PAD, r.device)
    st = r.new_state(len(rows), 128)
    r.prefill(st, ids, mask)
    st.slot.fill_(ids.shape[1])
    r.decode(st, len(rows), 64)  # warm (Triton compiles)
    names = _kernel_names(lambda: r.decode(st, len(rows), 64))
    assert any("_decode_attn_kernel" in n for n in names), sorted(names)
    r.decode_attn = False
    assert not any("_decode_attn_kernel" in n for n in _kernel_names(lambda: r.decode(st, len(rows), 64)))


def test_compiled_step_traces_the_attention_op():
    bf16, _ = _models("qwen3", head_dim=64)
    rows = prompts((5, 9))
    greedy = SamplingParams(temperature=1.0, top_p=GREEDY_TOP_P / 10, max_new_tokens=6)
    eager = FastGenerator(bf16, PAD).generate(rows, greedy, n=1)
    comp = FastGenerator(bf16, PAD, compile=True, compile_backend="aot_eager")
    out = comp.generate(rows, greedy, n=1)
    assert comp.graph_error is None
    assert torch.equal(out.completion_ids, eager.completion_ids)
    torch.testing.assert_close(out.logprobs, eager.logprobs, atol=1e-3, rtol=0)
