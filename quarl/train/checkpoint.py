"""Trainer checkpoints: everything needed to continue a run at exactly the next step (rl today, every trainer next).

Layout (one directory per checkpoint, under the run's checkpoint root)::

    step-000050/
        trainable.safetensors   every parameter that trains (LoRA A/B, or all weights for Full)
        adapter/                the same LoRA as a PEFT adapter (LoRA runs; for people and export)
        metrics.jsonl           the metrics history up to this step (so a fresh pod resuming from S3 keeps it)
        optimizer.pt            optimizer.state_dict()
        rng.pt                  torch CPU/CUDA, python, numpy and the run's own generators
        state.json              step, data position, AQN schedule state, lr, config digest
    latest                      text file: the newest complete checkpoint's directory name

Under torchrun (``dist`` given, :mod:`quarl.train.distributed`) rank 0 writes the
directory and every rank's RNG state (``rng-rank<r>.pt`` beside rank 0's ``rng.pt``;
each rank samples its own rollouts). Replicated trainable weights (data-parallel LoRA)
keep the files above; sharded ones (FSDP2, ``sharded=True``) are written by every rank
through torch.distributed.checkpoint into ``dcp/`` instead of ``trainable.safetensors``
and ``optimizer.pt`` (:mod:`quarl.train.fsdp`), and load into any world size.

Crash safety. A checkpoint is written into ``.tmp-step-N-<pid>`` and renamed into
place only when every file is on disk; ``latest`` is then replaced atomically.
A crash at any moment leaves the previous checkpoint and a valid ``latest``
(plus, at worst, a ``.tmp-*`` directory that the next save removes). When the
run's output is ``s3://``, each completed checkpoint is uploaded to
``<root uri>/step-N/`` and ``latest`` is uploaded *after* it, so the remote
pointer never names a partial upload either.

The learning-rate schedule is a pure function of the step (see the trainer), so
"scheduler state" is the step itself. Loading uses ``torch.load(weights_only=True)``:
a checkpoint cannot execute code.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from quarl.train.distributed import SINGLE, Dist

LATEST = "latest"
DCP_DIR = "dcp"


def _dir_name(step: int) -> str:
    return f"step-{step:06d}"


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Trainable parameters by name, each storage once (tied embeddings are saved under one name)."""
    out, seen = {}, set()
    for name, p in model.named_parameters():  # named_parameters already skips tied duplicates
        if p.requires_grad and p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            out[name] = p.detach().contiguous().cpu()
    return out


def rng_state(generators: dict[str, torch.Generator]) -> dict:
    np_state = np.random.get_state()
    st = {
        "torch": torch.get_rng_state(),
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "generators": {k: g.get_state() for k, g in generators.items()},
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict, generators: dict[str, torch.Generator]) -> None:
    torch.set_rng_state(st["torch"])
    py = st["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = st["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), *n[2:]))
    for k, g in generators.items():
        g.set_state(st["generators"][k])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


