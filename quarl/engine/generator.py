"""FastGenerator: the GPU rollout/eval engine behind quarl's ``Generator`` interface.

``FastGenerator(model, pad_id).generate(prompts, params, n, generator) -> Rollout``
is a drop-in for :class:`quarl.engine.rollout.HFGenerator` (same arguments, same
``Rollout``: left-padded prompts, right-padded completions ending at the stop
token, masks, per-token log-probs, ``truncated``), so the RL trainer and eval
take it through their ``generator=`` argument. The model is the trainer's own
module (see :mod:`quarl.engine.model`); the engine owns only the KV cache, the
CUDA graphs and the loop. Design, after gpt-fast:

* **static KV cache**, preallocated once and reused across calls while it is
  large enough (grown, never shrunk; :meth:`release` frees it, and
  ``keep_cache=False`` frees it after every call -- the RL trainer needs that
  memory for its backward pass -- after which the graphs are re-captured,
  without the eager warm-up for shapes captured before);
* **CUDA graphs** (default on CUDA): the decode step of one ``(batch, kv_len)``
  shape is captured once and replayed, so a step costs one graph launch
  instead of ~15 kernel launches per layer from Python. Batches are padded up
  to a power of two with inert rows, and the attention length to a multiple of
  ``kv_block``, so a handful of graphs serves every call. The graphs read the
  weights in place: LoRA updates by the optimizer and AQN noise copied into
  the norms are seen by the next replay. If a weight tensor is *replaced*
  (``model.to(...)``, a new adapter object), a fingerprint of the weights'
  addresses changes and the graphs are re-captured. A layer whose compute
  path cannot be captured (e.g. a format with no GPU kernel whose reference
  dequantization checks values on the host) makes the capture fail once; the
  engine then warns and decodes eagerly -- correct, just slower.
  ``compile=True`` additionally runs the step through ``torch.compile``
  (fusing the norms, RoPE and residual adds) before capture; it costs a
  compile per graph shape, so it pays off for long runs only.
* **fused kernels** (``fused=None``: ``$QUARL_ENGINE_FUSED``, default on): on
  CUDA bf16/fp16 the norms with their residual adds, RoPE and ``silu * up``
  run as Triton kernels (:mod:`quarl.engine.fused`): one kernel per norm and
  its residual add, one for RoPE on q and k, one for ``silu(gate) * up`` --
  no compile step, the same HF modules; ``fused=False`` keeps PyTorch.
  With them, the decode step's attention is a flash-decoding kernel
  (``decode_attn=None``: ``$QUARL_ENGINE_DECODE_ATTN``, default on; ``False``
  keeps SDPA for it alone), and the sampler is Triton kernels after the same noise
  draw, below top-p 1 without a sort (``$QUARL_ENGINE_FUSED_SAMPLE``, default on;
  0 keeps PyTorch's ops: :mod:`quarl.engine.sampling`).
* **packed adapters** (``lora_pack=None``: ``$QUARL_ENGINE_LORA_PACK``, default on): the LoRA
  branches of q/k/v and of gate/up share one A GEMM per layer, and every adapter is read from
  a copy in the activation dtype refreshed at the start of each call (:mod:`quarl.engine.lora`);
* **no per-token host syncs**: sampling (:mod:`quarl.engine.sampling`), the
  stop test and the bookkeeping are device ops; how many rows are still going
  is read back only every ``sync_every`` steps (a row that stopped keeps
  stepping inertly until then; its outputs are masked);
* **finished rows leave the batch** (``compact=None``: ``$QUARL_ENGINE_COMPACT``, default on): at that
  read-back, once the unfinished rows fit a graph batch at most half the current one, their KV cache columns,
  valid slots, next tokens and positions move to the first state rows and the loop goes on at the smaller batch
  (one gather, at most log2(batch) times a call). RL rollouts end at very different lengths; without this a
  batch of 64 decodes at 64 rows until its longest answer ends. The sampler still draws the noise of every row
  (``sample(rows_of=...)``), so a compacted batch samples the tokens the full one would have (up to the kernels'
  rounding at the other batch size);
* **chunked prefill**: the prompts go through the model ``max_num_batched_tokens`` tokens (vLLM's knob; whole
  rows, at least one) at a time, so a large batch of long prompts does not hold all of its activations at
  once, and no kernel's ``rows x width`` index passes 2**31;
* **one prefill per prompt** (``share_prefill=None``: ``$QUARL_ENGINE_SHARE_PREFILL``, default on): the ``n``
  samples of a prompt are consecutive rows with the same tokens; the prompt runs once and its K/V columns and
  logits are copied to its other rows (GRPO's 8 answers a prompt: 1/8 of the prefill);
* **batches sized by memory**: with ``max_batch_size=None`` (all rows at once) a call whose rows' KV cache,
  logits and sampler buffers do not fit the device's free memory is cut into batches of the largest power of
  two that does (``last_stats["batch_rows"]``); a row that cannot fit alone is an error naming what to lower;
* **bucketing by prompt length**: with ``max_batch_size`` set, rows are sorted
  by prompt length and cut into batches, so each batch pads little; the
  ``Rollout`` comes back in the caller's row order.

The CPU path is the same code without graphs (eager decode with the exact
attention length); :class:`~quarl.engine.rollout.HFGenerator` remains the simple
reference, and the tests hold the two (and HF ``generate``) to the same tokens.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
import warnings

import torch
from torch import nn

from quarl.engine import memory
from quarl.engine.fused import _switch
from quarl.engine.model import DecoderRunner, DecodeState
from quarl.engine.rollout import DEFAULT_MAX_NUM_BATCHED_TOKENS, Rollout, SamplingParams, left_pad
from quarl.engine.sampling import check_generator, fused_sampler, sample
from quarl.quant import packed_layout
from quarl.quant.fp8_linear import refresh_master_tiles

COMPACT_ENV = "QUARL_ENGINE_COMPACT"
SHARE_PREFILL_ENV = "QUARL_ENGINE_SHARE_PREFILL"
# the smallest graph batch compaction moves to: a 7B NVFP4+LoRA decode step takes 3.8-3.9 ms at 4-8 rows against
# 8.2 at 64 (RESULTS, issue 17 session 16), while a new shape costs 0.1-0.2 s of capture per call with a freed cache
COMPACT_MIN_GRAPH_BATCH = 8
# the counters of ``last_stats`` that ``totals`` sums over calls (the RL trainer logs a step's share as engine/*)
TOTAL_KEYS = ("steps", "compactions", "prefilled_rows", "graph_captures", "capture_s", "warmup_s")


def move_rows(bufs: list[torch.Tensor], src: torch.Tensor, cols: int | None = None, chunk: int = 8) -> None:
    """``buf[j, :, :cols] = buf[src[j], :, :cols]`` for ``j < len(src)`` in each of ``bufs`` ([B, H, S, D] caches; with
    ``cols=None`` whole rows of any shape), in place and ``chunk`` rows at a time, so the gather's temporary copy is
    ``chunk`` rows (a one-shot gather of a 32B cache's rows is hundreds of MB on top of a batch sized to the memory).
    Safe when the rows only move down (``src[j] >= j``: compaction, walked upward) or only up (``src[j] <= j``: a
    shared prefill's copies, walked downward): a chunk never overwrites a row that a later chunk reads."""
    n = src.shape[0]
    at = torch.arange(n, device=src.device)
    down = bool((src >= at).all())
    if not down and not bool((src <= at).all()):
        raise ValueError("move_rows: rows may move only down (src[j] >= j) or only up (src[j] <= j) in place")
    starts = range(0, n, chunk) if down else reversed(range(0, n, chunk))
    for j0 in starts:
        j1 = min(n, j0 + chunk)
        for buf in bufs:
            if cols is None:
                buf[j0:j1] = buf[src[j0:j1]]
            else:
                buf[j0:j1, :, :cols] = buf[src[j0:j1], :, :cols]


@contextlib.contextmanager
def _eval_mode(model: nn.Module):
    """Dropout off while sampling (LoRA dropout included); the caller's mode is restored."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class FastGenerator:
    """Static-KV-cache, CUDA-graph rollout engine (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        pad_id: int,
        *,
        max_batch_size: int | None = None,
        cuda_graphs: bool | None = None,
        compile: bool = False,
        compile_backend: str = "inductor",
        kv_block: int = 256,
        sync_every: int = 16,
        keep_cache: bool = True,
        fused: bool | None = None,
        lora_pack: bool | None = None,
        decode_attn: bool | None = None,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        compact: bool | None = None,
        share_prefill: bool | None = None,
    ):
        if kv_block < 1 or sync_every < 1:
            raise ValueError(f"kv_block and sync_every must be >= 1, got {kv_block}, {sync_every}")
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1 (prompt tokens a prefill pass takes), got "
                             f"{max_num_batched_tokens}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None (all rows at once), got {max_batch_size}")
        self.model, self.pad_id = model, int(pad_id)
        self.runner = DecoderRunner(model, fused=fused, lora_pack=lora_pack, decode_attn=decode_attn)
        self.max_batch_size, self.kv_block, self.sync_every = max_batch_size, kv_block, sync_every
        self.cuda_graphs, self.keep_cache = cuda_graphs, keep_cache
        self.max_num_batched_tokens = max_num_batched_tokens
        self.share_prefill = _switch(share_prefill, SHARE_PREFILL_ENV, "a prompt's samples share one prefill",
                                     "every row prefilled")
        self.compact = _switch(compact, COMPACT_ENV, "finished rows leave the batch", "every row decodes to the end")
        self._decode = self.runner.decode
        if compile:
            self._decode = torch.compile(self.runner.decode, dynamic=False, backend=compile_backend)
        self._state: DecodeState | None = None
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._captured: set[tuple[int, int]] = set()  # shapes captured before (their re-capture skips the warm-up)
        self._captured_key: tuple | None = None  # ... with the weights of this fingerprint
        self._pool = None
        self._weights_key: tuple | None = None
        self.graph_error: str | None = None  # why graphs were switched off, if they were
        self.last_stats: dict = {}
        self.totals: dict[str, float] = {}  # TOTAL_KEYS of last_stats summed over every call (a trainer's step diffs)

    # --- public ---------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, n: int, generator: torch.Generator | None = None
    ) -> Rollout:
        """``n`` samples per prompt, rows ``[p0 a0, p0 a1, ..., p1 a0, ...]`` (HFGenerator's contract)."""
        params.validate()
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
        if not prompts:
            raise ValueError("no prompts to generate from; pass at least one list of token ids")
        check_generator(generator, self.runner.device)
        rows = [list(p) for p in prompts for _ in range(n)]
        bs = self.max_batch_size or len(rows)
        if self.max_batch_size is None:  # all rows at once -- as many as the device's memory holds
            bs = min(bs, self._rows_that_fit(len(rows), max(len(x) for x in rows), params.max_new_tokens))
        self.last_stats = {"rows": len(rows), "batch_rows": bs, "batches": 0, "steps": 0, "graph_captures": 0}
        order = list(range(len(rows)))
        if bs < len(rows):  # bucket by length; the sort is stable, so a prompt's n rows stay together
            order.sort(key=lambda i: len(rows[i]))
        t0 = time.perf_counter()
        try:
            with _eval_mode(self.model):
                self.runner.prepare_lora()  # this rollout's adapter weights (quarl.engine.lora)
                # full-parameter FP8 (precision.mode=jetrl): master weights' tiles current before any graph replays them
                refresh_master_tiles(self.model)
                parts = [
                    self._generate_batch([rows[i] for i in order[s : s + bs]], params, generator)
                    for s in range(0, len(rows), bs)
                ]
        finally:
            if not self.keep_cache:
                self.release()
        out = Rollout.cat(parts) if len(parts) > 1 else parts[0]
        if order != sorted(order):
            inverse = [0] * len(order)
            for pos, i in enumerate(order):
                inverse[i] = pos
            out = out.select(inverse)
        st = self.last_stats
        st["generated_tokens"] = int(out.completion_mask.sum())  # one sync, at the end
        st["seconds"] = time.perf_counter() - t0
        st["cuda_graphs"] = self._graphs_on()
        st["graph_error"] = self.graph_error
        for k in TOTAL_KEYS:
            self.totals[k] = self.totals.get(k, 0) + st.get(k, 0)
        return out

    @torch.no_grad()
    def warmup(self, rows: int, prompt_len: int, max_new_tokens: int) -> int:
        """Capture every decode graph that a batch of ``rows`` prompts padded to ``prompt_len``
        will replay over ``max_new_tokens`` steps, so the first real call pays no capture time
        (e.g. before an RL run's first step, or before a timed benchmark). Returns the number
        of graphs captured; 0 when graphs are off. The cache content it writes is garbage, but
        finite and invisible: every call's prefill resets which slots are valid."""
        if not self._graphs_on():
            return 0
        self.runner.check_length(prompt_len + max_new_tokens)
        if self.max_batch_size is None:  # the batch generate() will run: as many rows as memory holds
            rows = self._rows_that_fit(rows, prompt_len, max_new_tokens)
        B, S = _pow2(rows), _round_up(prompt_len + max_new_tokens, self.kv_block)
        self._lay_out_words(B)
        st = self._ensure_state(B, S)
        st.tok[:B].fill_(self.pad_id)
        st.pos[:B].zero_()
        buckets = sorted({min(S, _round_up(prompt_len + t, self.kv_block)) for t in range(1, max_new_tokens)})
        before = len(self._graphs)
        with _eval_mode(self.model):
            self.runner.prepare_lora()
            self._check_weights()
            for L in buckets:
                st.kv_valid[:B].zero_()
                st.slot.fill_(L - 1)
                if (B, L) not in self._graphs:
                    self._capture(st, B, L)
                if self.graph_error is not None:
                    return 0
        st.kv_valid[:B].zero_()
        return len(self._graphs) - before

    def release(self) -> None:
        """Free the KV cache and the captured graphs (the next call re-allocates and re-captures)."""
        self._state, self._graphs, self._pool, self._weights_key = None, {}, None, None

    @property
    def cache_bytes(self) -> int:
        return 0 if self._state is None else self._state.nbytes()

    # --- memory (quarl.engine.memory) -----------------------------------------------
    def _free_bytes(self) -> int | None:
        return memory.free_bytes(self.runner.device, self._state)

    def _rows_that_fit(self, n: int, P: int, T: int) -> int:
        """Most of ``n`` rows (prompts padded to ``P``, ``T`` new tokens) one batch may take (:mod:`memory`)."""
        S = _round_up(P + T, self.kv_block) if self._graphs_on() else P + T
        if self._state is not None:  # a cache that must grow keeps its longer length (_ensure_state)
            S = max(S, self._state.length)
        return memory.rows_that_fit(self.runner, n, P, T, S, self._free_bytes(), self.max_num_batched_tokens)

    # --- one batch ------------------------------------------------------------
    @torch.no_grad()
    def _generate_batch(
        self, rows: list[list[int]], params: SamplingParams, generator: torch.Generator | None
    ) -> Rollout:
        r, dev = self.runner, self.runner.device
        ids, mask = left_pad(rows, self.pad_id, dev)  # [N, P]
        N, P = ids.shape
        T = params.max_new_tokens
        r.check_length(P + T)
        graphs = self._graphs_on()
        B = _pow2(N) if graphs else N  # graph batch; rows [N, B) are inert
        S = _round_up(P + T, self.kv_block) if graphs else P + T
        self._lay_out_words(B)
        st = self._ensure_state(B, S)

        logits = self._prefill(st, rows, ids, mask)  # [N, V]
        st.pos[:N] = mask.sum(dim=1, keepdim=True)  # position of the first generated token
        st.slot.fill_(P)
        if B > N:
            st.kv_valid[N:B].zero_()
            st.pos[N:B].zero_()
            st.tok[N:B].fill_(self.pad_id)
        if graphs:
            self._check_weights()

        stop = torch.tensor(sorted(set(params.stop_token_ids)) or [-1], device=dev)
        tokens = torch.full((N, T), self.pad_id, dtype=torch.long, device=dev)
        logps = torch.zeros((N, T), dtype=torch.float32, device=dev)
        cmask = torch.zeros((N, T), dtype=torch.long, device=dev)
        done = torch.zeros(N, dtype=torch.bool, device=dev)
        pad = torch.full((N,), self.pad_id, dtype=torch.long, device=dev)
        rows_at = None  # with compaction: rows_at[j] = the row (of N) that state row j decodes; None = identity
        n = N  # state rows in use: every row until the first compaction
        # the Triton sampler (quarl.engine.sampling): with the fused kernels, when its switch is on -- decided here,
        # once a call, not for every token
        fused_sample = self.runner.fused_on() and fused_sampler() is not None
        for t in range(T):
            if t:
                L = min(S, _round_up(P + t, self.kv_block)) if graphs else P + t  # slots [0, P + t) are live
                self._step(st, B, L, graphs)
                logits = st.logits[:n]
                st.slot.add_(1)
                st.pos.add_(1)
            # the noise of all N rows is drawn, whatever n is: a compacted batch samples what the full one would
            tok, lp = sample(logits, params.temperature, params.top_p, generator, rows_of=rows_at, all_rows=N,
                             fused=fused_sample)  # [n]
            idx = slice(None) if rows_at is None else rows_at
            live = ~done[idx]  # [n]
            tokens[idx, t] = torch.where(live, tok, pad[:n])
            logps[idx, t] = torch.where(live, lp, 0.0)
            cmask[idx, t] = live.long()
            done[idx] = done[idx] | (live & torch.isin(tok, stop))
            st.tok[:n, 0] = tok
            if (t + 1) % self.sync_every == 0 and t + 1 < T:
                left = int((~done).sum())  # the one host sync every sync_every steps
                if left == 0:
                    break
                smaller = self._smaller_batch(left, n, graphs) if self.compact else None
                if smaller is not None:
                    n, rows_at = self._compact(st, done, rows_at, n, left, smaller, P + t)
                    B = smaller
        steps = int(cmask.any(dim=0).sum())  # live columns form a prefix
        stats = self.last_stats
        stats["batches"] += 1
        stats["steps"] += steps
        return Rollout(
            prompt_ids=ids,
            prompt_mask=mask,
            completion_ids=tokens[:, :steps],
            completion_mask=cmask[:, :steps],
            logprobs=logps[:, :steps],
            truncated=~done,
            pad_id=self.pad_id,
        )

    def _prefill(self, st: DecodeState, rows: list[list[int]], ids: torch.Tensor, mask: torch.Tensor
                 ) -> torch.Tensor:
        """Fill cache columns ``[0, P)`` of state rows ``[0, N)`` and return the last position's logits ``[N, V]``.

        In chunks of <= ``max_num_batched_tokens`` tokens (whole rows): the prefill's activations -- the MLP's
        ``[rows * P, 2 * intermediate]`` -- stay bounded (one pass of 256 x 1024 tokens ran a 7B BF16 engine out of
        memory, and 128 x 1024 passed 2**31 elements in a gate / up output: session 15). A prompt repeated in
        consecutive rows (its ``n`` samples) is run once (``share_prefill``): its K/V columns, valid slots and logits
        are copied to the other rows -- the same values a prefill of each would compute, for 1/n of the work."""
        r, N, P = self.runner, ids.shape[0], ids.shape[1]
        c = max(1, self.max_num_batched_tokens // P)
        firsts, src = [], []  # the first row of each run of equal rows; for every row, its run's index
        for i in range(N):
            if not self.share_prefill or i == 0 or rows[i] != rows[i - 1]:
                firsts.append(i)
            src.append(len(firsts) - 1)
        U = len(firsts)
        self.last_stats["prefilled_rows"] = self.last_stats.get("prefilled_rows", 0) + U
        if U == N:
            return torch.cat([r.prefill(st, ids[i:i + c], mask[i:i + c], row0=i) for i in range(0, N, c)])
        uids, umask = ids[firsts], mask[firsts]  # [U, P]: each run of equal rows once, into state rows [0, U)
        ulogits = torch.cat([r.prefill(st, uids[i:i + c], umask[i:i + c], row0=i) for i in range(0, U, c)])
        src = torch.tensor(src, device=ids.device)  # [N]: the unique row each row copies (<= it)
        move_rows(st.k + st.v, src, P)
        move_rows([st.kv_valid], src)
        return ulogits[src]

    # --- compaction ----------------------------------------------------------------
    def _smaller_batch(self, left: int, n: int, graphs: bool) -> int | None:
        """The batch the ``left`` unfinished rows would decode in, when it is at most half of today's (else None:
        the copy and, with graphs, the captures of a new batch shape would not pay). Graph batches stop at
        ``COMPACT_MIN_GRAPH_BATCH``: below it a 7B step is nearly as long (weight-bound) and each new shape costs a
        capture per call when the trainer frees the cache."""
        now = _pow2(n) if graphs else n
        new = max(_pow2(left), min(now, COMPACT_MIN_GRAPH_BATCH)) if graphs else left
        return new if 2 * new <= now else None

    def _compact(self, st: DecodeState, done: torch.Tensor, rows_at: torch.Tensor | None, n: int, left: int,
                 B: int, cols: int) -> tuple[int, torch.Tensor]:
        """Move the unfinished rows' decode state (K/V columns ``[0, cols)``, valid slots, next token, position)
        to state rows ``[0, left)``; rows ``[left, B)`` (up to the new batch) made inert. Returns the rows in use
        and the row map."""
        rows_at = torch.arange(n, device=done.device) if rows_at is None else rows_at
        keep = (~done[rows_at]).nonzero().squeeze(1)  # [left] state rows still decoding, in order (keep[j] >= j)
        move_rows(st.k + st.v, keep, cols)
        move_rows([st.kv_valid, st.tok, st.pos], keep)
        if B > left:  # inert rows up to the graph batch, as after the prefill
            st.kv_valid[left:B].zero_()
            st.pos[left:B].zero_()
            st.tok[left:B].fill_(self.pad_id)
        self.last_stats["compactions"] = self.last_stats.get("compactions", 0) + 1
        return left, rows_at[keep]

    # --- state and graphs ------------------------------------------------------
    def _graphs_on(self) -> bool:
        on = self.runner.device.type == "cuda" if self.cuda_graphs is None else self.cuda_graphs
        if on and self.runner.device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs the model on a CUDA device, it is on {self.runner.device}")
        return on and self.graph_error is None

    def _ensure_state(self, B: int, S: int) -> DecodeState:
        st = self._state
        r = self.runner
        if (
            st is not None
            and st.batch >= B
            and st.length >= S
            and st.k[0].device == r.device
            and st.k[0].dtype == r.dtype
            and len(st.k) == len(r.layers)
        ):
            return st
        if st is not None:  # grow; graphs captured on the old buffers are void
            B, S = max(B, st.batch), max(S, st.length)
        self.release()
        self._state = r.new_state(B, S)
        return self._state

    def _fingerprint(self) -> tuple:
        """Addresses of every tensor a captured graph reads, and the kernel switch."""
        m = self.model
        ptrs = [t.data_ptr() for t in itertools.chain(m.parameters(), m.buffers())]
        ptrs += [getattr(x, "_wcache", None).data_ptr() for x in m.modules() if getattr(x, "_wcache", None) is not None]
        ptrs += [t.data_ptr() for t in self.runner.lora_buffers()]
        return (len(ptrs), hash(tuple(ptrs)), os.environ.get("QUARL_KERNELS", "auto"))

    def _lay_out_words(self, rows: int) -> None:
        """The frozen 4-bit weights in the layout that decoding ``rows`` rows a step reads fastest
        (``packed_layout.wanted``: [64, 8]-word blocks from two rows, row-major for one), converted in place -- the
        trainer shares these modules and its kernels read either layout; saved artifacts stay row-major. A change
        moves the buffers, so ``_check_weights`` re-captures the graphs."""
        if packed_layout.wanted(rows):
            packed_layout.block_model(self.model)
        else:
            packed_layout.unblock_model(self.model)
        self.last_stats["blocked_layers"] = packed_layout.count_blocked(self.model)

    def _check_weights(self) -> None:
        key = self._fingerprint()
        if key != self._weights_key:
            self._graphs.clear()
            self._weights_key = key
        if key != self._captured_key:  # other weights than those captured before (release() keeps this): warm up
            self._captured.clear()
            self._captured_key = key

    def _step(self, st: DecodeState, B: int, L: int, graphs: bool) -> None:
        if not graphs or self.graph_error is not None:
            self._decode(st, B, L)
            return
        g = self._graphs.get((B, L))
        if g is not None:
            g.replay()
        else:
            self._capture(st, B, L)

    def _capture(self, st: DecodeState, B: int, L: int) -> None:
        """Capture the step of shape ``(B, L)``. The first time, run it eagerly first (warm-up, on a side stream:
        cuBLAS handles, Triton compiles, lazy caches); the warm-up produced this step's outputs and the step is
        idempotent, so nothing is replayed. A shape this engine captured before -- re-captured because the cache
        was freed (``keep_cache=False``, the RL trainer's default) -- skips the warm-up (two eager steps: 0.5 s of
        a 7B NVFP4 batch-64 rollout, RESULTS "Issue 17, session 13") and replays the new graph once for this
        step's outputs; should that capture fail, the warm-up path is tried before giving up. A failed capture
        switches graphs off for good (eager decoding, with a warning)."""
        dev = self.runner.device
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        warm = (B, L) not in self._captured
        if warm:
            self._warm_up(st, B, L)
        t1 = time.perf_counter() if warm else t0
        err = self._record(st, B, L)
        if err is not None and not warm:
            warm = True
            self._warm_up(st, B, L)
            t1 = time.perf_counter()
            err = self._record(st, B, L)
        if err is not None:
            self.graph_error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            self._graphs.clear()
            warnings.warn(
                f"CUDA graph capture of the decode step failed ({self.graph_error}); decoding eagerly. A layer's "
                f"compute path syncs with the host -- typically a quantized format without a GPU kernel for "
                f"this dtype (see quarl.quant.dispatch); expect lower tokens/s",
                RuntimeWarning,
                stacklevel=4,
            )
            return  # the warm-up made this step's outputs
        if not warm:
            self._graphs[(B, L)].replay()  # recording ran nothing: this step's outputs
        self._captured.add((B, L))
        torch.cuda.synchronize(dev)
        stats = self.last_stats
        stats["graph_captures"] = stats.get("graph_captures", 0) + 1
        # where a capture's time goes: the eager warm-up steps (first capture of a shape only), then recording +
        # instantiation (+ the one replay of a re-capture)
        stats["warmup_s"] = stats.get("warmup_s", 0.0) + (t1 - t0)
        stats["capture_s"] = stats.get("capture_s", 0.0) + (time.perf_counter() - t1)

    def _warm_up(self, st: DecodeState, B: int, L: int) -> None:
        side = torch.cuda.Stream(device=self.runner.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._decode(st, B, L)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize(self.runner.device)

    def _record(self, st: DecodeState, B: int, L: int) -> Exception | None:
        """Record the step into a new graph (kept in ``_graphs``); the exception if the capture failed."""
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream(self.runner.device)
        try:
            with torch.cuda.graph(g, pool=self._pool):
                self._decode(st, B, L)
        except Exception as e:  # noqa: BLE001 - any capture failure means "warm up / run this model eagerly"
            torch.cuda.set_stream(stream)  # a failed capture_end skips the graph context's stream restore
            torch.cuda.synchronize(self.runner.device)
            return e
        self._pool = g.pool()
        self._graphs[(B, L)] = g
        return None


__all__ = ["FastGenerator"]
