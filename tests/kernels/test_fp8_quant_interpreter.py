"""The fused FP8 quantizers (``quarl_kernels.fp8_quant``) on CPU through ``TRITON_INTERPRET=1``.

Bit-for-bit against the PyTorch quantizers on the same device (the oracle): codes compared
as bytes, scales with ``torch.equal``. Covered: every layout the FP8 linear needs (1x128
along K, 1x128 along the tokens of the transpose, 128x128 tiles and their transpose), rows
padded to 4 and to 128, K not a multiple of 128 (SmolLM2's 576), strided inputs, bf16 /
fp16 / fp32, all-zero groups and tiles, and *exact ties*: values at the midpoint between two
E4M3 codes (and scaled by a power of two, so ``x / scale`` lands on the tie), which must
round to the even code as ``torch``'s cast does. Then ``fp8_linear`` forward + both
gradients with the Triton quantizers (``QUARL_FP8_QUANT=triton``) against the eager ones:
equal, bit for bit, since the GEMM operands are equal.

The interpreter runs the Triton program, not the machine code, so it could not see the W^T bug
the H100 found (a ptxas miscompile for fp32 weights; it passes the failing 1536 x 576 fp32 case
with the old kernel too). The last two tests therefore compile the GPU tests' launches for sm_90
on this CPU and check the PTX, the spills and, with ``tests/kernels/sm90_sass.py``, the SASS for
FP8 codes stored from registers a loop iteration has not written yet (docs/kernels.md, "The W^T
bug").

Skipped unless Triton is importable and NumPy < 2.3 (as the other interpreter tests; CPU CI
has no Triton). Run here with a side venv that has it (docs/kernels.md).
"""

from __future__ import annotations

import functools
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.kernels.interpreter import needs_interpreter, needs_triton, run_interpreted

ROOT = Path(__file__).resolve().parents[2]

pytestmark = needs_interpreter

