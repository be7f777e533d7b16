"""The files of a BERT tokenizer and the pieces ``Tokenizer`` is built from: the special tokens,
the ``tokenizers`` pipeline configured as BERT's, reading ``vocab.txt`` / ``tokenizer_config.json``
and training text, and writing the three files a saved tokenizer consists of (``vocab.txt``,
``tokenizer.json``, ``tokenizer_config.json``: what ``transformers.BertTokenizerFast`` loads).
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers import decoders, normalizers, pre_tokenizers
from tokenizers.models import WordPiece

from bertforge.errors import BertforgeError
from bertforge.io import atomic_write_text, make_directory, read_json_object, text_lines

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
"""BERT's special tokens, in the order (and so with the ids 0-4) of a trained vocabulary."""
SPECIAL_ROLES = ("pad", "unk", "cls", "sep", "mask")
"""The roles of :data:`SPECIAL_TOKENS`, in the same order (``tokenizer_config.json``'s keys
without ``_token``)."""
SPECIAL_MAP_FILE = "special_tokens_map.json"
FALLBACK_ROLES = {"cls": "bos", "sep": "eos"}
"""A tokenizer without a ``cls_token`` starts sequences with its ``bos_token`` (likewise sep/eos)."""

VOCAB_FILE, TOKENIZER_FILE, CONFIG_FILE = "vocab.txt", "tokenizer.json", "tokenizer_config.json"


def bert_backend(
    vocab: dict[str, int] | None, lowercase: bool, strip_accents: bool | None
) -> Backend:
    """A ``tokenizers.Tokenizer`` set up as BERT's, without post-processing."""
    backend = Backend(
        WordPiece(vocab, unk_token=UNK) if vocab is not None else WordPiece(unk_token=UNK)
    )
    # strip_accents=None follows lowercase, as in Google's BERT and transformers.
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    return backend


def read_vocab_txt(path: Path) -> dict[str, int]:
    """One token per line, id = line number (as Google's BERT and transformers read it)."""
    vocab: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()  # splits at newlines only, exactly as transformers reads it
    except UnicodeDecodeError as err:
        raise BertforgeError(f"{path}: not a UTF-8 vocabulary ({err.reason})") from err
    for index, line in enumerate(lines):
        token = line.rstrip("\n")
        if token in vocab:
            raise BertforgeError(
                f"{path}: token {token!r} appears on lines {vocab[token] + 1} and {index + 1}; "
                "a vocabulary needs unique lines"
            )
        vocab[token] = index
    return vocab


def read_tokenizer_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_FILE
    if not path.is_file():
        return {}
    return read_json_object(path, "fix or delete the file")


def check_text_files(files: Sequence[Path], fix: str) -> None:
    """Refuse training input that is not a file: a folder is named as one (with the glob that
    gives its files), anything else as not found; ``fix`` ends the not-found message."""
    folders = [str(p) for p in files if p.is_dir()]
    if folders:
        raise BertforgeError(
            f"{', '.join(folders)}: a folder, not a text file; give the files in it "
            f"(e.g. --input {folders[0].rstrip('/')}/*.txt)"
        )
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise BertforgeError(f"input file(s) not found: {', '.join(missing)}{fix}")


def read_special_tokens(directory: Path) -> dict[str, str]:
    """The special tokens a ``tokenizer.json``'s directory names, by role: from
    ``special_tokens_map.json`` and ``tokenizer_config.json`` (the latter wins), each a string
    or transformers' ``{"content": ...}``; ``cls`` falls back to ``bos_token``, ``sep`` to
    ``eos_token``; a role neither names is left out (BERT's token then)."""
    named: dict[str, Any] = {}
    for path in (directory / SPECIAL_MAP_FILE, directory / CONFIG_FILE):
        if path.is_file():
            named |= read_json_object(path, "fix or delete the file")
    out: dict[str, str] = {}
    for role in SPECIAL_ROLES:
        value = named.get(f"{role}_token")
        if value is None and role in FALLBACK_ROLES:
            value = named.get(f"{FALLBACK_ROLES[role]}_token")
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None and not isinstance(value, str):
            raise BertforgeError(
                f"{directory}: {role}_token={value!r} is not a token; give its text"
            )
        if value:
            out[role] = value
    return out