class CheckpointManager:
    """Saves/loads checkpoints under a local ``root``; mirrors them to ``remote`` (s3://) when given."""

    def __init__(self, root: str | Path, remote: str | None = None, keep: int = 2):
        self.root, self.remote, self.keep = Path(root), remote, max(keep, 1)
        self.root.mkdir(parents=True, exist_ok=True)

    # -- save ------------------------------------------------------------------
    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict,
             generators: dict[str, torch.Generator], extras=None, *, dist: Dist = SINGLE,
             sharded: bool = False) -> Path:
        if dist.enabled or sharded:
            return self._save_distributed(step, model, optimizer, state, generators, extras, dist, sharded)
        for stale in self.root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        final = self.root / _dir_name(step)
        tmp = self.root / f".tmp-{_dir_name(step)}-{os.getpid()}"
        tmp.mkdir(parents=True)
        save_file(trainable_state(model), str(tmp / "trainable.safetensors"))
        if extras is not None:  # caller's extra files (PEFT adapter, metrics history)
            extras(tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(rng_state(generators), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=2, sort_keys=True))
        self._publish(tmp, final)
        return final

    def _save_distributed(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict,
                          generators: dict[str, torch.Generator], extras, dist: Dist, sharded: bool) -> Path:
        """Every rank calls this; rank 0 writes all but the DCP shards and publishes the directory."""
        rngs = dist.all_gather_object(rng_state(generators))  # [world] of each rank's RNG state
        final = self.root / _dir_name(step)
        tmp = self.root / f".tmp-{_dir_name(step)}-{dist.broadcast_object(os.getpid())}"
        if dist.is_main:
            for stale in self.root.glob(".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        if sharded:
            from quarl.train.fsdp import save_sharded

            save_sharded(tmp / DCP_DIR, model, optimizer)  # a collective: every rank writes its shard
        if dist.is_main:
            if not sharded:
                save_file(trainable_state(model), str(tmp / "trainable.safetensors"))
                torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            if extras is not None:
                extras(tmp)
            torch.save(rngs[0], tmp / "rng.pt")
            for r in range(1, len(rngs)):
                torch.save(rngs[r], tmp / f"rng-rank{r}.pt")
            (tmp / "state.json").write_text(json.dumps({**state, "step": step, "world_size": dist.world_size},
                                                       indent=2, sort_keys=True))
            if sharded:
                missing = [r for r in range(dist.world_size) if not list((tmp / DCP_DIR).glob(f"__{r}_*"))]
                if missing:
                    raise RuntimeError(f"the checkpoint directory {tmp} holds no DCP shard of rank(s) {missing}: the "
                                       f"ranks do not share one filesystem. Sharded (full-parameter) checkpoints on "
                                       f"several nodes need the work directory on a shared volume (ReadWriteMany) "
                                       f"mounted at the same path on every node (QUARL_CACHE for s3:// outputs)")
            self._publish(tmp, final)
        dist.barrier()
        return final

    def _publish(self, tmp: Path, final: Path) -> None:
        """A complete ``tmp`` becomes checkpoint ``final``: renamed into place, then ``latest`` names it, then
        the remote copy (``latest`` uploaded after it), then old checkpoints pruned."""
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self._write_latest(final.name)
        if self.remote:
            self._upload(final)
        self._prune()

    def _write_latest(self, name: str) -> None:
        tmp = self.root / f".{LATEST}.tmp"
        tmp.write_text(name + "\n")
        os.replace(tmp, self.root / LATEST)

    def _upload(self, ckpt: Path) -> None:
        from quarl.storage import S3Store

        store = S3Store()
        base = self.remote.rstrip("/")
        store.upload_dir(ckpt, f"{base}/{ckpt.name}")
        store.upload_file(self.root / LATEST, f"{base}/{LATEST}")

    def _prune(self) -> None:
        ckpts = sorted(p for p in self.root.glob("step-*") if p.is_dir())
        for old in ckpts[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    # -- load ------------------------------------------------------------------
    def latest(self, *, dist: Dist = SINGLE) -> Path | None:
        """The newest complete checkpoint: local first, else fetched from the remote mirror.

        Under torchrun every rank calls it; rank 0 looks (and downloads) first, and every
        rank must find the same one (a node that cannot see the work directory would not)."""
        if not dist.enabled:
            return self._latest()
        with dist.main_first():
            ckpt = self._latest()
        names = dist.all_gather_object(ckpt.name if ckpt is not None else None)
        if len(set(names)) > 1:
            raise RuntimeError(f"ranks found different checkpoints to resume from ({names}): the work directory is "
                               f"not shared by every node; use an s3:// output (checkpoints are mirrored there) or "
                               f"a shared volume")
        return ckpt

    def _latest(self) -> Path | None:
        p = self.root / LATEST
        if p.exists():
            ckpt = self.root / p.read_text().strip()
            if (ckpt / "state.json").exists():
                return ckpt
        if self.remote:
            from quarl.storage import S3Store

            store = S3Store()
            base = self.remote.rstrip("/")
            if store.exists(f"{base}/{LATEST}"):
                name = store.get_bytes(f"{base}/{LATEST}").decode().strip()
                dest = self.root / name
                store.download_dir(f"{base}/{name}", dest)
                self._write_latest(name)
                return dest
        return None

    @staticmethod
    def load(ckpt: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
             generators: dict[str, torch.Generator], *, dist: Dist = SINGLE) -> dict:
        """Restore weights, optimizer and RNG from ``ckpt``; returns its state.json.

        Under torchrun every rank calls it. A rank restores its own RNG file when the
        checkpoint has one; ``state["rng_restored"]`` is False when it had to take rank
        0's (a run resumed on more ranks than it was saved with)."""
        rng_file = ckpt / (f"rng-rank{dist.rank}.pt" if dist.rank > 0 else "rng.pt")
        own = rng_file.exists()
        if (ckpt / DCP_DIR).is_dir():
            from quarl.train.fsdp import load_sharded

            load_sharded(ckpt / DCP_DIR, model, optimizer)
        else:
            CheckpointManager._load_replicated(ckpt, model, optimizer)
        set_rng_state(torch.load(rng_file if own else ckpt / "rng.pt", weights_only=True), generators)
        return {**json.loads((ckpt / "state.json").read_text()), "rng_restored": own}

    @staticmethod
    def _load_replicated(ckpt: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        from quarl.train.fsdp import is_sharded

        if is_sharded(model):
            raise ValueError(f"checkpoint {ckpt} was written by one process (trainable.safetensors), but this run "
                             f"shards the model over several ranks (FSDP2); resume it with one process, or start "
                             f"a fresh output. Checkpoints written under torchrun (dcp/) load on any world size")
        sd = load_file(str(ckpt / "trainable.safetensors"))
        params = dict(model.named_parameters())
        missing = [k for k in sd if k not in params]
        if missing:
            raise ValueError(f"checkpoint {ckpt} has parameters this model lacks ({missing[:3]} ...): it was written "
                             f"by a different policy (format / LoRA targets / model); use a fresh output")
        expect = set(trainable_state(model))
        if set(sd) != expect:
            raise ValueError(f"checkpoint {ckpt} trains {len(sd)} tensors but this policy trains {len(expect)}; "
                             f"resume with the same policy settings or use a fresh output")
        with torch.no_grad():
            for k, v in sd.items():
                params[k].copy_(v.to(params[k].dtype))
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True, map_location="cpu"))
