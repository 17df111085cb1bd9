"""Every ``QUARL_*`` environment variable quarl reads, with what it sets; and a check that the ones set are known.

Why. The switches are read where they act -- a kernel launcher, the engine, the S3 client, the trainer -- so a
misspelt name (``QUARL_KERNEL_PDL=0``, ``QUARL_ENGINE_FUSE=0``) or one that no longer exists was silently ignored:
the run went on with the default, and an A/B comparison compared nothing. :func:`check_environment` runs when the
``quarl`` command starts (``quarl.cli.main``) and stops it with the unknown names, the closest known ones and the
fix. Values are checked where they are read (``quarl_kernels.env.env_flag`` and the like name the variable).

:data:`SWITCHES` is the one list; ``tests/test_switches.py`` holds it equal to the ``QUARL_*`` names the code
(quarl, kernels, components, pipelines, benchmarks, tests) reads, so a new switch cannot be added without a line
here. The README lists the GPU ones for users.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

__all__ = ["COMPUTE_SWITCHES", "NOT_SWITCHES", "SWITCHES", "UnknownSwitchError", "check_environment",
           "compute_switches", "unknown_switches"]

SWITCHES: dict[str, str] = {
    # storage, caches, runs
    "QUARL_CACHE": "local cache root (default ~/.cache/quarl)",
    "QUARL_GIT_COMMIT": "the commit recorded in artifacts (set in the images)",
    "QUARL_WEED": "the SeaweedFS `weed` binary for the local S3",
    "QUARL_S3_ENDPOINT": "S3 endpoint URL",
    "QUARL_S3_ADDRESSING_STYLE": "S3 addressing style (path / virtual / auto)",
    "QUARL_S3_MAX_ATTEMPTS": "S3 attempts per request (default 5)",
    "QUARL_STAGE_CONFIG": "a TrainJob node's resolved stage config (set by quarl)",
    "QUARL_KFP_TOKEN": "Kubeflow Pipelines API token for `quarl submit` / `schedule`",
    "QUARL_DIST_TIMEOUT_S": "collective timeout of multi-GPU runs, seconds (default 3600)",
    # quantized linears and their kernels
    "QUARL_KERNELS": "reference = no GPU kernels (the reference path everywhere)",
    "QUARL_KERNELS_CACHE": "file of the tuned weight-only GEMM configs",
    "QUARL_KERNELS_TUNE": "1 = time every candidate config of the weight-only GEMM",
    "QUARL_KERNELS_DENSE_MIN_M": "rows from which the dense path (decode + cuBLAS) runs; 0 = never",
    "QUARL_KERNELS_DENSE_KEEP": "decoded BF16 weights kept for the backward (0 = none)",
    "QUARL_KERNELS_DENSE_FP8": "1 = the dense path runs FP4 weights as FP8 tiles and an FP8 GEMM (not exact)",
    "QUARL_KERNELS_BLOCKED": "packed 4-bit words in [64, 8]-word blocks: auto (from 2 decode rows), 1 always, 0 never",
    "QUARL_KERNELS_DENSE_FP8_MIN_GFLOP": "smallest GEMM (2MNK/1e9) the FP8 dense path takes; 0 = every one",
    "QUARL_KERNELS_MIXED_GEMM": "1 = the fused register-A GEMM takes large-M forwards on wide FP4 weights (opt-in)",
    "QUARL_KERNELS_MIXED_GEMM_MIN_M": "rows from which the fused register-A GEMM takes a forward; 0 = never",
    "QUARL_KERNELS_MMA_DECODE": "0 = no Gluon mma.sync decode kernel (2..16 rows)",
    "QUARL_KERNELS_WGMMA_DECODE": "auto / 1 / 0: the wgmma decode kernel (17..64 rows)",
    "QUARL_KERNELS_WGMMA_RING": "0 = no TMA-ring decode kernel",
    "QUARL_KERNELS_RING_WIDE_MAX_M": "most rows the ring's wide token tiles take; 0 = none",
    "QUARL_KERNELS_GEMV_DEFAULTS": "h200 = the one-row GEMV's config 0 everywhere",
    "QUARL_KERNELS_GEMV_W_EARLY": "1 = a one-row GEMV program loads its first weight tile before its PDL wait (opt-in: slower); l2 = "
                                  "prefetches its lines to L2 instead (opt-in: no gain, session 38)",
    "QUARL_KERNELS_MMA_W_EARLY": "0 = the mma.sync decode kernel's first words after its PDL wait, not before",
    "QUARL_KERNELS_RING_W_EARLY": "1 = the TMA ring's first weight copies and scales before its PDL wait (opt-in)",
    "QUARL_KERNELS_GEMV_M1": "NxK:i,... = the one-row GEMV's config i (GEMV_CONFIGS) for N x K FP4 weights",
    "QUARL_KERNELS_GEMV_WHOLE_WAVES": "0 = a one-row GEMV launch past a wave stays unsplit (the default splits it to "
                                      "whole waves: the 14B / 32B gate/up group 3 ways, session 40)",
    "QUARL_KERNELS_GEMV_SPLIT": "NxK:s,... = a one-row GEMV launch of N rows in all (a group's summed) and K split s ways",
    "QUARL_KERNELS_PDL": "late / early / 0: programmatic dependent launch of the decode step's kernels",
    "QUARL_GEMV_GROUP": "0 = a one-row q/k/v or gate/up group as one GEMV launch per weight",
    "QUARL_MMA_GROUP": "0 = a 2..16-row group's weights as one mma.sync launch each",
    "QUARL_GROUP_PASS": "0 = a group launch's last passes one launch each",
    # the rollout engine
    "QUARL_ENGINE_FUSED": "0 = no fused norm / RoPE / SiLU kernels",
    "QUARL_ENGINE_DECODE_ATTN": "0 = decode attention through SDPA",
    "QUARL_ENGINE_FUSED_SAMPLE": "0 = the sampler as PyTorch ops (sort for top-p < 1), not the Triton kernels",
    "QUARL_ENGINE_LORA_PACK": "0 = LoRA adapters not packed per group",
    "QUARL_ENGINE_COMPACT": "0 = finished rows keep decoding (inertly) until the whole batch stops",
    "QUARL_ENGINE_SHARE_PREFILL": "0 = each of a prompt's n samples prefilled on its own",
    "QUARL_ENGINE_LORA_EPILOGUE": "0 = LoRA B and bias as their own kernels",
    "QUARL_ENGINE_LORA_A": "0 = the packed LoRA A GEMM on cuBLAS",
    "QUARL_ENGINE_GROUP_ROPE": "0 / 1: the decode RoPE + K/V write in the q/k/v group's pass",
    # FP8 (Jet-RL) and the RL loss
    "QUARL_FP8_QUANT": "triton / compile / eager: the FP8 quantizers",
    "QUARL_FP8_COMPILE": "0 = the eager FP8 quantizers",
    "QUARL_FP8_GEMM": "auto (DeepGEMM where it imports) / cublas / deepgemm / emulate: the FP8 GEMMs",
    "QUARL_FP8_GEMV": "0 / 1: the FP8 decode GEMV",
    "QUARL_FP8_MEMO": "0 = no memo of the last forward's FP8 operands (training; the rollout engine's q/k/v and gate/up groups)",
    "QUARL_FP8_STACK": "0 = an attention's full-parameter FP8 q / k / v as three FP8 linears, an MLP's gate / up as two"
                       " GEMMs (not one stacked GEMM each)",
    "QUARL_FP8_SWIGLU": "0 = a full-parameter FP8 MLP as three FP8 linears (not SwiGLU's backward in the quantizers)",
    "QUARL_FP8_SWIGLU_MERGE": "0 = SwiGLU's backward quantizers always as two passes (no merged launch)",
    "QUARL_FP8_SWIGLU_FWD": "0 = the fused FP8 MLP's forward writes h = silu(g) * u, then quantizes it (not one kernel)",
    "QUARL_FP8_REGS": "0 = no Gluon FP8 quantizers (register-order, staged) among the timed candidates (Triton alone)",
    "QUARL_FP8_TMA": "0 = not the staged Gluon quantizers' TMA forms (the tile read by one TMA copy) among the timed"
                     " candidates",
    "QUARL_FP8_TUNE": "situ (default) = the FP8 quantizers' fastest few launch settings timed again inside the run; 1 = back to back only; 0 = the default settings",
    "QUARL_LOGPROB_KERNEL": "0 = token log-probs through PyTorch ops",
    # benchmarks and tests
    "QUARL_GSM8K": "benchmarks: the GSM8K directory",
    "QUARL_GSM8K_DIR": "tests: the GSM8K directory",
    "QUARL_BENCH_NO_CT": "benchmarks: run without compressed-tensors",
    "QUARL_BENCH_GEMV_EXPLORE": "benchmarks: bench_gemv's compile workers also build the explore configs",
}

# The switches that change what a stage computes or how (kernels, engine, FP8, the log-prob kernel), from
# QUARL_KERNELS to QUARL_LOGPROB_KERNEL above: an artifact records the ones set when it was written (its manifest's
# ``switches``, quarl.artifacts), since a run's numbers -- QUARL_KERNELS_DENSE_FP8's above all -- depend on them and
# its config does not say. Storage, credentials and benchmark switches are not recorded.
_NAMES = list(SWITCHES)
COMPUTE_SWITCHES = frozenset(_NAMES[_NAMES.index("QUARL_KERNELS"): _NAMES.index("QUARL_LOGPROB_KERNEL") + 1])


def switch_on(name: str, on: str, off: str) -> bool:
    """A ``0`` / ``1`` switch that defaults to on: ``name`` unset or ``1`` -> True, ``0`` -> False; anything else a
    ``ValueError`` naming the variable and what each value does (``on`` / ``off``)."""
    v = os.environ.get(name, "1").strip()
    if v not in ("0", "1"):
        raise ValueError(f"{name}={v!r}: use 1 ({on}) or 0 ({off})")
    return v == "1"


def compute_switches(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The :data:`COMPUTE_SWITCHES` set in ``environ`` (default ``os.environ``), sorted by name."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(COMPUTE_SWITCHES) if k in env}


# QUARL_* strings in the code that are not environment variables
NOT_SWITCHES = frozenset({
    "QUARL_META",  # the quantized checkpoint's metadata file name
    "QUARL_STEP_FAILED",  # the failure line a pipeline step prints
})


class UnknownSwitchError(ValueError):
    """``QUARL_*`` variables in the environment that quarl does not read."""


def unknown_switches(environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``QUARL_*`` names set in ``environ`` (default ``os.environ``) that are not in :data:`SWITCHES`."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith("QUARL_") and k not in SWITCHES)


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`UnknownSwitchError` naming every unknown ``QUARL_*`` variable set, the closest known names and
    the fix; nothing when all are known."""
    bad = unknown_switches(environ)
    if not bad:
        return
    lines = []
    for k in bad:
        near = difflib.get_close_matches(k, list(SWITCHES), n=2, cutoff=0.75)
        lines.append(f"{k}" + (f" (did you mean {' or '.join(near)}?)" if near else ""))
    raise UnknownSwitchError(
        f"unknown quarl switch{'es' if len(bad) > 1 else ''} in the environment: {'; '.join(lines)}. quarl would "
        f"ignore {'them' if len(bad) > 1 else 'it'}: fix the name, or unset it (the known ones: quarl/switches.py)")