SCRIPT = textwrap.dedent("""
    import os
    import time
    import torch
    T0 = time.time()
    from quarl_kernels import fp8_quant as fq
    from quarl.quant.formats.fp8 import FP8_DTYPE, quantize_act_1x128
    from quarl.quant.fp8_linear import _pad2, _round_up, quantize_weight_128x128, quantize_weight_padded

    def same(a, b):
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))

    # exact ties: the midpoints between consecutive positive E4M3 values (representable in bf16 / fp32)
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(FP8_DTYPE).float()  # 0 .. 448, increasing
    mids = (codes[:-1] + codes[1:]) / 2
    tie_row = torch.cat([torch.tensor([448.0]), mids, -mids, torch.tensor([-0.0])])  # amax 448: scale 1 (x 2^e)

    def act_cases():
        torch.manual_seed(0)
        for m, k, dt in ((1, 128, torch.bfloat16), (5, 576, torch.bfloat16), (130, 256, torch.float32),
                         (260, 384, torch.float16), (64, 384, torch.bfloat16)):
            x = torch.randn(m, k) * torch.logspace(-3, 3, m)[:, None]  # rows of very different range
            if m > 3:
                x[2, :] = 0  # zero groups along K
            if k > 128:
                x[:, :128] = 0  # a zero column block: zero groups along the tokens too
            yield f"rand {m}x{k} {dt}", x.to(dt)
        t = tie_row * 2.0 ** -7  # [254]: amax 448 * 2^-7, so the scale is 2^-7 and x / scale is the tie
        x = torch.stack([t, t.flip(0), t * 2.0 ** -5, t.roll(7)])  # [4, 254]; a K group of 128 may lack the
        # 448 (its own amax, so other ties), t * 2^-5 keeps subnormal ties
        yield "ties fp32", x
        yield "ties bf16", x.to(torch.bfloat16)
        yield "ties^T", x.t().contiguous()  # the ties along the token axis
        base = torch.randn(40, 600).to(torch.bfloat16)
        yield "strided view", base[3:33:2, 7:583]  # row stride 1200, K = 576
        yield "transposed view", base.t()[:300]  # column-major input

    for name, x in act_cases():
        m, k = x.shape
        for rows, t_rows in ((m, None), (_round_up(m, 4), _round_up(m, 128)), (None, _round_up(m, 128))):
            kp = _round_up(k, 128)
            q, s, qt, st = fq.quantize_act(x, rows or m, kp, t_rows, row_groups=rows is not None)
            if rows is not None:
                rq, rs = quantize_act_1x128(_pad2(x, rows, kp))
                assert q.shape == (rows, kp) and s.shape == (rows, kp // 128) and s.stride() == (1, rows)
                assert same(q, rq) and torch.equal(s, rs), (name, rows, "1x128 along K")
            if t_rows is not None:
                rqt, rst = quantize_act_1x128(_pad2(x, t_rows, kp).t())
                assert qt.shape == (kp, t_rows) and st.shape == (kp, t_rows // 128) and st.stride() == (1, kp)
                assert same(qt, rqt) and torch.equal(st, rst), (name, t_rows, "1x128 along tokens")
                # X^T in 128x128 tiles (fp8_wgrad=tiles): the padded x's weight-format tiles, transposed
                _, _, qt, st = fq.quantize_act(x, rows or m, kp, t_rows, row_groups=rows is not None, t_tiles=True)
                rq, rs = quantize_weight_padded(_pad2(x, t_rows, kp))
                assert qt.shape == (kp, t_rows) and st.shape == (kp // 128, t_rows // 128) and st.is_contiguous()
                assert same(qt, rq.t()) and torch.equal(st, rs.t()), (name, t_rows, "128x128 tiles of x^T")
        print("act", name, "ok", round(time.time() - T0, 1))
    # the ties were ties and went to the even neighbour: some down, some up (not half-up, not half-down)
    row = torch.cat([torch.tensor([448.0]), mids])[None, :]  # [1, 127]: one group, scale exactly 1
    q, s, _, _ = fq.quantize_act(row, 1, 128)
    got = q.float()[0, 1:127]  # the 126 midpoints' codes
    assert s.item() == 1.0 and same(q[:, :127], quantize_act_1x128(row)[0])
    assert ((got == codes[:-1]) | (got == codes[1:])).all()
    assert (got == codes[:-1]).sum() > 20 and (got == codes[1:]).sum() > 20

    torch.manual_seed(1)
    # 1536 x 576 fp32: the configuration whose W^T was wrong on the H100 (ptxas, not the program: see
    # test_fp8_quantizers_sass_no_stale_codes); the interpreter passed it before the fix as well
    for n, k, dt in ((200, 576, torch.float32), (128, 128, torch.bfloat16), (129, 130, torch.float16),
                     (256, 384, torch.float32), (1536, 576, torch.float32)):
        w = torch.randn(n, k).to(dt)
        w[:128, 128:] = 0  # a zero tile (where there is one)
        for tr in (False, True):
            q, s, qt = fq.quantize_tiles(w, tr)
            rq, rs = quantize_weight_padded(w)
            fq8, fs = quantize_weight_128x128(w)  # the weight format itself (compressed-tensors' bits)
            assert same(q, rq) and torch.equal(s, rs) and same(q[:n, :k], fq8) and torch.equal(s, fs), (n, k)
            assert not q[n:].view(torch.uint8).any() and not q[:, k:].view(torch.uint8).any()
            assert (qt is None) == (not tr) and (qt is None or same(qt, rq.t()))
        print("tiles", n, k, dt, "ok", round(time.time() - T0, 1))
    wt = torch.cat([tie_row[:254], tie_row[:2]])[None, :].repeat(3, 1) * 2.0 ** 3  # ties in a weight tile
    assert same(fq.quantize_tiles(wt)[0], quantize_weight_padded(wt)[0])

    # the FP8 linear: Triton quantizers == eager quantizers, end to end (forward, DGrad, WGrad, bias)
    from quarl.quant import QTensor
    from quarl.quant.formats.fp8 import FP8Config
    from quarl.quant.fp8_linear import fp8_linear, quant_backend

    def run(backend, x, w, b, g, wgrad="1x128"):
        os.environ["QUARL_FP8_QUANT"] = backend
        assert quant_backend(x) == backend
        xx = x.clone().requires_grad_()
        ww = w.clone().requires_grad_() if not isinstance(w, QTensor) else w
        bb = b.clone().requires_grad_()
        y = fp8_linear(xx, ww, bb, wgrad=wgrad)
        y.backward(g)
        return y, xx.grad, ww.grad if not isinstance(w, QTensor) else None, bb.grad

    torch.manual_seed(2)
    for m, n, k, dt in ((100, 200, 576, torch.float32), (17, 384, 256, torch.bfloat16), (64, 128, 128, torch.float32)):
        x = torch.randn(2, m, k).to(dt)  # 200 / 34 / 128 tokens: two token groups, one short, one full
        w = (torch.randn(n, k) * 0.05).to(dt)
        b, g = torch.randn(n).to(dt), torch.randn(2, m, n).to(dt)
        for wgrad in ("1x128", "tiles"):
            outs = {be: run(be, x, w, b, g, wgrad) for be in ("eager", "triton")}
            for a, e in zip(outs["triton"], outs["eager"]):
                assert a.dtype == e.dtype and torch.equal(a, e), (m, n, k, dt, wgrad)
        qw, sw = quantize_weight_padded(w)
        frozen = QTensor(FP8Config("block"), (n, k), {"weight": qw[:n, :k].contiguous(), "weight_scale": sw})
        outs = {be: run(be, x, frozen, b, g) for be in ("eager", "triton")}
        assert all(a is None and e is None or torch.equal(a, e) for a, e in zip(outs["triton"], outs["eager"]))
        print("fp8_linear", m, n, k, dt, "ok", round(time.time() - T0, 1))

    # every launch setting the run-time choice may take gives the same bits (the rows per chunk change the
    # loops; warps do not exist in the interpreter: the sm_90 SASS test below covers them)
    x = (torch.randn(300, 640) * torch.logspace(-2, 2, 300)[:, None]).to(torch.bfloat16)
    ref = fq.quantize_act(x, 300, 640, 384, sub=fq.SUB, warps=fq.WARPS)
    ref_t = fq.quantize_act(x, 300, 640, 384, t_tiles=True, sub=fq.SUB, warps=fq.WARPS)
    for setting in fq.ACT_SETTINGS:
        sub, warps, pack, split, t_chunk = fq.parse_setting(setting)
        kw = dict(sub=sub, warps=warps, pack=pack, split=split, t_chunk=t_chunk)
        got = fq.quantize_act(x, 300, 640, 384, **kw)
        assert same(got[0], ref[0]) and same(got[2], ref[2]), setting
        assert torch.equal(got[1], ref[1]) and torch.equal(got[3], ref[3]), setting
        got = fq.quantize_act(x, 300, 640, 384, row_groups=False, **kw)
        assert same(got[2], ref[2]) and torch.equal(got[3], ref[3]), setting
        for rg in (True, False):  # X^T's tiles
            got = fq.quantize_act(x, 300, 640, 384, row_groups=rg, t_tiles=True, **kw)
            assert same(got[2], ref_t[2]) and torch.equal(got[3], ref_t[3]), (setting, "tiles")
            assert not rg or (same(got[0], ref[0]) and torch.equal(got[1], ref[1])), (setting, "tiles")
    w = torch.randn(256, 384)
    ref = fq.quantize_tiles(w, True, sub=fq.SUB, warps=fq.WARPS)
    for sub, warps in fq.TILE_SETTINGS:
        got = fq.quantize_tiles(w, True, sub=sub, warps=warps)
        assert same(got[0], ref[0]) and same(got[2], ref[2]) and torch.equal(got[1], ref[1]), (sub, warps)
    print("settings ok", round(time.time() - T0, 1))
    print("OK")
""")


