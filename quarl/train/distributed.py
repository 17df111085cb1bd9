"""Several processes, one run: the torch.distributed process group and the collectives a trainer needs.

A stage runs unchanged under ``torchrun`` (one process per GPU, any number of nodes)::

    torchrun --nnodes N --nproc-per-node G -m quarl.cli.main rl|distill ...

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``;
:func:`init_distributed` reads them and joins the process group (NCCL on CUDA, gloo on
CPU). Without them (``WORLD_SIZE`` unset or 1) nothing is initialised and every
helper here is the identity, so the one-process path is exactly what it was.

Who does what (the contract, docs/distributed.md):

* every rank builds the same policy from the same seed and reads the same data; the
  data order (``PromptSampler``) is replicated, so every rank knows the global batch
  of a step and takes its contiguous share of it (:meth:`Dist.shard`) -- whole prompt
  groups in RL, whole sequences in distillation;
* losses are normalised by *global* counts (tokens or sequences of the whole step,
  summed over ranks) and gradients are *summed* over ranks, so the update equals the
  one-process update up to the order of floating-point additions;
* rank 0 alone writes: the artifact, checkpoints (except DCP shards, which every rank
  writes), metrics.jsonl / TensorBoard, samples and the progress bar.

Why an explicit all-reduce instead of DistributedDataParallel for LoRA
(:meth:`Dist.all_reduce_grads`): (1) the trainers do not call the model's
``forward`` -- they run its decoder and then the LM head in checkpointed chunks, and
the rollout engine drives the same modules -- while DDP's reducer expects exactly one
forward of the wrapper per backward; (2) ranks may run a different number of
micro-batches in one step (DAPO keeps a different number of groups on each rank, and a
rank may keep none), and DDP all-reduces inside every backward, which deadlocks when
the counts differ; one all-reduce of the summed gradients after the last micro-batch
has no such constraint; (3) DDP broadcasts every parameter *and buffer* from rank 0 at
construction -- for a frozen 4-bit 70B base that is 35 GB of packed ``QuantLinear``
buffers that every rank already built identically; here only the trainable LoRA
tensors are broadcast (:meth:`Dist.broadcast_params`). The cost is the same as DDP's
without its overlap of communication and backward: one bucketed all-reduce of the
LoRA gradients per optimizer step (80 M fp32 values at 7B, r 32).

Full-parameter training shards the model with FSDP2 instead (:mod:`quarl.train.fsdp`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)

__all__ = ["SINGLE", "Dist", "current", "distributed", "env_world_size", "init_distributed"]

_BUCKET = 1 << 25  # elements per all-reduce bucket (128 MiB of fp32)


def env_world_size() -> int:
    """``WORLD_SIZE`` as torchrun sets it (1 when unset)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


