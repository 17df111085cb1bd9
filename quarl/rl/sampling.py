"""Which prompts a step trains on: a resumable prompt order, and DAPO's dynamic sampling.

PromptSampler. Each epoch is a fresh permutation of the prompt indices drawn from
``seed + epoch`` (a generator of its own, so nothing else that consumes random
numbers can change the data order), read sequentially; a step that crosses the
end of an epoch continues into the next one. Its whole state is
``(epoch, position)``, saved in every checkpoint, which is what lets a resumed
run see exactly the prompts the uninterrupted run would have seen.

Dynamic sampling (DAPO Sec. 3.2). A group whose G rewards are all equal (all
right or all wrong) has zero advantage, so it only dilutes the batch. DAPO keeps
sampling prompts until the batch holds ``target`` groups with some spread in
reward, dropping the flat ones. :func:`dynamic_sample` implements the refill
over any ``draw()`` that returns a :class:`ScoredBatch`; it stops after
``max_rounds`` draws and returns what it has (possibly fewer groups than asked
-- small models early in training produce many flat groups; the trainer logs
the shortfall and trains on what there is, or skips the update if nothing is
informative, rather than looping forever as an unbounded refill could).

Under torchrun each rank draws its share of every round's prompts; the informative
flags of all ranks are gathered in rank order and the first ``target`` of them are kept,
exactly the groups one process drawing the same rollouts would keep. So every rank
stops after the same round, and a rank may end with none of the kept groups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from quarl.engine.rollout import Rollout
from quarl.rl.losses import informative_groups
from quarl.train.distributed import SINGLE, Dist


class PromptSampler:
    """Deterministic, resumable stream of prompt indices over ``n`` prompts."""

    def __init__(self, n: int, seed: int, shuffle: bool = True):
        if n <= 0:
            raise ValueError("the training split has no prompts; check the dataset artifact and train.split")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.position >= self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            take = min(k - len(out), self.n - self.position)
            out.extend(self._order[self.position:self.position + take])
            self.position += take
        return out

    @property
    def epochs_done(self) -> float:
        return self.epoch + self.position / self.n

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "n": self.n, "seed": self.seed}

    def load_state_dict(self, s: dict) -> None:
        if s["n"] != self.n or s["seed"] != self.seed:
            raise ValueError(f"checkpoint data position was saved for {s['n']} prompts / seed {s['seed']}, "
                             f"but this run has {self.n} prompts / seed {self.seed}; resume with the same dataset "
                             f"and train.seed, or start a fresh output")
        self.epoch, self.position = s["epoch"], s["position"]
        self._order = self._permutation(self.epoch)


@dataclass
class ScoredBatch:
    """A rollout with its rewards; rows in groups of G consecutive answers to one prompt."""

    rollout: Rollout
    rewards: torch.Tensor  # [N] total reward used for advantages
    accuracy: torch.Tensor  # [N]
    format: torch.Tensor  # [N]
    prompt_index: list[int]  # [N] dataset row of each answer's prompt
    texts: list[str] = field(default_factory=list)  # [N] decoded completions

    def __len__(self) -> int:
        return len(self.rollout)

    def select_groups(self, groups: torch.Tensor, group_size: int) -> ScoredBatch:
        """Keep the groups where ``groups`` ([N/G] bool) is true."""
        rows = [g * group_size + j for g in torch.nonzero(groups).flatten().tolist() for j in range(group_size)]
        return ScoredBatch(self.rollout.select(rows), self.rewards[rows], self.accuracy[rows], self.format[rows],
                           [self.prompt_index[i] for i in rows], [self.texts[i] for i in rows] if self.texts else [])

    @staticmethod
    def cat(parts: list[ScoredBatch]) -> ScoredBatch:
        return ScoredBatch(
            Rollout.cat([p.rollout for p in parts]),
            torch.cat([p.rewards for p in parts]),
            torch.cat([p.accuracy for p in parts]),
            torch.cat([p.format for p in parts]),
            [i for p in parts for i in p.prompt_index],
            [t for p in parts for t in p.texts],
        )


def dynamic_sample(
    draw: Callable[[], ScoredBatch],
    group_size: int,
    target_groups: int,
    max_rounds: int,
    dist: Dist = SINGLE,
) -> tuple[ScoredBatch | None, ScoredBatch, dict]:
    """Draw until ``target_groups`` informative groups are collected or ``max_rounds`` draws were made.

    Returns ``(kept, drawn, stats)``: ``kept`` has at most ``target_groups`` groups
    (``None`` if no group was informative); ``drawn`` is everything sampled (for
    honest reward/accuracy metrics); ``stats`` counts rounds and groups. Under torchrun
    (``dist``) ``kept`` and ``drawn`` are this rank's, ``stats`` the whole run's.
    """
    if max_rounds < 1:
        raise ValueError(f"max_sampling_rounds must be >= 1, got {max_rounds}")
    kept: list[ScoredBatch] = []
    drawn: list[ScoredBatch] = []
    n_kept = n_drawn = rounds = 0
    while rounds < max_rounds and n_kept < target_groups:
        b = draw()
        rounds += 1
        drawn.append(b)
        mine = informative_groups(b.rewards, group_size)  # [groups in b]
        good = dist.all_gather_rows(mine)  # [groups of every rank], rank order
        offset = sum(dist.all_gather_object(mine.numel())[:dist.rank])
        n_drawn += good.numel()
        if good.any():
            # keep only as many as still needed, in draw order
            need = target_groups - n_kept
            idx = torch.nonzero(good).flatten()[:need]
            mask = torch.zeros_like(good)
            mask[idx] = True
            n_kept += int(mask.sum())
            mask = mask[offset:offset + mine.numel()]  # this rank's part of the selection
            if mask.any():
                kept.append(b.select_groups(mask, group_size))
    stats = {
        "sampling/rounds": rounds,
        "sampling/groups_drawn": n_drawn,
        "sampling/groups_kept": n_kept,
        "sampling/kept_fraction": n_kept / max(n_drawn, 1),
        "sampling/shortfall": max(target_groups - n_kept, 0),
    }
    return (ScoredBatch.cat(kept) if kept else None), ScoredBatch.cat(drawn), stats