def iter_text_lines(files: Sequence[Path], encoding_errors: str = "strict") -> Iterator[str]:
    """The lines of UTF-8 text files (``.gz``/``.bz2``/``.xz`` read transparently), one file
    after the other (:func:`bertforge.io.text_lines`)."""
    for path in files:
        yield from text_lines(path, encoding_errors)


def sample_texts(texts: Iterable[str], max_chars: int, seed: int = 0) -> tuple[list[str], int, int]:
    """A uniform random sample of ``texts`` (lines, sentences) holding at most ``max_chars``
    characters, in the order they came: ``(sample, characters read, characters kept)``; blank texts are
    neither read nor kept.

    Each text draws a random key; the texts with the smallest keys are kept while they fit, so
    every text is equally likely to be in the sample whatever its file or position (a prefix of
    a large corpus would train the vocabulary on its first files only). Memory is bounded by
    ``max_chars``; everything is read once. When the whole input fits, it is returned whole.
    """
    if max_chars < 1:
        raise BertforgeError(f"max_chars={max_chars}: must be >= 1 (a size such as 100M)")
    rng = random.Random(seed)
    heap: list[tuple[float, int, str]] = []  # (-key, position, text): the largest key on top
    kept = total = 0
    for position, text in enumerate(texts):
        if not text.strip():
            continue
        size = len(text)
        total += size
        key = rng.random()
        if kept + size <= max_chars:
            heapq.heappush(heap, (-key, position, text))
            kept += size
            continue
        # full: the new text replaces the largest keys above its own while that makes room
        while heap and -heap[0][0] > key and kept + size > max_chars:
            kept -= len(heapq.heappop(heap)[2])
        if kept + size <= max_chars:
            heapq.heappush(heap, (-key, position, text))
            kept += size
    heap.sort(key=lambda item: item[1])
    return [text for _, _, text in heap], total, kept


def write_tokenizer_files(
    directory: str | Path,
    tokens: Sequence[str],
    tokenizer_json: str,
    *,
    lowercase: bool | None,
    strip_accents: bool | None,
    model_max_length: int | None,
) -> list[Path]:
    """Write ``vocab.txt`` (``tokens`` in id order), ``tokenizer.json`` and
    ``tokenizer_config.json`` into ``directory``, each atomically; returns the paths."""
    directory = make_directory(directory)
    config: dict[str, Any] = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase if lowercase is not None else True,
        "strip_accents": strip_accents,
        "tokenize_chinese_chars": True,
        "unk_token": UNK,
        "sep_token": SEP,
        "pad_token": PAD,
        "cls_token": CLS,
        "mask_token": MASK,
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    written = {
        VOCAB_FILE: "".join(f"{t}\n" for t in tokens),
        TOKENIZER_FILE: tokenizer_json,
        CONFIG_FILE: json.dumps(config, indent=2) + "\n",
    }
    for name, text in written.items():
        atomic_write_text(directory / name, text)
    return [directory / name for name in written]


def write_fast_tokenizer_files(
    directory: str | Path,
    tokenizer_json: str,
    special: dict[str, str],
    *,
    model_max_length: int | None,
) -> list[Path]:
    """Write a non-WordPiece tokenizer: ``tokenizer.json`` and a ``tokenizer_config.json`` that
    ``transformers.PreTrainedTokenizerFast`` reads (its special tokens by role), atomically."""
    directory = make_directory(directory)
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    config |= {f"{role}_token": token for role, token in special.items()}
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    written = {TOKENIZER_FILE: tokenizer_json, CONFIG_FILE: json.dumps(config, indent=2) + "\n"}
    for name, text in written.items():
        atomic_write_text(directory / name, text)
    return [directory / name for name in written]


__all__ = [
    "check_text_files",
    "SPECIAL_ROLES",
    "SPECIAL_TOKENS",
    "read_special_tokens",
    "write_fast_tokenizer_files",
    "bert_backend",
    "iter_text_lines",
    "read_tokenizer_config",
    "read_vocab_txt",
    "write_tokenizer_files",
]