def test_fp8_quantizers_under_triton_interpreter():
    run_interpreted(SCRIPT)


# --- they lower for Hopper (no GPU needed) --------------------------------------------------------
# The launches of the GPU tests' shapes, built by the quantizers' own launch code on CPU tensors (never
# written) and compiled as on a CUDA device: SCALE_RECIP (CUDA's fp32(1/448)), no interpreter.
LAUNCHES = {  # name: (kind, dtype, shape, transpose / t_rows)
    "tiles fp32 1536x576 +T": ("tiles", "float32", (1536, 576), True),  # failed on the H100 (W^T rows 1 mod 4)
    "tiles fp32 1536x576": ("tiles", "float32", (1536, 576), False),  # fp8-rollout's FP8 cast of fp32 weights
    "tiles bf16 18944x3584 +T": ("tiles", "bfloat16", (18944, 3584), True),
    "act bf16 8192x3584 K+T": ("act", "bfloat16", (8192, 3584), True),  # X / dY: both groupings
    "act fp32 300x640 K+T": ("act", "float32", (300, 640), True),
    "act bf16 4099x576 K": ("act", "bfloat16", (4099, 576), None),  # rows only (frozen base, decode)
    "act bf16 1000x18944 T": ("act", "bfloat16", (1000, 18944), "t-only"),  # dY^T only (no DGrad wanted)
    "act bf16 8192x3584 K+Ttiles": ("act", "bfloat16", (8192, 3584), "tiles"),  # X, fp8_wgrad=tiles
}
# The other launch settings the kernels may choose at run time (quarl_kernels.fp8_quant.ACT_SETTINGS /
# TILE_SETTINGS after the default; test_launch_settings_are_all_checked keeps these lists equal), compiled for
# the launches that store transposed codes (the W^T bug's pattern): (rows per chunk, warps)
ACT_SETTINGS = ((32, 8), (32, 4), (64, 8), (64, 16), (128, 16), (64, 8, True), (32, 4, True),
                (32, 4, False, 32, 4), (64, 8, False, 32, 4), (32, 4, False, 64, 8), (64, 8, False, 64, 8),
                (64, 8, False, 128, 8), (32, 4, False, 16, 2), (32, 4, False, 32, 2),
                (32, 4, False, 0, 0, 32), (64, 8, False, 0, 0, 64),
                (16, 4, False, 0, 0, 32), (32, 8, False, 0, 0, 32), (64, 8, False, 0, 0, 32), (32, 4, False, 0, 0, 16),
                (32, 4, 2, 16, 2), (32, 4, 2, 64, 8), (64, 8, 2, 64, 8))
