"""Prompt templates: turn a raw problem into what the policy model reads.

Every dataset row keeps three views of the prompt (see :mod:`quarl.data.schema`):

* ``problem``  — the raw problem text, untouched (for dedup, eval, display);
* ``messages`` — the chat form, a JSON list of ``{"role", "content"}``, for a
  trainer that renders with its own tokenizer;
* ``prompt``   — the exact text fed to the model: tokenize it with
  ``add_special_tokens=False`` (a chat-rendered prompt already carries BOS and
  role markers) and generate.

Templates:

``qerl`` (default)
    QeRL's instruction. QeRL (NVlabs/QeRL, ``eval/gsm8k.py``; the same text in
    its training data loaders) sends it as the *system* message, with the
    problem as the user message — that is ``messages`` here. It adapts the
    DeepSeek-R1 template: reasoning in ``<think> </think>``, final answer in
    ``<answer> </answer>``. We keep its sentence verbatim and drop the indented
    ``<think> ... </think>`` skeleton QeRL appends in a triple-quoted string
    (whitespace artefacts of the source, not part of the instruction's meaning).
    Without a tokenizer, ``prompt`` is the problem followed by the instruction
    as a plain-text suffix — usable by any model, base or instruct. With
    ``tokenizer`` set, ``prompt`` is the model's chat template applied to
    ``messages`` (QeRL's exact setup).
``chat``
    Same messages, always rendered with the tokenizer's chat template
    (``add_generation_prompt=True``); a tokenizer is required.
``plain``
    ``prompt = problem``; no instruction (external harnesses, base-model probes).

``instruction`` overrides the instruction text for ``qerl``/``chat`` (an
empty string sends the problem alone).
"""

from __future__ import annotations

import functools
import json
from typing import Any

__all__ = ["QERL_INSTRUCTION", "TEMPLATES", "PromptTemplate", "TemplateError", "load_tokenizer"]

QERL_INSTRUCTION = (
    "Solve the following math problem step by step. The reasoning process and direct answer are enclosed "
    "within <think> </think> and <answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think> <answer> answer here </answer>."
)

TEMPLATES = ("qerl", "chat", "plain")


class TemplateError(ValueError):
    pass


@functools.lru_cache(maxsize=4)
def load_tokenizer(ref: str):
    """A tokenizer for ``ref``: ``default``, ``tiny-*``, a local model dir, an
    ``s3://`` model, or a Hugging Face id (resolved by :mod:`quarl.models`)."""
    from quarl.models import TINY_MODELS, ModelError, resolve_model_dir, tiny_model

    if ref.lower() in TINY_MODELS:
        return tiny_model(ref.lower())[1]
    from transformers import AutoTokenizer

    try:
        path = resolve_model_dir(ref)
    except ModelError as e:
        raise TemplateError(
            f"cannot load tokenizer {ref!r}: {e}. Pass tokenizer=<local model dir | s3:// | HF id | default>"
        ) from e
    return AutoTokenizer.from_pretrained(str(path))


class PromptTemplate:
    """``PromptTemplate(name, tokenizer=None, instruction=None).render(problem)
    -> (prompt_text, messages_json)``."""

    def __init__(self, name: str = "qerl", tokenizer: Any = None, instruction: str | None = None) -> None:
        if name not in TEMPLATES:
            raise TemplateError(f"unknown template {name!r}; choose one of {', '.join(TEMPLATES)}")
        if isinstance(tokenizer, str):
            tokenizer = load_tokenizer(tokenizer)
        if name == "chat" and tokenizer is None:
            raise TemplateError("template 'chat' renders with the model's chat template: set tokenizer=<model ref>")
        if tokenizer is not None and name != "plain" and not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template; "
                "use template=qerl without a tokenizer (plain-text suffix) or a chat/instruct model's tokenizer"
            )
        self.name = name
        self.tokenizer = tokenizer
        self.instruction = QERL_INSTRUCTION if instruction is None else instruction

    def messages(self, problem: str) -> list[dict[str, str]]:
        if self.name == "plain" or not self.instruction:
            return [{"role": "user", "content": problem}]
        return [{"role": "system", "content": self.instruction}, {"role": "user", "content": problem}]

    def render(self, problem: str) -> tuple[str, str]:
        msgs = self.messages(problem)
        if self.name == "plain":
            text = problem
        elif self.tokenizer is not None:
            text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        else:  # qerl without a tokenizer: instruction as a plain-text suffix
            text = f"{problem}\n\n{self.instruction}" if self.instruction else problem
        return text, json.dumps(msgs, ensure_ascii=False)

    def count_tokens(self, texts: list[str]) -> list[int]:
        if self.tokenizer is None:
            raise TemplateError("token-length limits need a tokenizer: set tokenizer=<model ref>")
        enc = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [len(x) for x in enc]
