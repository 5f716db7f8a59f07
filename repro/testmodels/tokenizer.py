"""The planted targets' tokenizer: one made-up word per token id, byte fallback for any other text.

Written with the ``tokenizers`` library as ``tokenizer.json`` + ``tokenizer_config.json`` (with a
ChatML chat template) beside a target's ``config.json``, so a server can run with the model's own
tokenizer: text in, text out, ``/v1/completions`` and ``/v1/chat/completions``. Deterministic: the
files depend on the vocabulary size and the config's BOS / EOS ids only.

The ids of a vocabulary of V tokens:

- the config's ``bos_token_id`` / ``eos_token_id`` are ``<s>`` / ``</s>``; ``<unk>``,
  ``<|im_start|>`` and ``<|im_end|>`` take the lowest ids left (special: skipped in output text);
- the highest 256 ids left are the bytes ``<0x00>`` .. ``<0xFF>`` (SentencePiece's byte fallback:
  text no word covers is spelled in UTF-8 bytes);
- every other id is a word: ``▁`` (one space) first, then ``▁`` + syllables (``▁baba``, ``▁babe``,
  ...), all of one length, so a word decodes to a space and its letters.

A Unigram model over that vocabulary with a Metaspace pre-tokenizer (spaces become ``▁``, nothing
prepended) encodes every text, and for any sequence of word ids ``encode(decode(ids)) == ids``: the
planted targets' greedy outputs (ids below their hidden size) are words and special tokens, so
their text determines their ids.
"""

from __future__ import annotations

import json
from itertools import islice, product
from pathlib import Path

UNK, BOS, EOS, IM_START, IM_END = "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"
SPACE = "\u2581"  # SentencePiece's ▁: a space inside a token
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
N_BYTES = 256
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] -%}"
    "{%- for part in message['content'] if part['type'] == 'text' -%}{{- part['text'] -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _words(count: int) -> list[str]:
    """``count`` distinct words: ``▁`` alone, then ``▁`` + syllables, in a fixed order."""
    syllables = [c + v for c, v in product(CONSONANTS, VOWELS)]
    length = 1
    while len(syllables) ** length < count - 1:
        length += 1
    words = (SPACE + "".join(s) for s in product(syllables, repeat=length))
    return [SPACE, *islice(words, count - 1)]


def vocabulary(vocab_size: int, bos: int, eos: int) -> tuple[list[str], dict[str, int]]:
    """Every id's token string (index = id), and the special tokens' ids."""
    if not 0 <= bos < vocab_size or not 0 <= eos < vocab_size or bos == eos:
        msg = f"bos {bos} and eos {eos} must be two distinct ids below the vocabulary size {vocab_size}"
        raise ValueError(msg)
    special = {BOS: bos, EOS: eos}
    free = (i for i in range(vocab_size) if i not in special.values())
    special |= {name: next(free) for name in (UNK, IM_START, IM_END)}
    rest = [i for i in range(vocab_size) if i not in special.values()]
    if len(rest) < N_BYTES + 1:
        msg = f"a vocabulary of {vocab_size} tokens has no room for 256 bytes and a word"
        raise ValueError(msg)
    byte_ids, word_ids = rest[-N_BYTES:], rest[:-N_BYTES]
    tokens = [""] * vocab_size
    for name, i in special.items():
        tokens[i] = name
    for b, i in enumerate(byte_ids):
        tokens[i] = f"<0x{b:02X}>"
    for word, i in zip(_words(len(word_ids)), word_ids, strict=True):
        tokens[i] = word
    return tokens, special


def build(vocab_size: int, bos: int, eos: int):  # noqa: ANN201 - tokenizers.Tokenizer, imported here
    """The ``tokenizers.Tokenizer`` of a vocabulary (see the module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, special = vocabulary(vocab_size, bos, eos)
    scores = [(t, 0.0 if t in special else -1.0) for t in tokens]
    tok = Tokenizer(models.Unigram(scores, unk_id=special[UNK], byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never", split=True)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in sorted(special, key=special.get)])
    return tok


def write_tokenizer(model_dir: Path) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` for the target whose config.json is in ``model_dir``."""
    cfg = json.loads((model_dir / "config.json").read_text())
    build(cfg["vocab_size"], cfg["bos_token_id"], cfg["eos_token_id"]).save(str(model_dir / "tokenizer.json"), pretty=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "unk_token": UNK,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.get("max_position_embeddings", 4096),
        "chat_template": CHAT_TEMPLATE,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