TILE_SETTINGS = ((32, 8), (32, 4), (64, 8))
for _st in ACT_SETTINGS[1:]:
    LAUNCHES[f"act bf16 8192x3584 K+T {_st}"] = ("act", "bfloat16", (8192, 3584), True, _st)
    LAUNCHES[f"act fp32 300x640 K+T {_st}"] = ("act", "float32", (300, 640), True, _st)
    if len(_st) == 2:  # X^T packing or splitting changes nothing without X^T
        LAUNCHES[f"act bf16 4099x576 K {_st}"] = ("act", "bfloat16", (4099, 576), None, _st)
    LAUNCHES[f"act bf16 1000x18944 T {_st}"] = ("act", "bfloat16", (1000, 18944), "t-only", _st)
    if len(_st) != 3:  # X^T's tiles (packing is not a candidate that changes anything new there)
        LAUNCHES[f"act bf16 8192x3584 K+Ttiles {_st}"] = ("act", "bfloat16", (8192, 3584), "tiles", _st)
for _st in TILE_SETTINGS[1:]:
    LAUNCHES[f"tiles fp32 1536x576 +T {_st}"] = ("tiles", "float32", (1536, 576), True, _st)
    LAUNCHES[f"tiles bf16 18944x3584 +T {_st}"] = ("tiles", "bfloat16", (18944, 3584), True, _st)


