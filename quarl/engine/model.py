"""A minimal Llama / Qwen2 / Qwen3 forward over a static KV cache, on the HF model's own modules.

The engine does not copy or convert weights. :class:`DecoderRunner` keeps
references to the Hugging Face model's submodules -- ``embed_tokens``, every
layer's RMSNorms, ``q/k/v/o_proj`` (``nn.Linear`` or quarl's ``QuantLinear``
with its LoRA branch and kernel dispatch), Qwen3's ``q_norm``/``k_norm``, the
MLP, the final norm and ``lm_head`` -- and calls them. What it replaces is only
the glue between them: RoPE from a precomputed table, and attention over a
preallocated cache with ``F.scaled_dot_product_attention`` (or, for the decode
step on CUDA, a flash-decoding kernel; see "Attention"). So whatever the
policy is at rollout time (packed NVFP4 base, LoRA being trained, AQN noise
written into the norm weights in place), the engine computes with it, exactly
as the trainer's forward does.

Cache layout (:class:`DecodeState`), gpt-fast style: per layer ``k, v`` of
``[B, H_kv, S, D]``, zero-initialised (a masked slot is multiplied by an exact
0, and ``0 * NaN`` from uninitialised memory would still be NaN), plus
``kv_valid [B, S]`` saying which slots a row may attend to. Prompts are *left*
padded, so all rows share one write column: the prompt fills ``[0, P)`` and
decode step ``t`` writes column ``P + t - 1``. RoPE positions are per row,
``cumsum(mask) - 1`` as in HF generate, so padding never shifts a position.

Attention:
* **prefill** (eager, any length): ``q [B, H, P, D]`` against the prompt's own
  ``k, v`` expanded to ``H`` heads (as HF's sdpa path does), with mask
  ``causal & (key is real | key == query)``. The diagonal keeps fully padded
  query rows finite; their outputs are never read, only their (finite) K/V,
  which every real query masks.
* **decode** (one token, static shapes for CUDA graphs): grouped-query heads are
  folded into the query-length dimension -- ``q [B, H_kv, G, D]`` against
  ``k [B, H_kv, L, D]`` -- so GQA needs neither ``repeat_kv`` copies of the
  cache nor SDPA's ``enable_gqa``. ``L`` is a bucket of the cache length
  (multiples of ``kv_block``): attention reads the filled prefix, not all of
  ``S``, and each bucket is one captured graph. On CUDA bf16/fp16 with D of 64
  or 128 this attention is ``quarl_kernels.decode_attn``, a flash-decoding
  Triton kernel (the L slots split across programs so that a batch-1 step
  streams the cache with the whole GPU; fp32 online softmax; a deterministic
  combine of the splits), called through :func:`quarl.engine.fused.decode_attention`.
  ``decode_attn=False`` or ``QUARL_ENGINE_DECODE_ATTN=0`` (and whatever turns
  the fused kernels off) keeps ``F.scaled_dot_product_attention`` with the bool
  mask ``kv_valid[:, None, None, :L]``. The kernel is not bit-equal to SDPA
  (its own fp32 summation order), hence its own switch.

RoPE: the table ``cos, sin [S, D]`` is built the way HF's rotary module builds
it (fp32 ``position * inv_freq``, duplicated halves, times
``attention_scaling``, cast to the model dtype), from the module's own
``inv_freq``. That covers every rope type whose frequencies do not depend on
the sequence length -- ``default``, ``linear``, ``llama3``, ``yarn`` -- and
``dynamic``/``longrope`` while the sequence stays within
``original_max_position_embeddings`` (where they are static too). Longer
dynamic-RoPE sequences and sliding-window layers that the sequence would
exceed raise :class:`EngineError` pointing at the reference generator.

Fused kernels (:mod:`quarl.engine.fused`, on by default on CUDA bf16/fp16): the
glue between projections runs as a few Triton kernels -- each residual add is
fused into the RMSNorm that follows it (the block's MLP output stays *pending*
and is added by the next layer's ``input_layernorm``, the last one by the final
norm), RoPE rotates q and k in one kernel, and HF's SiLU MLP is unrolled to
``down_proj(silu_mul(gate_proj(x), up_proj(x)))``. Every projection is still
called as a module, and the norm kernels read ``module.weight`` at each call.
With ``fused=False`` (or ``QUARL_ENGINE_FUSED=0``, or on CPU / fp32) each of
those calls is the modules' own PyTorch code, in the same order as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from quarl.engine import fused as fz
from quarl.engine import lora as lp
from quarl.engine.fused import apply_rope  # noqa: F401  (the reference lives in fused.py; kept importable here)
from quarl.quant.fp8_linear import shared_input

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
LENGTH_BOUNDED_ROPE_TYPES = ("dynamic", "longrope")


class EngineError(ValueError):
    """The engine cannot run this model or request; the message names the fix."""


def _rope_params(config) -> dict:
    rp = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(rp) if isinstance(rp, dict) else {}


@dataclass
class DecodeState:
    """Static buffers of one cache allocation; CUDA graphs capture their addresses."""

    k: list[torch.Tensor]  # per layer [B, H_kv, S, D]
    v: list[torch.Tensor]  # per layer [B, H_kv, S, D]
    kv_valid: torch.Tensor  # [B, S] bool: slot may be attended to
    cos: torch.Tensor  # [S, D] model dtype
    sin: torch.Tensor  # [S, D]
    tok: torch.Tensor  # [B, 1] long: the token fed to the next decode step
    pos: torch.Tensor  # [B, 1] long: its RoPE position
    slot: torch.Tensor  # [1] long: the cache column it is written to
    logits: torch.Tensor  # [B, V] fp32: output of the last decode step

    @property
    def batch(self) -> int:
        return self.kv_valid.shape[0]

    @property
    def length(self) -> int:
        return self.kv_valid.shape[1]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class DecoderRunner:
    """Prefill and decode of a HF Llama/Qwen2/Qwen3 causal LM over a :class:`DecodeState`."""

    def __init__(self, model: nn.Module, fused: bool | None = None, lora_pack: bool | None = None,
                 decode_attn: bool | None = None):
        cfg = getattr(model, "config", None)
        mtype = getattr(cfg, "model_type", None)
        if mtype not in SUPPORTED_MODEL_TYPES:
            raise EngineError(
                f"the fast engine supports model_type {', '.join(SUPPORTED_MODEL_TYPES)}, got {mtype!r}; "
                f"use quarl.engine.rollout.HFGenerator (the reference engine) for other architectures"
            )
        base = getattr(model, "model", None)
        if base is None or not hasattr(base, "layers") or not hasattr(base, "rotary_emb"):
            raise EngineError(
                f"{type(model).__name__} has no .model.layers/.model.rotary_emb; pass the transformers "
                f"*ForCausalLM itself (not a PEFT or DDP wrapper: unwrap it first)"
            )
        self.model, self.config = model, cfg
        self.model_config = cfg
        self.embed, self.layers, self.norm = base.embed_tokens, list(base.layers), base.norm
        self.lm_head = model.get_output_embeddings()
        self.rotary = base.rotary_emb
        attn = self.layers[0].self_attn
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = attn.head_dim
        self.group = self.n_heads // self.n_kv
        self.scaling = attn.scaling
        self.qk_norm = hasattr(attn, "q_norm")
        self.vocab = self.lm_head.weight.shape[0] if hasattr(self.lm_head, "weight") else cfg.vocab_size
        rp = _rope_params(cfg)
        self.rope_type = rp.get("rope_type", rp.get("type", "default")) or "default"
        self.original_max = rp.get("original_max_position_embeddings", cfg.max_position_embeddings)
        self.fused = fz.resolve(fused)  # requested; used where fz.kernels_available(device)
        self._fused_at: tuple[torch.device, bool] | None = None  # (device, available there)
        self.decode_attn = fz.resolve_decode_attn(decode_attn)  # flash-decoding kernel where fused_on()
        self.lora_pack = lp.resolve(lora_pack)  # adapters of q/k/v and gate/up computed together
        self.lora_epilogue = lp.resolve_epilogue(None)  # B GEMM + bias in the base kernel's last pass
        self.lora_a_kernel = lp.resolve_a_kernel(None)  # the A GEMM inside the first projection's GEMV launch
        self._lora: lp.LoraPack | None = None

    def prepare_lora(self) -> None:
        """Build (or rebuild, when the adapters were replaced) and refresh the packed adapters from
        the live LoRA weights. The engine calls it at the start of every generation, in eval mode;
        prefill and decode read the pack until the next call (see :mod:`quarl.engine.lora`)."""
        if not self.lora_pack:
            self._lora = None
            return
        if self._lora is None or not self._lora.matches(self.layers, self.dtype):
            self._lora = lp.LoraPack(self.layers, self.dtype, self.lora_epilogue, self.lora_a_kernel)
        self._lora.refresh()

    def lora_buffers(self) -> list[torch.Tensor]:
        """The pack's tensors (a captured graph reads them)."""
        return [] if self._lora is None else self._lora.buffers()

    def _groups(self, i: int) -> dict:
        return self._lora.layers[i] if self._lora is not None else {}

    def fused_on(self) -> bool:
        """Whether this step uses the fused kernels: requested, and they run on the model's device
        (decided once per device, so a compiled decode step only reads an attribute)."""
        if not self.fused:
            return False
        dev = self.device
        if self._fused_at is None or self._fused_at[0] != dev:
            self._fused_at = (dev, fz.kernels_available(dev))
        return self._fused_at[1]

    # --- static facts -----------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def check_length(self, total: int) -> None:
        """Raise unless prompt + completion of ``total`` tokens is computed exactly as HF would."""
        if self.rope_type not in STATIC_ROPE_TYPES + LENGTH_BOUNDED_ROPE_TYPES:
            raise EngineError(
                f"RoPE type {self.rope_type!r} is not supported by the fast engine "
                f"(supported: {', '.join(STATIC_ROPE_TYPES + LENGTH_BOUNDED_ROPE_TYPES)}); "
                f"use quarl.engine.rollout.HFGenerator"
            )
        if self.rope_type in LENGTH_BOUNDED_ROPE_TYPES and total > self.original_max:
            raise EngineError(
                f"RoPE type {self.rope_type!r} changes its frequencies beyond original_max_position_embeddings="
                f"{self.original_max} tokens and this request needs {total}; lower max_new_tokens or the "
                f"prompt length, or use quarl.engine.rollout.HFGenerator"
            )
        window = getattr(self.config, "sliding_window", None)
        types = getattr(self.config, "layer_types", None) or []
        if window and "sliding_attention" in types and total > window:
            raise EngineError(
                f"layers with sliding_window={window} are not implemented by the fast engine and this request "
                f"needs {total} tokens; lower the length or use quarl.engine.rollout.HFGenerator"
            )

    # --- state ------------------------------------------------------------------
    def rope_table(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin [length, D]`` for positions ``0..length-1``, as HF's rotary module computes them."""
        r = self.rotary
        inv_freq = r.inv_freq
        if self.rope_type in LENGTH_BOUNDED_ROPE_TYPES and hasattr(r, "original_inv_freq"):
            inv_freq = r.original_inv_freq  # within original_max the frequencies are the original ones
        pos = torch.arange(length, device=self.device)
        freqs = pos[:, None].float() * inv_freq.to(device=self.device, dtype=torch.float)  # [S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [S, D]
        scale = getattr(r, "attention_scaling", 1.0)
        return (emb.cos() * scale).to(self.dtype), (emb.sin() * scale).to(self.dtype)

    def row_bytes(self, length: int) -> int:
        """Device memory one row of a batch takes at cache length ``length``: its K/V cache and validity mask,
        its fp32 logits, the sampler's sort of them (values and indices), and the decode step's activations
        (eager and in the graph pool). What :meth:`FastGenerator.generate` sizes its batches by."""
        cfg = self.model_config
        el = torch.finfo(self.dtype).bits // 8
        kv = 2 * len(self.layers) * self.n_kv * self.head_dim * length * el + length
        act = 2 * (4 * cfg.hidden_size + 3 * getattr(cfg, "intermediate_size", 4 * cfg.hidden_size)) * el
        return kv + self.vocab * (4 + 12) + act

    def prefill_bytes(self, tokens: int) -> int:
        """Activation memory of one prefill pass of ``tokens`` prompt tokens (the residual stream, q/k/v, the
        attention output, the MLP's gate / up / product), generously."""
        cfg = self.model_config
        el = torch.finfo(self.dtype).bits // 8
        return tokens * (8 * cfg.hidden_size + 4 * getattr(cfg, "intermediate_size", 4 * cfg.hidden_size)) * el

    def new_state(self, batch: int, length: int) -> DecodeState:
        dev, dt = self.device, self.dtype
        shape = (batch, self.n_kv, length, self.head_dim)
        cos, sin = self.rope_table(length)
        return DecodeState(
            k=[torch.zeros(shape, device=dev, dtype=dt) for _ in self.layers],
            v=[torch.zeros(shape, device=dev, dtype=dt) for _ in self.layers],
            kv_valid=torch.zeros((batch, length), device=dev, dtype=torch.bool),
            cos=cos,
            sin=sin,
            tok=torch.zeros((batch, 1), device=dev, dtype=torch.long),
            pos=torch.zeros((batch, 1), device=dev, dtype=torch.long),
            slot=torch.zeros(1, device=dev, dtype=torch.long),
            logits=torch.zeros((batch, self.vocab), device=dev, dtype=torch.float32),
        )

    # --- shared pieces ------------------------------------------------------------
    def _qkv(self, attn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fused: bool,
             groups: dict | None = None, cache: tuple | None = None):
        """``x [B, L, hidden]`` -> rotated ``q [B, H, L, D]``, ``k, v [B, H_kv, L, D]``; with ``cache`` (``k_cache,
        v_cache, slot``: a decode step) k and v go into the caches at ``slot`` instead (one kernel with the RoPE
        when fused) and ``(q, None, None)`` comes back."""
        B, L, _ = x.shape
        g = (groups or {}).get("qkv")
        if g is not None and cache is not None and fused and not self.qk_norm:  # RoPE + K/V write in the last pass
            q = g.qkv_rope_cache(x, cos, sin, *cache)
            if q is not None:
                return q.view(B, L, self.n_heads, self.head_dim).transpose(1, 2), None, None
        if g is not None:
            q, k, v = g(x)
        else:  # FP8 projections (Jet-RL, fp8-rollout): X quantized once for the three
            with shared_input():
                q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q = q.view(B, L, self.n_heads, self.head_dim)
        k = k.view(B, L, self.n_kv, self.head_dim)
        v = v.view(B, L, self.n_kv, self.head_dim)
        if self.qk_norm:  # Qwen3: RMSNorm over each head's D, before RoPE
            q, k = fz.rms_norm(attn.q_norm, q, fused=fused), fz.rms_norm(attn.k_norm, k, fused=fused)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            return fz.rope_qk_cache(q, k, v, cos, sin, *cache, fused=fused), None, None
        q, k = fz.rope_qk(q, k, cos, sin, fused=fused)
        return q, k, v

    @staticmethod
    def _proj(groups: dict, name: str, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A single-projection group (o, down): packed adapter copy if there is one, else the module."""
        g = groups.get(name)
        return g(x)[0] if g is not None else module(x)

    def _mlp(self, mlp: nn.Module, x: torch.Tensor, fused: bool, groups: dict) -> torch.Tensor:
        """``mlp(x)``: with packed gate/up adapters ``down(act(gate) * up)`` (HF's MLP, the same values)."""
        g = groups.get("gate_up")
        if g is None or not fz.mlp_eligible(mlp):
            with shared_input():  # FP8 gate / up: X quantized once for the two
                return fz.mlp(mlp, x, fused=fused)
        act = g.gate_act(x)  # silu(gate) * up from the up projection's last pass (where it is fused)
        if act is None:
            gate, up = g(x)  # [.., I] each
            act = fz.act_mul(mlp, gate, up, fused=fused)
        return self._proj(groups, "down", mlp.down_proj, act)

    @staticmethod
    def _add_norm(norm: nn.Module, h: torch.Tensor, delta: torch.Tensor | None, fused: bool):
        """``(norm(h + delta), h + delta)`` -- one kernel when fused; ``delta=None``: ``(norm(h), h)``."""
        if delta is None:
            return fz.rms_norm(norm, h, fused=fused), h
        return fz.rms_norm(norm, delta, residual=h, fused=fused)

    def _logits(self, h: torch.Tensor, pending: torch.Tensor | None, fused: bool) -> torch.Tensor:
        """``h, pending [B, hidden]`` -> ``[B, V]`` in the LM head's dtype: the last residual add, final norm, LM
        head. The callers widen it to fp32 (exactly) where they store it."""
        x, _ = self._add_norm(self.norm, h, pending, fused)
        return self.lm_head(x)

    # --- prefill --------------------------------------------------------------------
    def prefill(self, st: DecodeState, ids: torch.Tensor, mask: torch.Tensor, row0: int = 0) -> torch.Tensor:
        """Run left-padded prompts ``ids, mask [N, P]`` (rows ``[row0, row0 + N)`` of the state: the generator
        prefills a large batch in chunks), fill cache columns ``[0, P)`` and return the last position's logits
        ``[N, V]`` (fp32)."""
        N, P = ids.shape
        rows = slice(row0, row0 + N)
        real = mask.bool()  # [N, P]
        pos = (mask.long().cumsum(dim=1) - 1).clamp(min=0)  # [N, P]
        st.kv_valid[rows].zero_()
        st.kv_valid[rows, :P] = real
        idx = torch.arange(P, device=ids.device)
        causal = idx[None, :] <= idx[:, None]  # [P, P] key <= query
        amask = (causal & (real[:, None, :] | torch.eye(P, dtype=torch.bool, device=ids.device)))[:, None]  # [N,1,P,P]
        cos, sin = st.cos[pos], st.sin[pos]  # [N, P, D]
        fused = self.fused_on()
        h = self.embed(ids)  # [N, P, hidden] residual stream
        pending = None  # the previous block's MLP output, added to h by the next norm
        for i, layer in enumerate(self.layers):
            attn, groups = layer.self_attn, self._groups(i)
            x, h = self._add_norm(layer.input_layernorm, h, pending, fused)
            q, k, v = self._qkv(attn, x, cos, sin, fused, groups)
            st.k[i][rows, :, :P] = k
            st.v[i][rows, :, :P] = v
            if self.group > 1:  # [N, H_kv, P, D] -> [N, H, P, D], HF's repeat_kv
                k = k[:, :, None].expand(N, self.n_kv, self.group, P, self.head_dim).reshape(N, self.n_heads, P, -1)
                v = v[:, :, None].expand(N, self.n_kv, self.group, P, self.head_dim).reshape(N, self.n_heads, P, -1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=amask, scale=self.scaling)  # [N, H, P, D]
            o = self._proj(groups, "o", attn.o_proj, o.transpose(1, 2).reshape(N, P, self.n_heads * self.head_dim))
            x, h = self._add_norm(layer.post_attention_layernorm, h, o, fused)  # h = h + o; x = norm(h)
            pending = self._mlp(layer.mlp, x, fused, groups)
        return self._logits(h[:, -1], None if pending is None else pending[:, -1], fused).float()  # the last position

    # --- decode -----------------------------------------------------------------------
    def decode(self, st: DecodeState, batch: int, kv_len: int) -> None:
        """One token for rows ``[:batch]``: reads ``st.tok/pos/slot``, writes K/V at ``slot``,
        marks the slot valid and leaves ``[batch, V]`` logits in ``st.logits``. Static
        shapes and no host syncs: this is what a CUDA graph captures (and it is
        idempotent, so the warm-up runs before capture are harmless)."""
        B, G, D = batch, self.group, self.head_dim
        tok, pos, slot = st.tok[:B], st.pos[:B], st.slot
        valid = st.kv_valid[:B]
        valid.index_fill_(1, slot, True)
        kv_ok = valid[:, :kv_len]  # [B, L] bool view
        cos, sin = st.cos[pos], st.sin[pos]  # [B, 1, D]
        fused = self.fused_on()
        attn_fused = fused and self.decode_attn
        h = self.embed(tok)  # [B, 1, hidden] residual stream
        pending = None  # the previous block's MLP output, added to h by the next norm
        for i, layer in enumerate(self.layers):
            attn, groups = layer.self_attn, self._groups(i)
            x, h = self._add_norm(layer.input_layernorm, h, pending, fused)
            kc, vc = st.k[i][:B], st.v[i][:B]  # [B, H_kv, S, D]
            q, _, _ = self._qkv(attn, x, cos, sin, fused, groups, (kc, vc, slot))  # q [B, H, 1, D]; K/V at slot
            qg = q.reshape(B, self.n_kv, G, D)  # the G query heads of a KV head as G query rows
            o = fz.decode_attention(
                qg, kc[:, :, :kv_len], vc[:, :, :kv_len], kv_ok, self.scaling, fused=attn_fused
            )  # [B, H_kv, G, D]; unfused: SDPA with attn_mask kv_ok[:, None, None, :]
            o = self._proj(groups, "o", attn.o_proj, o.reshape(B, 1, self.n_heads * D))  # [B, 1, hidden]
            x, h = self._add_norm(layer.post_attention_layernorm, h, o, fused)  # h = h + o; x = norm(h)
            pending = self._mlp(layer.mlp, x, fused, groups)
        # copy_ widens the LM head's bf16 to fp32 itself: a .float() first was one more [B, V] fp32 pass a step
        st.logits[:B].copy_(self._logits(h[:, 0], None if pending is None else pending[:, 0], fused))
