"""Shared fixtures for the data tests."""

from __future__ import annotations

import pytest

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _toy_tokenizer(chat_template: str | None = CHATML):
    """A whitespace word-level tokenizer with a ChatML template: fast and offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    if chat_template:
        fast.chat_template = chat_template
    return fast


@pytest.fixture
def toy_tokenizer():
    """``toy_tokenizer(chat_template=CHATML)`` -> a tiny PreTrainedTokenizerFast."""
    return _toy_tokenizer
