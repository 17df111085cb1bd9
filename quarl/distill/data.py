"""Training sequences for distillation: the data sources of QAD Table 5, and their reuse.

    seqs = build_sequences(cfg.data, tokenizer, df=train_df, teacher=teacher, seed=0)   # Sequences
    ids, attn, labels, loss_mask = collate(seqs, rows, pad_id)                           # [b, L] each

Sources (``data.source``):

* ``sft``: the dataset's own text, ``text_columns`` joined (prompt + worked
  solution; rows without a solution fall back to the final answer);
* ``teacher``: completions sampled from the teacher for the dataset's (RL) prompts;
* ``teacher_correct``: the same, keeping only completions whose final answer
  is right (quarl.rewards accuracy against the dataset's answer);
* ``bos``: sequences the teacher samples from the BOS token alone (no data at all);
* ``random``: uniformly random token ids (the data-free lower bound);
* ``tokens``: a generated set saved earlier (below), read back as is.

A sequence is a list of token ids plus ``prompt_len`` (tokens before the
completion; 0 for sft/bos/random), so ``loss.tokens=completion`` can restrict
the loss to what follows the prompt. Texts longer than ``seq_len`` are cut,
never dropped.

Generated sets are expensive (a teacher decode per sequence), so the stage
writes them as a ``dataset`` artifact (``sequences.parquet``: ``input_ids``,
``prompt_len``, ``source``; manifest field ``content: distill-sequences``)
and a later run passes that artifact as its ``data`` input to train on the
identical sequences (``source`` becomes ``tokens``). Generation is seeded, so
the same config and teacher give the same set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from quarl.distill.config import DataConfig

log = logging.getLogger(__name__)
CONTENT = "distill-sequences"
FILE = "sequences.parquet"


@dataclass
class Sequences:
    ids: list[list[int]] = field(default_factory=list)
    prompt_len: list[int] = field(default_factory=list)
    source: str = ""
    stats: dict = field(default_factory=dict)  # generation stats (kept/dropped, accuracy)

    def __len__(self) -> int:
        return len(self.ids)


# --------------------------------------------------------------------------- text sources
def _missing(v) -> bool:
    import pandas as pd

    return v is None or (not isinstance(v, str) and bool(pd.isna(v)))


def texts_from_frame(df, columns: list[str]) -> tuple[list[str], list[str]]:
    """(full texts, prompts) from a dataset split: columns joined, a missing solution -> the answer."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"data.text_columns {missing} are not columns of the dataset (it has {list(df.columns)})")
    texts, prompts = [], []
    for _, row in df.iterrows():
        parts = []
        for c in columns:
            v = row[c]
            if _missing(v) and c == "solution" and "answer" in df.columns:
                v = f"The answer is {row['answer']}."
            if not _missing(v) and str(v):
                parts.append(str(v))
        # a rendered prompt ends where the answer starts (chat template / "Answer:"), so no separator after it
        sep = "" if columns[0] == "prompt" else "\n"
        texts.append(sep.join(parts))
        prompts.append(str(row[columns[0]]) if columns[0] == "prompt" else "")
    return texts, prompts


def sft_sequences(df, tokenizer, columns: list[str], seq_len: int, n: int = 0) -> Sequences:
    texts, prompts = texts_from_frame(df if not n else df.head(n), columns)
    out = Sequences(source="sft")
    for text, prompt in zip(texts, prompts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:seq_len]
        if len(ids) < 2:
            continue
        plen = len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else 0
        out.ids.append(ids)
        out.prompt_len.append(min(plen, len(ids) - 1))
    if not out.ids:
        raise ValueError("the dataset gave no text of 2+ tokens for distillation; check data.text_columns")
    return out


def random_sequences(vocab_size: int, n: int, seq_len: int, seed: int) -> Sequences:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (n, seq_len), generator=g)  # [n, L]
    return Sequences(ids=ids.tolist(), prompt_len=[0] * n, source="random")


# --------------------------------------------------------------------------- generated sources
def _bos_id(tokenizer) -> int:
    for t in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if t is not None:
            return int(t)
    raise ValueError("the tokenizer has neither a BOS nor an EOS token to start BOS-sampled sequences from")


