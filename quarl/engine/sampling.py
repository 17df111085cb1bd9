"""On-device token sampling: temperature, nucleus (top-p), greedy, per-token log-probs.

Everything here is tensor ops on the logits' device with no host round trip, so
a decode loop can enqueue step after step without waiting for the GPU:

* **the draw** uses the Gumbel-max trick: ``argmax(logits / T + g)`` with
  ``g = -log(-log(u))``, ``u ~ U(0, 1)`` from the caller's ``torch.Generator``
  (on the logits' device), is an exact sample of ``softmax(logits / T)``.
  Unlike ``torch.multinomial`` it is one elementwise pass and an argmax, never
  validates the distribution on the host, and tokens outside the nucleus
  (``-inf``) can never win. (gpt-fast divides by ``Exponential(1)`` noise
  instead; an exponential draw of exactly 0 there gives ``0/0 = NaN``, which
  the clamped Gumbel form cannot.)
* **top-p** keeps the smallest prefix of the sorted distribution whose mass
  reaches ``top_p``: a token stays when the mass strictly before it is
  ``< top_p`` -- the rule of :func:`quarl.engine.rollout.top_p_filter` (the
  reference engine), so both engines sample from the same nucleus.
* **greedy** is ``top_p < GREEDY_TOP_P``: the nucleus of a tiny ``top_p`` is
  the single most likely token (its mass alone is ``>= 1/V``), which is how
  :mod:`quarl.eval.generate` asks for greedy decoding (``top_p = 1e-9``)
  through the rollout sampler's interface. It is computed as a plain argmax
  (no sort, no noise), so it is deterministic and skips the ``[B, V]`` sort.
* **log-probs** are ``log_softmax(logits / T)`` at the chosen token, *before*
  top-p truncation: the quantity the trainer recomputes (see
  :mod:`quarl.engine.rollout`).
* **fused** (``fused=True``, which the fast engine passes when its fused kernels
  are on and ``QUARL_ENGINE_FUSED_SAMPLE`` is not 0 -- read once a ``generate`` call; on by default since session
  39's H200 run, ``benchmarks/gpu_session39.sh``): at top-p 1 and greedy the
  same draw runs as two Triton kernels (:mod:`quarl_kernels.sampler`) after the
  same ``torch.rand`` -- the same noise, the same generator state after it, the
  same tokens where libdevice's ``logf`` is CUDA's (tested on the GPU), log-probs
  equal to fp32 rounding -- instead of about a dozen PyTorch kernels over the
  ``[B, V]`` logits (H200, Qwen2.5's vocabulary: 9 us a call against 60 at one
  row, 81 against 250 at 64); below top-p 1 the nucleus is found without the sort
  (:mod:`quarl_kernels.nucleus`: a radix search of the smallest kept logit,
  weighted by probability, each row split over many programs; 46 us against the
  sort's 176 at one row, 394 against 1565 at 64) and drawn in -- the same nucleus as
  :func:`top_p_mask` except where tokens tie at its edge (all of them kept) or
  its mass is within fp32 rounding of ``top_p``.
"""

from __future__ import annotations

import os
import warnings

import torch

FUSED_ENV = "QUARL_ENGINE_FUSED_SAMPLE"

# Below this, the nucleus is the argmax for any vocabulary under 1e6 tokens
# (the top token's probability is >= 1/V > top_p).
GREEDY_TOP_P = 1e-6


def top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """``[B, V]`` logits -> the same logits with ``-inf`` outside each row's nucleus."""
    if top_p >= 1.0:
        return logits
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)  # [B, V]
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # [B, V]: mass of the strictly more likely tokens
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, sorted_idx, sorted_logits)


def gumbel_noise(shape, device, generator: torch.Generator | None) -> torch.Tensor:
    """Standard Gumbel noise ``[*shape]`` (fp32) from ``generator``."""
    u = torch.rand(shape, device=device, dtype=torch.float32, generator=generator)
    u = u.clamp_(min=torch.finfo(torch.float32).tiny)  # u = 0 would give +inf
    return -torch.log(-torch.log(u))