@dataclass(frozen=True)
class Dist:
    """This process's place in the run. ``Dist()`` is the single process (every method a no-op)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ----------------------------------------------------------------------- placement
    def device(self, device: torch.device) -> torch.device:
        """``cuda`` -> ``cuda:LOCAL_RANK`` (one GPU per process); other devices unchanged."""
        if device.type == "cuda" and self.enabled and device.index is None:
            return torch.device("cuda", self.local_rank)
        return device

    def shard(self, n: int) -> slice:
        """This rank's contiguous share of ``n`` items (the first ``n % world`` ranks take one more)."""
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (1 if self.rank < extra else 0))

    # ----------------------------------------------------------------------- collectives
    def _comm_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce(self, x, op: str = "sum"):
        """Sum / max / min of a number or tensor over ranks (a number in, a float out)."""
        if not self.enabled:
            return x
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        if isinstance(x, torch.Tensor):
            t = x.detach().to(self._comm_device()).clone()
            dist.all_reduce(t, op=ops[op])
            return t.to(x.device)
        t = torch.tensor([float(x)], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op=ops[op])
        return float(t.item())

    def all_gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's ``t`` ([n_r] or [n_r, w_r]) concatenated along dim 0 in rank order.

        Rows of different widths are right-padded with zeros to the widest (rollouts of
        different ranks have different completion widths). The result is on ``t``'s device."""
        if not self.enabled:
            return t
        dev = self._comm_device()
        meta = torch.tensor([t.shape[0], t.shape[1] if t.dim() > 1 else 0], dtype=torch.long, device=dev)
        metas = [torch.zeros_like(meta) for _ in range(self.world_size)]
        dist.all_gather(metas, meta)
        rows = [int(m[0]) for m in metas]
        width = max(int(m[1]) for m in metas)
        n = max(rows)
        shape = (n, width) if t.dim() > 1 else (n,)
        orig = t.dtype
        x = t.detach().to(dev)
        if x.dtype == torch.bool:
            x = x.to(torch.uint8)
        buf = torch.zeros(shape, dtype=x.dtype, device=dev)
        if t.dim() > 1:
            buf[:x.shape[0], :x.shape[1]] = x
        else:
            buf[:x.shape[0]] = x
        parts = [torch.zeros_like(buf) for _ in range(self.world_size)]
        dist.all_gather(parts, buf)
        out = torch.cat([p[:r] for p, r in zip(parts, rows)])
        return out.to(device=t.device, dtype=orig)

    def all_gather_object(self, obj) -> list:
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj, src: int = 0):
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def on_main(self, fn, what: str):
        """``fn()`` on rank 0 alone (writing the artifact); every rank learns whether it succeeded, so the
        others wait for it and the job ends with it. Rank 0's result (None elsewhere); a failure raises on
        every rank (rank 0 re-raises its own error)."""
        result = err = None
        if self.is_main:
            try:
                result = fn()
            except BaseException as e:  # noqa: BLE001 -- re-raised below, after telling the other ranks
                err = e
        if not self.broadcast_object(err is None):
            if err is not None:
                raise err
            raise RuntimeError(f"rank 0 failed to write the {what}; its log has the error")
        return result

    @torch.no_grad()
    def broadcast_params(self, params: list[nn.Parameter], src: int = 0) -> None:
        """Make every rank's ``params`` rank ``src``'s (the trainable tensors only; they are small)."""
        if not self.enabled:
            return
        dev = self._comm_device()
        for p in params:
            t = p.data.to(dev)
            dist.broadcast(t, src=src)
            if t.data_ptr() != p.data.data_ptr():
                p.data.copy_(t)

    @torch.no_grad()
    def all_reduce_grads(self, params: list[nn.Parameter]) -> None:
        """Sum every parameter's gradient over ranks, in buckets of one dtype (a missing grad counts as 0).

        The losses are already divided by the global token / sequence counts, so the sum is
        the full-batch gradient; every rank ends with the same gradient and hence takes the
        same optimizer step."""
        if not self.enabled:
            return
        dev = self._comm_device()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
        for p in params:
            by_dtype.setdefault(p.grad.dtype, []).append(p)
        for group in by_dtype.values():
            bucket: list[nn.Parameter] = []
            size = 0
            for p in group + [None]:
                if p is not None and (not bucket or size + p.numel() <= _BUCKET):
                    bucket.append(p)
                    size += p.numel()
                    continue
                flat = torch.cat([q.grad.reshape(-1) for q in bucket]).to(dev)
                dist.all_reduce(flat)
                flat = flat.to(bucket[0].grad.device)
                off = 0
                for q in bucket:
                    q.grad.copy_(flat[off:off + q.numel()].view_as(q.grad))
                    off += q.numel()
                if p is not None:
                    bucket, size = [p], p.numel()

    @contextlib.contextmanager
    def main_first(self):
        """Rank 0 runs the body first, then each node's local rank 0, then every other rank.

        For downloads into a cache shared by the processes of a node (models, artifacts,
        checkpoints from the S3 mirror): the first process fills it, the others find it."""
        if not self.enabled:
            yield
            return
        if not self.is_main:
            dist.barrier()
            if self.local_rank != 0:
                dist.barrier()
        try:
            yield
        finally:
            if self.is_main:
                dist.barrier()
                dist.barrier()
            elif self.local_rank == 0:
                dist.barrier()


SINGLE = Dist()


def current() -> Dist:
    """The process group this process belongs to (``SINGLE`` when none is initialised)."""
    if not (dist.is_available() and dist.is_initialized()):
        return SINGLE
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))


def init_distributed(device: str | torch.device = "auto") -> tuple[Dist, bool]:
    """Join the torchrun process group if ``WORLD_SIZE > 1`` -> ``(dist, created)``.

    Backend: NCCL when the run trains on CUDA, gloo otherwise. ``created`` says whether
    this call made the group (the caller then destroys it; :func:`distributed`). The
    collective timeout is ``QUARL_DIST_TIMEOUT_S`` (default 3600 s): rank 0 alone writes
    the artifact and evaluates at the end while the others wait."""
    if dist.is_available() and dist.is_initialized():
        return current(), False
    if env_world_size() <= 1:
        return SINGLE, False
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed; run one process")
    from quarl import devices

    dev = devices.resolve_device(str(device), key="train.device") if not isinstance(device, torch.device) else device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local)
    timeout = datetime.timedelta(seconds=float(os.environ.get("QUARL_DIST_TIMEOUT_S", "3600")))
    kw = {"device_id": torch.device("cuda", local)} if backend == "nccl" else {}
    dist.init_process_group(backend=backend, timeout=timeout, **kw)
    d = current()
    log.info("torch.distributed: rank %d of %d (local %d), backend %s", d.rank, d.world_size, d.local_rank, backend)
    return d, True


@contextlib.contextmanager
def distributed(device: str | torch.device = "auto"):
    """``with distributed(cfg.train.device) as d:`` -- join the group for a stage, leave it after."""
    d, created = init_distributed(device)
    quiet = d.enabled and not d.is_main
    root = logging.getLogger()
    level = root.level
    if quiet:  # one log, rank 0's
        root.setLevel(max(level, logging.WARNING))
    try:
        yield d
    finally:
        if quiet:
            root.setLevel(level)
        if created:
            dist.destroy_process_group()
