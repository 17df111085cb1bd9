"""Weight-only 4-bit GEMMs: which kernel runs a ``y = x @ W^T`` (or ``dx = dy @ W``) call, by rows and weight.

``wo_matmul`` routes by M (its docstring has the rule): 1 row the CUDA-core GEMV (``gemv.py``), 2..64 the Gluon
decode kernels (``mma_decode.py``, ``wgmma_ring.py``, ``wgmma_decode.py``), large M the dense path (``dense.py``: a
transient BF16 weight for cuBLAS), and anything they do not take the Triton tensor-core kernels
(``wo_tensorcore.py``). ``wo_matmul_group`` runs a LoRA group's weights that read one x (q / k / v, gate / up) as one
launch where a kernel can. The Gluon kernels are optional: a Triton without Gluon, or one that fails to build
them, turns each off for the process with one warning and the next route serves.

Config choice: each route's measured default (``default_config``, ``gemv.default_gemv_config``, ...), or with
``tune=True`` / ``QUARL_KERNELS_TUNE=1`` the fastest candidate, timed once and cached on disk (``tuning.py``).
"""

from __future__ import annotations

import importlib
import os
import warnings

import torch
import triton

from quarl_kernels import dense, gemv, lora_a
from quarl_kernels.group_pass import rope_after
from quarl_kernels.launch import each_in_group
from quarl_kernels.launch import env_flag as _env_flag
from quarl_kernels.launch import finish as _finish
from quarl_kernels.launch import interpreting as _interpreting
from quarl_kernels.tuning import choose as _choose

# the tensor-core kernels and their configs; the public names re-exported (callers name them as wo_gemm.*)
from quarl_kernels.wo_tensorcore import (
    BWD_CONFIGS,
    DECODE_CONFIGS,
    DECODE_MAX_M,
    FMT_INT4,
    FMT_NVFP4,
    FP4_ACC_FACTOR,
    PREFILL_CONFIGS,
    Config,
    PackedWeight,
    _decode_bm,
    _m_bucket,
    default_config,
    launch_bwd,
    launch_fwd,
)

_DENSE_OOM_WARNED = False


def _dense_oom(pw: PackedWeight) -> None:
    """The dense path could not allocate its transient [N, K] BF16 weight: this call (and any
    later one that hits the same wall) runs the fused kernel, which needs no extra memory."""
    global _DENSE_OOM_WARNED
    if not _DENSE_OOM_WARNED:
        _DENSE_OOM_WARNED = True
        warnings.warn(f"quarl_kernels: no memory for the dense path's transient {pw.n}x{pw.k} BF16 weight "
                      f"({pw.n * pw.k * 2 / 2**20:.0f} MiB); using the fused kernel for such calls (slower at "
                      f"large M). QUARL_KERNELS_DENSE_MIN_M=0 makes that the rule.", stacklevel=3)


MMA_DECODE_MIN_M = 2  # M = 1 stays on the GEMV (47% vs ~43% of HBM on the 7B MLP layers, H200)


_MMA_DECODE_BROKEN: str | None = None  # why the Gluon kernel is off for this process, once it failed


def _import_kernel(name: str):
    """(``quarl_kernels.<name>``, None), or (None, why) when this Triton cannot provide it: Triton < 3.5 has no Gluon,
    and a newer one may have moved its API (the optional Gluon kernels below)."""
    try:
        return importlib.import_module(f"quarl_kernels.{name}"), None
    except (ImportError, AttributeError) as e:
        return None, f"{type(e).__name__}: {e}"