def check_generator(generator: torch.Generator | None, device: torch.device) -> None:
    """A generator must live where the logits do (a CPU generator cannot draw CUDA noise)."""
    if generator is None:
        return
    gdev = torch.device(generator.device)
    if gdev.type != device.type or (gdev.type == "cuda" and (gdev.index or 0) != (device.index or 0)):
        raise ValueError(
            f"the sampling torch.Generator is on {gdev} but the model runs on {device}; "
            f"create it with torch.Generator(device={str(device)!r}).manual_seed(seed)"
        )


_KERNEL = None  # (quarl_kernels.sampler, quarl_kernels.nucleus) once imported; False when they cannot be
# Test seam: take the fused path on CPU logits too (the kernels under TRITON_INTERPRET=1). Never set in production.
_FORCE_KERNEL = False


def fused_sampler():
    """``(quarl_kernels.sampler, quarl_kernels.nucleus)``, or None (``QUARL_ENGINE_FUSED_SAMPLE=0``, or no Triton /
    kernels package). Read once per ``generate`` call by the engine, which passes the answer as ``sample``'s
    ``fused``: the switch is not read again for every token."""
    from quarl.engine.fused import _switch

    if not _switch(None, FUSED_ENV, "the fused sampler", "PyTorch's ops"):  # default on: measured, session 39
        return None
    return _kernels()


def _kernels():
    """The kernel modules, imported once (None when they cannot be: a warning where the switch asked for them by
    name; on the default, PyTorch's ops serve silently, as the engine's other fused kernels fall back)."""
    global _KERNEL
    if _KERNEL is None:
        try:
            from quarl_kernels import nucleus, sampler
        except Exception as e:  # noqa: BLE001 - no Triton or no kernels package: PyTorch's ops serve
            if os.environ.get(FUSED_ENV, "auto").strip().lower() not in ("auto", ""):
                warnings.warn(f"{FUSED_ENV}=1 but quarl_kernels' sampler does not import ({type(e).__name__}: {e}); "
                              f"sampling with PyTorch's ops", stacklevel=2)
            _KERNEL = False
        else:
            _KERNEL = (sampler, nucleus)
    return _KERNEL or None


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None = None,
    *,
    rows_of: torch.Tensor | None = None,
    all_rows: int | None = None,
    fused: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, V]`` logits -> (``[B]`` token ids, ``[B]`` fp32 log-probs under ``softmax(logits / T)``).

    ``rows_of`` (``[B]`` long) / ``all_rows``: the logits are rows ``rows_of`` of a batch of ``all_rows`` (an engine
    batch with its finished rows compacted away); the noise is drawn for all ``all_rows`` rows and these rows'
    taken, so the generator's stream -- and every row's sample -- is what the full batch would have had.
    ``fused``: the Triton kernels on CUDA logits (module docstring; the caller decides, e.g. ``fused_sampler() is not
    None``); elsewhere ignored."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}; use top_p < {GREEDY_TOP_P} for greedy")
    greedy = top_p < GREEDY_TOP_P
    kernels = _kernels() if fused and (logits.is_cuda or _FORCE_KERNEL) else None
    if kernels is not None:
        sampler, nucleus = kernels
        if greedy:
            return sampler.gumbel_sample(logits, temperature)
        # the very draw gumbel_noise makes: the same u and generator state after it
        rows = all_rows if rows_of is not None else logits.shape[0]
        u = torch.rand((rows, logits.shape[1]), device=logits.device, dtype=torch.float32, generator=generator)
        if top_p >= 1.0:
            return sampler.gumbel_sample(logits, temperature, u, rows_of)
        return nucleus.nucleus_sample(logits, temperature, top_p, u, rows_of)
    scaled = logits.float() / temperature  # [B, V]
    logp = torch.log_softmax(scaled, dim=-1)  # [B, V]
    if greedy:
        tok = scaled.argmax(dim=-1)  # [B]
    else:
        filtered = top_p_mask(scaled, top_p)
        if rows_of is None:
            g = gumbel_noise(filtered.shape, filtered.device, generator)  # [B, V]
        else:
            g = gumbel_noise((all_rows, filtered.shape[1]), filtered.device, generator)[rows_of]  # [B, V]
        tok = (filtered + g).argmax(dim=-1)  # [B]
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
