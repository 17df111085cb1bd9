import warnings

import torch

from quarl.config import load_config
from quarl.distill.config import DistillConfig
from quarl.distill.data import Sequences
from tests.threads import one_thread_fixture

SMALL_VOCAB = 2048  # as tests/rl: the 49152-wide head would be ~30x the cost of the tiny model's body

TINY = ["train.steps=3", "train.device=cpu", "train.checkpoint_every=0", "optim.batch_size=4",
        "optim.micro_batch_size=2", "optim.lr=1e-3", "loss.chunk=8", "eval.every=0", "eval.accuracy_samples=0",
        "student.format=nvfp4"]


def tiny_cfg(*extra: str) -> DistillConfig:
    return load_config(DistillConfig, None, [*TINY, *extra])


def small_tiny_model(kind: str = "llama", vocab: int = SMALL_VOCAB):
    from quarl.models import tiny_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_model(kind, vocab_size=vocab)


def token_sequences(n: int = 8, length: int = 12, seed: int = 0, vocab: int = SMALL_VOCAB) -> Sequences:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(length // 2, length + 1, (n,), generator=g).tolist()
    ids = [torch.randint(3, vocab, (k,), generator=g).tolist() for k in lens]
    return Sequences(ids=ids, prompt_len=[2] * n, source="test")


_one_thread = one_thread_fixture()