def _build_failure(e: Exception) -> str:
    """A build error's first line, for the once-per-process warning that turns a Gluon kernel off."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _mma_decode():
    """The Gluon register-operand decode kernel module, or None (disabled by
    ``QUARL_KERNELS_MMA_DECODE=0``, a Triton without Gluon, or an earlier failure)."""
    global _MMA_DECODE_BROKEN
    if os.environ.get("QUARL_KERNELS_MMA_DECODE", "1") == "0" or _interpreting() or _MMA_DECODE_BROKEN:
        return None
    mod, _MMA_DECODE_BROKEN = _import_kernel("mma_decode")
    return mod


def _mma_decode_failed(e: Exception) -> None:
    """Gluon is Triton's experimental dialect: if a Triton version cannot compile the kernel,
    say so once and let every later call take the Triton tensor-core kernel instead."""
    global _MMA_DECODE_BROKEN
    _MMA_DECODE_BROKEN = _build_failure(e)
    warnings.warn(f"quarl_kernels: the Gluon decode kernel failed to build ({_MMA_DECODE_BROKEN}); decode at "
                  f"M = 2..64 falls back to the Triton tensor-core kernel (slower). Set "
                  f"QUARL_KERNELS_MMA_DECODE=0 to silence this.", stacklevel=3)


WGMMA_DECODE_ENV = "QUARL_KERNELS_WGMMA_DECODE"  # auto (default: the measured rule) | 1 (every large weight) | 0 (off)
_WGMMA_DECODE_BROKEN: str | None = None  # why the wgmma kernel is off for this process, once it failed


def _wgmma_decode():
    """The Gluon wgmma decode kernel module (M = 17..64 on sm_90), or None: when
    ``QUARL_KERNELS_WGMMA_DECODE=0``, or after a Triton without Gluon / an earlier build failure.
    On by default since the H100 sweep of 2026-11-26 (``wgmma_decode.preferred`` says where)."""
    global _WGMMA_DECODE_BROKEN
    if _interpreting() or _WGMMA_DECODE_BROKEN:
        return None
    raw = os.environ.get(WGMMA_DECODE_ENV)
    if raw is not None and raw.strip().lower() != "auto" and not _env_flag(WGMMA_DECODE_ENV, False):
        return None  # switched off
    mod, _WGMMA_DECODE_BROKEN = _import_kernel("wgmma_decode")
    return mod


def _wgmma_decode_failed(e: Exception) -> None:
    global _WGMMA_DECODE_BROKEN
    _WGMMA_DECODE_BROKEN = _build_failure(e)
    warnings.warn(f"quarl_kernels: the Gluon wgmma decode kernel failed to build ({_WGMMA_DECODE_BROKEN}); decode "
                  f"at M = 17..64 falls back to the mma.sync kernel. Unset QUARL_KERNELS_WGMMA_DECODE to silence "
                  f"this.", stacklevel=3)


_WGMMA_RING_BROKEN: str | None = None  # why the TMA-ring kernel is off for this process, once it failed


def _wgmma_ring():
    """The TMA-ring wgmma decode kernel module (``wgmma_ring.py``; M = 17..64 on sm_90), or None when
    ``QUARL_KERNELS_WGMMA_RING=0``, without Gluon's Hopper TMA API, or after a build failure. On by default since
    the H100 run of session 14 (1.3-1.5x ``wgmma_decode`` on the 7B MLP weights at 64 rows)."""
    global _WGMMA_RING_BROKEN
    if _interpreting() or _WGMMA_RING_BROKEN or not _env_flag("QUARL_KERNELS_WGMMA_RING", True):
        return None
    mod, _WGMMA_RING_BROKEN = _import_kernel("wgmma_ring")
    return mod


def _wgmma_ring_failed(e: Exception) -> None:
    global _WGMMA_RING_BROKEN
    _WGMMA_RING_BROKEN = _build_failure(e)
    warnings.warn(f"quarl_kernels: the TMA-ring wgmma kernel failed to build ({_WGMMA_RING_BROKEN}); decode at "
                  f"M = 17..64 falls back to wgmma_decode. Set QUARL_KERNELS_WGMMA_RING=0 to silence this.",
                  stacklevel=3)


def _gemv(x2: torch.Tensor, pw: PackedWeight, tune: bool | None, epi) -> torch.Tensor:
    """The CUDA-core GEMV route (``gemv.py``) with its measured (or tuned) config."""
    gkey = (pw.fmt, pw.group, x2.shape[0], pw.n, pw.k, x2.device.index)
    gdefault = gemv.default_gemv_config(pw.fmt, x2.shape[0], pw.n, pw.k)
    gcfg = _choose("gemv", gkey, gemv.GEMV_CONFIGS, lambda c: gemv.launch_gemv(x2, pw, c), tune, gdefault)
    return gemv.launch_gemv(x2, pw, gcfg, epi=epi)


def wo_matmul(x2: torch.Tensor, pw: PackedWeight, *, tune: bool | None = None, epi=None,
              xp: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] = x2 [M, K] @ dequant(W)^T, config picked by M regime (and tuning).

    By M: 1 token runs the CUDA-core GEMV (``gemv.py``), 2..64 the Gluon
    register-operand ``mma.sync`` kernel (``mma_decode.py``; 17..64 on large weights the
    Hopper ``wgmma`` ones: ``wgmma_ring.py`` where ``wgmma_ring.takes``, else ``wgmma_decode.py`` where
    ``wgmma_decode.preferred``), 65..``wgmma_ring.wide_max_m()`` the ring's wide token tiles on FP4 weights of
    >= ``wgmma_ring.WIDE_MIN_WEIGHTS``, M >= ``dense.dense_min_m()``
    dequantizes to a transient BF16 weight for cuBLAS (``dense.py``), the rest the
    tensor-core kernel below (which also covers any call the others do not support).

    ``epi`` (a ``launch.Epilogue``): a bias and / or a LoRA branch ``scaling * a @ b^T`` added in the
    launch's last pass (the split-K reduction, or one in-place pass when unsplit); tuning times the
    GEMM alone. Its ``lora_a`` (a LoRA group's ``x @ A^T`` as split partials) is computed by extra programs of
    the GEMV / mma.sync launch, and by ``F.linear`` before any other route. ``xp``: ``x2`` permuted for the
    TMA-ring kernel (``wgmma_ring.permute_x``), when a group's caller made it once for several weights."""
    m = x2.shape[0]
    wr = _wgmma_ring() if m >= 17 else None
    rcfg = wr.routed(x2, pw) if wr is not None else None
    if rcfg is not None:  # the TMA-ring kernel: 17..64 rows, and up to wide_max_m() rows with wide token tiles
        try:
            return wr.launch_wgmma_ring(x2, pw, rcfg, epi=_without_lora_a(x2, epi), xp=xp)
        except triton.compiler.errors.CompilationError as e:
            _wgmma_ring_failed(e)
    if dense.use_dense(m):
        epi = _without_lora_a(x2, epi)
        try:
            return _finish(None, dense.dense_matmul(x2, pw), 1, epi)
        except torch.cuda.OutOfMemoryError:  # no room for the transient BF16 weight: the fused kernel needs none
            _dense_oom(pw)
    wd = _wgmma_decode() if 17 <= m <= 64 else None
    if wd is not None and wd.preferred(m, pw.n, pw.k, pw.fmt, forced=wd.mode() == "on") and \
            wd.wgmma_decode_supported(x2, pw):
        wkey = (pw.fmt, pw.group, wd.token_tile(m), pw.n, pw.k, x2.device.index)
        try:
            wcfg = _choose("wgmma", wkey, wd.candidate_configs(m), lambda c: wd.launch_wgmma_decode(x2, pw, c), tune,
                           wd.default_config(m, pw.n, pw.fmt))
            return wd.launch_wgmma_decode(x2, pw, wcfg, epi=_without_lora_a(x2, epi))
        except triton.compiler.errors.CompilationError as e:
            _wgmma_decode_failed(e)
    md = _mma_decode()
    if (md is not None and MMA_DECODE_MIN_M <= m and md.preferred(m, pw.n, pw.k)
            and md.mma_decode_supported(x2, pw)):
        mkey = (pw.fmt, pw.group, _decode_bm(m), pw.n, pw.k, x2.device.index)
        mdefault = md.default_config(m, pw.n)  # measured winners per token tile (docs/kernels.md v9-v10)
        try:
            mcfg = _choose("mma", mkey, md.candidate_configs(m), lambda c: md.launch_mma_decode(x2, pw, c), tune,
                           mdefault)
            return md.launch_mma_decode(x2, pw, mcfg, epi=epi)
        except triton.compiler.errors.CompilationError as e:
            _mma_decode_failed(e)
    if gemv.gemv_supported(x2, pw):
        return _gemv(x2, pw, tune, epi)
    cands = DECODE_CONFIGS if m <= DECODE_MAX_M else PREFILL_CONFIGS
    key = (pw.fmt, pw.group, _m_bucket(m), pw.n, pw.k, x2.device.index)
    default = default_config("fwd", m, pw.n, pw.k)
    cfg = _choose("fwd", key, cands, lambda c: launch_fwd(x2, pw, c), tune, default)
    return launch_fwd(x2, pw, cfg, epi=_without_lora_a(x2, epi))