@functools.cache
def _compiled(name: str):
    import torch
    from quarl_kernels import fp8_quant as fq

    from tests.kernels.sm90_sass import compile_launch

    kind, dt, (m, k), t, *setting = LAUNCHES[name]
    sub, warps, pack, split, t_chunk = fq.parse_setting(setting[0] if setting else (fq.SUB, fq.WARPS))
    x = torch.empty(m, k, dtype=getattr(torch, dt))
    if kind == "tiles":
        q, qt, s = fq._tile_outputs(x, t)
        launch = fq._tile_launch(x, q, qt, s, sub, warps)
    else:
        rows, cols = -(-m // 4) * 4, -(-k // 128) * 128
        t_rows = -(-m // 128) * 128 if t else None
        tiles = t == "tiles"
        launch = fq._act_launch(x, *fq._act_outputs(x, rows, cols, t_rows, t != "t-only", tiles), rows, cols, t_rows,
                                sub, warps, pack, *(split or (0, 0)), t_chunk=t_chunk, t_tiles=tiles)
    launches = launch if isinstance(launch, tuple) and not isinstance(launch, fq.Launch) else (launch,)
    return [compile_launch(one, SCALE_RECIP=True, INTERPRET=False) for one in launches]  # a split setting: two




@needs_triton
def test_launch_settings_are_all_checked():
    """A setting added to the run-time choice must be added to the sm_90 checks here too."""
    from quarl_kernels import fp8_quant as fq

    assert fq.ACT_SETTINGS == ACT_SETTINGS and fq.TILE_SETTINGS == TILE_SETTINGS
    assert fq.ACT_SETTINGS[0] == fq.TILE_SETTINGS[0] == (fq.SUB, fq.WARPS)


@needs_triton
def test_tune_mode_names_a_bad_value(monkeypatch):
    from quarl_kernels import fp8_quant as fq

    monkeypatch.delenv("QUARL_FP8_TUNE", raising=False)
    assert fq.tune_mode() == "situ"  # the default
    for v, mode in (("", "situ"), ("1", "1"), ("Situ", "situ"), ("0", "0")):
        monkeypatch.setenv("QUARL_FP8_TUNE", v)
        assert fq.tune_mode() == mode
    monkeypatch.setenv("QUARL_FP8_TUNE", "warm")
    with pytest.raises(ValueError, match="QUARL_FP8_TUNE='warm'.*situ"):
        fq.tune_mode()


@needs_triton
def test_in_situ_trial_times_the_fastest_few_where_they_run(monkeypatch):
    """QUARL_FP8_TUNE=situ: the back-to-back timing picks the finalists (its fastest SITU_FINALISTS), the caller's
    launches then run them in turn, each timed alone (here: fake events whose time is the setting's in-situ cost),
    and the median of SITU_SAMPLES each decides -- here against the back-to-back order."""
    import torch
    from quarl_kernels import fp8_quant as fq

    cold = {(1,): 1.0, (2,): 1.1, (3,): 1.2, (4,): 1.3, (5,): 1.4}  # back to back: (1,) fastest
    hot = {(1,): 2.0, (2,): 1.5, (3,): 1.9, (4,): 1.6}  # in situ: (2,) fastest; (5,) is no finalist
    launched, now = [], [0.0]

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = now[0]

        def query(self):
            return True

        def elapsed_time(self, end):
            return end.t - self.t

    def launch(la):
        launched.append(la)
        now[0] += hot.get(la, 0.0)

    monkeypatch.setenv("QUARL_FP8_TUNE", "situ")
    monkeypatch.setattr(fq, "TUNED", {})
    monkeypatch.setattr(fq, "_TRIALS", {})
    monkeypatch.setattr(fq, "tuning_on", lambda t: True)
    monkeypatch.setattr(fq, "_cuda_ms", lambda la, run=None: cold[la])
    monkeypatch.setattr(fq, "_launch", launch)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    key, settings, make = ("situ-test",), tuple(cold), lambda *st: st
    n = fq.SITU_FINALISTS * fq.SITU_SAMPLES
    runs = [fq.run_setting(key, settings, None, make) for _ in range(n)]
    k = fq.SITU_FINALISTS  # the finalists in shuffled rounds, (5,) never
    assert all(sorted(runs[i:i + k]) == [(1,), (2,), (3,), (4,)] for i in range(0, n, k)) and len(set(runs)) == k
    assert len({tuple(runs[i:i + k]) for i in range(0, n, k)}) > 1  # not one fixed rotation
    assert key in fq._TRIALS and "situ_ms" not in fq.TUNED[key]
    assert fq.run_setting(key, settings, None, make) == (2,)  # the trial decides on the next call
    assert fq.TUNED[key]["best"] == (2,) and fq.TUNED[key]["situ_ms"] == pytest.approx(hot)
    assert fq.TUNED[key]["ms"] == cold and key not in fq._TRIALS
    assert fq.run_setting(key, settings, None, make) == (2,) and launched[-1] == (2,)
    monkeypatch.setattr(fq, "_cuda_ms", lambda la, run=None: cold[la] * fq.SITU_MIN_MS / 2)
    assert fq.run_setting(("short-test",), settings, None, make) == (1,) and not fq._TRIALS  # too short to trial
    monkeypatch.setattr(fq, "_cuda_ms", lambda la, run=None: cold[la])
    monkeypatch.setenv("QUARL_FP8_TUNE", "1")  # back to back alone: no trial
    assert fq.run_setting(("cold-test",), settings, None, make) == (1,) and not fq._TRIALS


@needs_triton
def test_pick_setting_takes_the_fastest_and_keeps_it():
    from quarl_kernels import fp8_quant as fq

    timed = []

    def timer(la):
        timed.append(la)
        if la == (64, 8):
            raise RuntimeError("out of resources")  # a setting that cannot run is no candidate
        return {(32, 8): 2.0, (32, 4): 1.5, (16, 4): 3.0}[la]

    key, settings = ("test", id(timer)), ((32, 8), (32, 4), (64, 8), (16, 4))
    try:
        assert fq.pick_setting(key, settings, lambda s, w: (s, w), timer) == (32, 4)
        assert fq.TUNED[key]["ms"] == {(32, 8): 2.0, (32, 4): 1.5, (16, 4): 3.0}
        assert fq.pick_setting(key, settings, lambda s, w: (s, w), timer) == (32, 4) and len(timed) == 4
        assert fq.pick_setting(("none",), ((32, 8),), lambda s, w: (s, w), lambda la: 1 / 0) == (32, 8)
    finally:
        fq.TUNED.pop(key, None)
        fq.TUNED.pop(("none",), None)


@needs_triton
def test_fp8_quantizers_compile_for_sm90():
    """The PTX has the saturating RNE E4M3 cast, CUDA PyTorch's fp32(1/448), and no division: the correctly rounded
    quotient is ``group_div``'s (the reciprocal per group, div.rn's fast path per element; no approximate
    ``div.full``); with the launch's specializations (unit K stride, 16-divisible sizes) ptxas spills nothing."""
    from tests.kernels.sm90_sass import cuobjdump

    for name, (k, _) in ((n, c) for n in LAUNCHES for c in _compiled(n)):
        ptx = k.asm["ptx"]
        assert "rcp.approx.ftz.f32" in ptx and "fma.rn.f32" in ptx, name
        assert "div.rn.f32" not in ptx and "div.full" not in ptx and "div.approx" not in ptx, name
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and "0f3B124925" in ptx, name  # fp32(1/448)
        if cuobjdump() is not None:  # ptxas' spill space
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(k.asm["cubin"])
                f.flush()
                out = subprocess.run([str(cuobjdump()), "-res-usage", f.name], capture_output=True, text=True,
                                     check=False).stdout
            assert int(out.split("STACK:")[1].split()[0]) == 0, f"{name}: ptxas spilled registers"


@needs_triton
def test_fp8_quantizers_sass_no_stale_codes():
    """No FP8 code byte is stored from a register the loop iteration has not written yet (the W^T bug: ptxas
    12.8 did that for the fp32 weight kernel's transposed store, rows k = 1 mod 4; before the fix this test
    fails on "tiles fp32 1536x576 +T" with four such byte stores per chunk)."""
    from tests.kernels.sm90_sass import cuobjdump, stale_code_stores

    if cuobjdump() is None:
        pytest.skip("the Triton wheel ships no cuobjdump")
    found = {name: [bad for _, sass in _compiled(name) for bad in stale_code_stores(sass)] for name in LAUNCHES}
    assert not any(found.values()), {n: v for n, v in found.items() if v}


IN_PLACE_SCRIPT = textwrap.dedent("""
    import os
    os.environ["QUARL_FP8_QUANT"] = "triton"
    import torch
    from quarl.quant import fp8_linear as fl

    def same(a, b):
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))

    torch.manual_seed(0)
    for grad in (True, False):
        w = (torch.randn(300, 640) * 0.05).to(torch.bfloat16).requires_grad_(grad)
        q, s = fl._master_tiles(w)
        qt = q._quarl_t[1] if grad else None
        st = fl._scales_t(s)
        where = (q.data_ptr(), s.data_ptr(), qt.data_ptr() if grad else None)
        with torch.no_grad():
            w.data.mul_(-3.0)  # a write that moves no version counter, as a fused optimizer's
        fl.weights_changed()
        q2, s2 = fl._master_tiles(w)
        assert (q2.data_ptr(), s2.data_ptr(), q2._quarl_t[1].data_ptr() if grad else None) == where  # in place
        rq, rs = fl.quantize_weight_padded(w.detach().clone())  # fresh tensors
        assert same(q2, rq) and torch.equal(s2, rs)
        assert not torch.equal(st, rs.t()) and torch.equal(fl._scales_t(s2), rs.t())  # the transposed scales re-made
        if grad:
            assert same(fl._transposed(q2), rq.t())
            x = torch.randn(8, 640).to(torch.bfloat16).requires_grad_()
            y = fl.fp8_linear(x, w)
            y.sum().backward()
            w2 = w.detach().clone().requires_grad_()
            x2 = x.detach().clone().requires_grad_()
            y2 = fl.fp8_linear(x2, w2)
            y2.sum().backward()
            assert torch.equal(y, y2) and torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)
    print("OK")
""")


def test_master_tiles_remade_in_place_under_triton_interpreter():
    """A changed master weight's tiles (and transposed tiles) are re-quantized by the Triton kernel into their old
    storage -- the same bits as fresh tiles, the DGrad operand's transposed scales re-made (their cache keys on the
    version the kernel does not move by itself), forward and both gradients as with a fresh weight."""
    run_interpreted(IN_PLACE_SCRIPT)


STACK_SCRIPT = textwrap.dedent("""
    import os
    os.environ["QUARL_FP8_QUANT"] = "triton"
    import torch
    from quarl_kernels import fp8_quant as fq
    from quarl.quant import fp8_linear as fl, fp8_stack

    def same(a, b):
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))

    torch.manual_seed(0)
    # several operands quantized into the blocks of one stacked operand (out=): each block its own quantization
    widths, m = (256, 128, 128), 37
    mp, mt, n = 40, 128, sum(widths)
    dys = [torch.randn(m, w).to(torch.bfloat16) for w in widths]
    dys[1] = torch.randn(widths[1], m).to(torch.bfloat16).t()  # a strided input
    for setting in ((fq.SUB, fq.WARPS), (32, 4, False, 32, 4), (64, 8, True), (32, 4, False, 0, 0, 32)):
        for rows_too, t_rows in ((True, mt), (False, mt), (True, None)):
            sub, warps, pack, split, t_chunk = fq.parse_setting(setting)
            q = torch.empty(mp, n, dtype=torch.float8_e4m3fn) if rows_too else None
            s = torch.empty(n // 128, mp).t() if rows_too else None
            qt = torch.empty(n, mt, dtype=torch.float8_e4m3fn) if t_rows else None
            st = torch.empty(mt // 128, n).t() if t_rows else None
            a = 0
            for dy, w in zip(dys, widths):
                out = (q[:, a:a + w] if rows_too else None, s[:, a // 128:(a + w) // 128] if rows_too else None,
                       qt[a:a + w] if t_rows else None, st[a:a + w] if t_rows else None)
                fq.quantize_act(dy, mp, w, t_rows, row_groups=rows_too, sub=sub, warps=warps, pack=pack,
                                split=split, t_chunk=t_chunk, out=out)
                ref = fq.quantize_act(dy, mp, w, t_rows, row_groups=rows_too, sub=sub, warps=warps, pack=pack,
                                      split=split, t_chunk=t_chunk)
                for got, want in zip(out, ref):
                    assert (got is None) == (want is None)
                    if got is not None:
                        assert (same(got, want) if got.dtype == torch.float8_e4m3fn else torch.equal(got, want)), \\
                            (setting, rows_too, t_rows, w)
                a += w
    try:
        fq.quantize_act(dys[0], mp, 256, mt, out=(q[:, :256], None, None, None))
        raise AssertionError("an out without the wanted entries was taken")
    except ValueError:
        pass
    # weights' tiles into row blocks of stacked tiles, their transposes into column blocks
    ws = [(torch.randn(w, 320) * 0.05).to(torch.bfloat16) for w in widths]
    sq = torch.empty(n, 384, dtype=torch.float8_e4m3fn)
    ss = torch.empty(n // 128, 3)
    sqt = torch.empty(384, n, dtype=torch.float8_e4m3fn)
    a = 0
    for w, nw in zip(ws, widths):
        fq.quantize_tiles(w, True, out=(sq[a:a + nw], ss[a // 128:(a + nw) // 128], sqt[:, a:a + nw]))
        rq, rs, rqt = fq.quantize_tiles(w, True)
        assert same(sq[a:a + nw], rq) and torch.equal(ss[a // 128:(a + nw) // 128], rs) and same(sqt[:, a:a + nw], rqt)
        a += nw
    # the stacked projections with the Triton quantizers: the eager quantizers' results, bit for bit
    x = torch.randn(2, 19, 320).to(torch.bfloat16).requires_grad_()
    params = [(torch.randn(w, 320) * 0.05).to(torch.bfloat16).requires_grad_() for w in widths]
    biases = [(torch.randn(w) * 0.1).to(torch.bfloat16).requires_grad_() for w in widths]
    gys = [torch.randn(2, 19, w).to(torch.bfloat16) for w in widths]
    results = []
    for backend in ("triton", "eager"):
        os.environ["QUARL_FP8_QUANT"] = backend
        ps = [p.detach().clone().requires_grad_() for p in params + biases]
        xx = x.detach().clone().requires_grad_()
        outs = fp8_stack.fp8_stack(xx, ps[:3], ps[3:], "tiles")
        torch.autograd.backward(outs, gys)
        results.append([*(o.detach() for o in outs), xx.grad, *(p.grad for p in ps)])
    assert all(torch.equal(a, b) for a, b in zip(*results))
    # after an optimizer step the rollout engine's refresh re-makes the stacked weights' tiles in place, transposed
    # blocks included: the stack's next call quantizes none of them again, and computes what fresh weights give
    os.environ["QUARL_FP8_QUANT"] = "triton"
    ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fp8_stack.fp8_stack(x, ps)
    with torch.no_grad():
        for p in ps:
            p.data.mul_(-2.0)  # a write that moves no version counter, as a fused optimizer's
    fl.weights_changed()
    module = torch.nn.Module()
    module.ws = torch.nn.ParameterList(ps)
    assert fl.refresh_master_tiles(module) == 3
    made = []
    tiles = fq.quantize_tiles
    fq.quantize_tiles = lambda *a, **kw: made.append(1) or tiles(*a, **kw)
    try:
        outs = fp8_stack.fp8_stack(x, ps)
    finally:
        fq.quantize_tiles = tiles
    assert not made
    fresh = [p.detach().clone().requires_grad_() for p in ps]
    assert all(torch.equal(a, b) for a, b in zip(outs, fp8_stack.fp8_stack(x, fresh)))
    print("OK")
""")


def test_stacked_operands_under_triton_interpreter():
    """quantize_act / quantize_tiles writing into blocks of stacked operands (``out=``, any row stride: the q / k / v
    dY and weight tiles of quarl.quant.fp8_stack) give each block its standalone quantization over the launch settings;
    the stacked projections with the Triton quantizers equal them with the eager ones, forward and every gradient."""
    run_interpreted(STACK_SCRIPT)