def generate_sequences(teacher, tokenizer, cfg: DataConfig, seed: int, prompts: list[str] | None = None,
                       answers: list[str] | None = None, keep_correct: bool = False) -> Sequences:
    """Teacher samples: completions of ``prompts`` (or of the BOS token alone when None)."""
    from tqdm.auto import tqdm

    from quarl.engine.rollout import HFGenerator, SamplingParams
    from quarl.rl.trainer import stop_token_ids

    device = next(teacher.parameters()).device
    gen = torch.Generator(device).manual_seed(seed + 17)
    if prompts is None:
        n = cfg.num_sequences or 64
        rows = [[_bos_id(tokenizer)]] * n
        max_new = cfg.seq_len - 1
        source = "bos"
    else:
        rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        max_new = cfg.max_new_tokens
        source = "teacher_correct" if keep_correct else "teacher"
    params = SamplingParams(cfg.gen_temperature, 1.0, max_new, stop_token_ids(teacher, tokenizer))
    engine = HFGenerator(teacher, tokenizer.pad_token_id, cache="dynamic")
    out = Sequences(source=source)
    reward = None
    if keep_correct:
        from quarl.rewards import RewardFn

        reward = RewardFn()
    n_correct = 0
    bar = tqdm(total=len(rows), desc=f"generate ({source})", unit="seq", disable=None)
    for i in range(0, len(rows), cfg.gen_batch_size):
        batch = rows[i:i + cfg.gen_batch_size]
        r = engine.generate(batch, params, 1, gen)
        for j, p in enumerate(batch):
            comp = r.completion_ids[j, :int(r.lengths[j])].tolist()
            if reward is not None:
                text = tokenizer.decode(comp, skip_special_tokens=True)
                ok = reward.components([text], [answers[i + j]])["accuracy"][0] >= 1.0
                n_correct += int(ok)
                if not ok:
                    continue
            # too long: drop prompt tokens from the left, never the completion (what the teacher wrote)
            comp = comp[:cfg.seq_len - 1]
            ctx = p[max(0, len(p) - (cfg.seq_len - len(comp))):]
            ids = ctx + comp
            if len(ids) >= 2:
                out.ids.append(ids)
                out.prompt_len.append(0 if prompts is None else len(ctx))
        bar.update(len(batch))
    bar.close()
    out.stats = {"generated": len(rows), "kept": len(out.ids)}
    if keep_correct:
        out.stats["teacher_accuracy"] = n_correct / max(len(rows), 1)
        if not out.ids:
            raise ValueError(f"the teacher answered none of {len(rows)} prompts correctly, so data.source="
                             f"teacher_correct has nothing to train on; use data.source=teacher or more prompts")
    return out


# --------------------------------------------------------------------------- save / load a generated set
def save_sequences(seqs: Sequences, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"input_ids": pa.array(seqs.ids, type=pa.list_(pa.int32())),
                      "prompt_len": pa.array(seqs.prompt_len, type=pa.int32()),
                      "source": pa.array([seqs.source] * len(seqs), type=pa.string())})
    pq.write_table(table, path)


def load_sequences(path: Path) -> Sequences:
    import pyarrow.parquet as pq

    t = pq.read_table(path).to_pydict()
    src = t["source"][0] if t["source"] else "tokens"
    return Sequences(ids=[list(x) for x in t["input_ids"]], prompt_len=list(t["prompt_len"]), source=src)


def is_sequence_artifact(art) -> bool:
    return art.metadata.get("content") == CONTENT


# --------------------------------------------------------------------------- batching
def collate(seqs: Sequences, rows: list[int], pad_id: int, completion_only: bool = False):
    """Rows of ``seqs`` -> right-padded ``ids, attention [b, L]`` and next-token ``labels, loss_mask [b, L]``.

    Position t is trained to predict token t+1; ``loss_mask[b, t] = 1`` where t+1 is a real token
    (and, with ``completion_only``, t+1 >= prompt_len)."""
    L = max(len(seqs.ids[r]) for r in rows)
    b = len(rows)
    ids = torch.full((b, L), pad_id, dtype=torch.long)
    attn = torch.zeros((b, L), dtype=torch.long)
    for i, r in enumerate(rows):
        x = seqs.ids[r]
        ids[i, :len(x)] = torch.tensor(x, dtype=torch.long)
        attn[i, :len(x)] = 1
    labels = torch.full_like(ids, 0)
    labels[:, :-1] = ids[:, 1:]
    loss_mask = torch.zeros((b, L), dtype=torch.bool)
    loss_mask[:, :-1] = attn[:, 1:].bool()
    if completion_only:
        pos = torch.arange(L).unsqueeze(0)  # [1, L]
        plen = torch.tensor([seqs.prompt_len[r] for r in rows]).unsqueeze(1)  # [b, 1]
        loss_mask &= (pos + 1) >= plen
    return ids, attn, labels, loss_mask