def wo_matmul_group(x2: torch.Tensor, pws: list, epis: list, *, gate_act: bool = False, rope=None
                    ) -> list[torch.Tensor]:
    """``[wo_matmul(x2, pws[j], epi=epis[j])]`` for weights that read the same ``x2`` (a LoRA group's q/k/v or
    gate/up); ``gate_act``: the second output is ``silu(y_0) * y_1`` (``launch.Epilogue.gate``). One launch for all of
    them where :func:`group_route` names one (the GEMV at one row; the mma.sync kernel at 2..16 rows),
    else one call each. ``rope`` (a ``group_pass.RopeCache``; q/k/v at a decode step): ``[q_rot]`` comes back, k and v
    written into the caches (``group_pass.finish_group``)."""
    m, p0 = x2.shape[0], pws[0]
    route = group_route(x2, pws)
    if route == "gemv":
        gkey = (p0.fmt, p0.group, m, p0.n, p0.k, x2.device.index)
        cfg = _choose("gemv", gkey, gemv.GEMV_CONFIGS, lambda c: gemv.launch_gemv(x2, p0, c), None,
                      gemv.default_gemv_config(p0.fmt, m, p0.n, p0.k))
        return gemv.launch_gemv_group(x2, pws, cfg, epis, gate_act=gate_act, rope=rope)
    if route == "mma":
        md = _mma_decode()
        try:  # the first weight's measured config for all (the largest of q/k/v; gate and up are alike)
            return md.launch_mma_decode_group(x2, pws, md.default_config(m, p0.n), epis, gate_act=gate_act, rope=rope)
        except triton.compiler.errors.CompilationError as e:
            _mma_decode_failed(e)
    xp = _ring_x(x2, pws)
    ys = each_in_group(epis, gate_act, lambda j, e: wo_matmul(x2, pws[j], epi=e, xp=xp))
    return ys if rope is None else rope_after(ys, rope)


def _ring_x(x2: torch.Tensor, pws: list) -> torch.Tensor | None:
    """x2 permuted once for the TMA-ring kernel when it takes two or more of a group's weights (gate and up), else
    None (each call permutes its own)."""
    wr = _wgmma_ring() if x2.shape[0] >= 17 else None
    cfgs = [c for c in (wr.routed(x2, p) for p in pws) if c is not None] if wr is not None else []
    if len(cfgs) < 2:
        return None
    rows = max(wr.tile_rows(x2.shape[0], c.tile(x2.shape[0])) for c in cfgs)  # tiles are powers of two
    return wr.permute_x(x2.contiguous(), cfgs[0].bkw, rows)  # every config's K step is one 64-wide x box (bkw 8)


GROUP_ENV = "QUARL_GEMV_GROUP"  # 0: a LoRA group's projections as one launch each, not one launch for the group
MMA_GROUP_ENV = "QUARL_MMA_GROUP"  # 0: no group launch at 2..16 rows (mma.sync; 7B batch 8: 4.77 vs 4.97 ms a step)
GROUP_MAX_M = 16  # rows up to which a group's weights share a launch: the GEMV at 1, the mma.sync kernel at 2..16


def group_route(x2: torch.Tensor, pws: list) -> str | None:
    """Which one launch serves a LoRA group's weights on ``x2``: "gemv" (one row), "mma" (2..16 rows;
    ``QUARL_MMA_GROUP=0`` turns it off), or None (one launch each)."""
    m = x2.shape[0]
    if not _env_flag(GROUP_ENV, True) or dense.use_dense(m) or any(p.blocked != pws[0].blocked for p in pws):
        return None  # (one launch reads one word layout)
    if gemv.group_supported(x2, pws):
        return "gemv"
    md = _mma_decode() if MMA_DECODE_MIN_M <= m and _env_flag(MMA_GROUP_ENV, True) else None
    if md is not None and md.group_supported(x2, pws) and all(md.preferred(m, p.n, p.k) for p in pws):
        return "mma"
    return None


def _without_lora_a(x2: torch.Tensor, epi):
    """``epi`` for a route whose launch cannot carry a LoRA group's A programs (``epi.lora_a``: only the GEMV and
    the mma.sync kernel do): the partials filled here with ``F.linear``, the rest of ``epi`` unchanged."""
    if epi is None or epi.lora_a is None:
        return epi
    lora_a.fill_partials(x2, epi.lora_a)
    return epi._replace(lora_a=None)


def dense_route(x2: torch.Tensor, pw: PackedWeight) -> bool:
    """Whether :func:`wo_matmul` runs this call as the dense path's plain BF16 product (``dense.plain_dense``): not
    the TMA ring's rows, M >= ``dense.dense_min_m()``. Its backward then goes the same way (:func:`wo_matmul_t`)."""
    m = x2.shape[0]
    wr = _wgmma_ring() if m >= 17 else None
    if wr is not None and wr.routed(x2, pw) is not None:
        return False
    return dense.use_dense(m) and dense.plain_dense(x2, pw)


def wo_matmul_t(dy2: torch.Tensor, pw: PackedWeight, *, tune: bool | None = None) -> torch.Tensor:
    """dx [M, K] = dy2 [M, N] @ dequant(W) (large M: ``dense.py``, as in ``wo_matmul``)."""
    if dense.use_dense(dy2.shape[0]):
        try:
            return dense.dense_matmul_t(dy2, pw)
        except torch.cuda.OutOfMemoryError:
            _dense_oom(pw)
    key = (pw.fmt, pw.group, _m_bucket(dy2.shape[0]), pw.n, pw.k, dy2.device.index)
    default = default_config("bwd", dy2.shape[0], pw.n, pw.k)
    cfg = _choose("bwd", key, BWD_CONFIGS, lambda c: launch_bwd(dy2, pw, c), tune, default)
    return launch_bwd(dy2, pw, cfg)


__all__ = [
    "BWD_CONFIGS",
    "DECODE_CONFIGS",
    "FMT_INT4",
    "FMT_NVFP4",
    "FP4_ACC_FACTOR",
    "PREFILL_CONFIGS",
    "Config",
    "PackedWeight",
    "default_config",
    "dense_route",
    "launch_bwd",
    "launch_fwd",
    "wo_matmul",
    "wo_matmul_t",
]
