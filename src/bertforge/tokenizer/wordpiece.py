"""BERT's WordPiece tokenizer: train one on your text, or load Google's / Hugging Face's.

A thin layer over the Rust ``tokenizers`` library, configured exactly like BERT: ``BertNormalizer``
(clean text, split CJK characters, optional lowercasing and accent stripping), ``BertPreTokenizer``
(split on whitespace and punctuation), a WordPiece model with ``##`` continuations and
``[CLS] A [SEP] B [SEP]`` templates. A saved directory (``vocab.txt``, ``tokenizer.json``,
``tokenizer_config.json``) loads in ``transformers.BertTokenizerFast.from_pretrained`` with the
same ids, and Google's or Hugging Face's BERT vocabularies load here with the same ids as there.

Trained vocabularies start with ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (ids 0-4); a loaded
``vocab.txt`` keeps the ids its lines give (BERT's: ``[PAD]`` 0, ``[UNK]`` 100, ``[CLS]`` 101, ...).

Any other ``tokenizer.json`` the ``tokenizers`` library reads loads too (a published
ModernBERT's BPE, for instance): its model, normaliser, pre-tokeniser and decoder are kept, its
special tokens are the ones ``tokenizer_config.json`` / ``special_tokens_map.json`` beside it
name (``cls_token`` or else ``bos_token``, ``sep_token`` or else ``eos_token``, ``pad_token``,
``unk_token``, ``mask_token``; BERT's names where they say nothing), and sequences are
``CLS a SEP (b SEP)`` as ModernBERT's. Such a tokenizer saves as ``tokenizer.json`` with a
``tokenizer_config.json`` for ``transformers.PreTrainedTokenizerFast`` (no ``vocab.txt``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
from tokenizers import Tokenizer as _Backend
from tokenizers import processors, trainers

from bertforge.errors import BertforgeError
from bertforge.io import verify_manifest
from bertforge.tokenizer.files import (
    SPECIAL_ROLES,
    SPECIAL_TOKENS,
    TOKENIZER_FILE,
    VOCAB_FILE,
    bert_backend,
    check_text_files,
    iter_text_lines,
    read_special_tokens,
    read_tokenizer_config,
    read_vocab_txt,
    write_fast_tokenizer_files,
    write_tokenizer_files,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

_LINES_PER_BATCH = 1000  # lines handed to the Rust trainer per iterator step


class TrainOptions(TypedDict, total=False):
    """Keyword options of :meth:`Tokenizer.train` (defaults: :meth:`Tokenizer.train_from_iterator`)."""

    min_frequency: int
    """Minimum count of a merged WordPiece."""
    lowercase: bool
    """Lowercase the text (an uncased vocabulary)."""
    strip_accents: bool | None
    """Strip accents; None: exactly when lowercasing, as BERT."""
    limit_alphabet: int
    """At most this many single characters in the vocabulary; rarer ones become [UNK]."""
    show_progress: bool
    """Show the trainer's progress bars."""
    model_max_length: int | None
    """The longest sequence the model will take, recorded in tokenizer_config.json."""


class Tokenizer:
    """A BERT WordPiece tokenizer.

    Build one with :meth:`train`, :meth:`train_from_iterator` or :meth:`from_file`. ``backend`` is
    the raw ``tokenizers.Tokenizer`` (no special tokens, truncation or padding) for fast bulk
    encoding; do not reconfigure it. ``encode``/``encode_batch`` set truncation and padding on an
    internal copy per call, so share one instance between processes, not threads.
    """

    def __init__(
        self,
        backend: _Backend,
        model_max_length: int | None = None,
        source: str = "",
        special: dict[str, str] | None = None,
    ) -> None:
        """``special``: the special tokens by role (``pad``, ``unk``, ``cls``, ``sep``,
        ``mask``) where they are not BERT's ``[PAD]`` ... ``[MASK]``."""
        self.special_tokens = dict(zip(SPECIAL_ROLES, SPECIAL_TOKENS, strict=True)) | (
            special or {}
        )
        """The special tokens by role: ``pad``, ``unk``, ``cls``, ``sep``, ``mask``."""
        named = list(self.special_tokens.values())
        missing = [t for t in named if backend.token_to_id(t) is None]
        if missing:
            raise BertforgeError(
                f"{source or 'tokenizer'}: vocabulary lacks the special token(s) {' '.join(missing)}; "
                f"a vocabulary needs all of {' '.join(named)} (for a tokenizer.json: name its own "
                'in tokenizer_config.json, e.g. "mask_token": "<mask>")'
            )
        backend.no_truncation()
        backend.no_padding()
        backend.post_processor = None
        # Registered as special so that decode can skip them and a literal "[MASK]" in the text
        # maps to its id, as in transformers; ids of tokens already in the vocabulary are kept.
        backend.add_special_tokens(named)
        self._backend = backend
        self.model_max_length = model_max_length
        """Longest sequence the model that uses this tokenizer accepts, when known."""
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            int(backend.token_to_id(t)) for t in named
        )
        self._encoder = _Backend.from_str(backend.to_str())
        cls_token, sep_token = self.special_tokens["cls"], self.special_tokens["sep"]
        self._encoder.post_processor = processors.TemplateProcessing(
            single=f"{cls_token}:0 $A:0 {sep_token}:0",
            pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
            special_tokens=[(cls_token, self.cls_id), (sep_token, self.sep_id)],
        )
        spec = json.loads(backend.to_str())
        norm = spec.get("normalizer") or {}
        self._bert_normalizer = norm if norm.get("type") == "BertNormalizer" else {}
        model = {k: v for k, v in spec["model"].items() if k not in ("vocab", "merges")}
        self.wordpiece = spec["model"].get("type") == "WordPiece"
        """A WordPiece vocabulary (BERT's); else another ``tokenizers`` model (BPE, Unigram),
        saved as tokenizer.json only, whose pieces are never ``##`` continuations."""
        tokens = [backend.id_to_token(i) for i in range(self.vocab_size)]
        named = [self.special_tokens[role] for role in SPECIAL_ROLES]
        parts = [tokens, norm, spec.get("pre_tokenizer"), model]
        if not self.wordpiece:  # BPE's merges decide its ids too
            parts += [spec["model"].get("merges"), named]
        payload = json.dumps(parts, sort_keys=True)
        self._fingerprint = hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]
        self._is_continuation = np.array(
            [self.wordpiece and (t or "").startswith("##") for t in tokens], dtype=bool
        )

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        files: str | Path | Sequence[str | Path],
        vocab_size: int = 30522,
        **options: Unpack[TrainOptions],
    ) -> Tokenizer:
        """Train a WordPiece vocabulary on UTF-8 text files (``.gz`` read transparently); the
        ``options`` (:class:`TrainOptions`) and their defaults are :meth:`train_from_iterator`'s.
        """
        paths = [Path(files)] if isinstance(files, (str, Path)) else [Path(f) for f in files]
        if not paths:
            raise BertforgeError("tokenizer train: no input files given; pass --input FILE...")
        check_text_files(paths, " (for text in memory use Tokenizer.train_from_iterator)")
        return cls.train_from_iterator(
            iter_text_lines(paths),
            vocab_size,
            **options,
            source=", ".join(map(str, paths)),
        )

    @classmethod
    def train_from_iterator(
        cls,
        texts: Iterable[str],
        vocab_size: int = 30522,
        *,
        min_frequency: int = 2,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        limit_alphabet: int = 1000,
        show_progress: bool = False,
        model_max_length: int | None = None,
        source: str = "text iterator",
    ) -> Tokenizer:
        """Train a WordPiece vocabulary on strings (documents, lines or sentences).

        ``strip_accents=None`` strips accents exactly when lowercasing, as BERT does.
        ``limit_alphabet`` caps the single characters kept; rarer characters become ``[UNK]``.
        ``source`` names the text in error messages.
        """
        if vocab_size <= len(SPECIAL_TOKENS):
            raise BertforgeError(
                f"vocab_size={vocab_size} leaves no room beside the {len(SPECIAL_TOKENS)} special "
                "tokens; use e.g. --vocab_size 8000 (BERT uses 30522)"
            )
        if model_max_length is not None and model_max_length < 2:
            raise BertforgeError(
                f"model_max_length={model_max_length} cannot hold [CLS] and [SEP]; use e.g. 512"
            )
        if min_frequency < 1 or limit_alphabet < 1:
            raise BertforgeError(
                f"min_frequency={min_frequency} and limit_alphabet={limit_alphabet} must be >= 1"
            )
        n_chars = 0

        def batches() -> Iterator[list[str]]:
            nonlocal n_chars
            batch: list[str] = []
            for text in texts:
                if not isinstance(text, str):
                    raise BertforgeError(f"{source}: expected str items, got {type(text).__name__}")
                n_chars += len(text.strip())
                batch.append(text)
                if len(batch) == _LINES_PER_BATCH:
                    yield batch
                    batch = []
            if batch:
                yield batch

        backend = bert_backend(None, lowercase, strip_accents)
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            show_progress=show_progress,
            special_tokens=list(SPECIAL_TOKENS),
            limit_alphabet=limit_alphabet,
            continuing_subword_prefix="##",
        )
        backend.train_from_iterator(batches(), trainer)
        if n_chars == 0:
            raise BertforgeError(
                f"{source}: the corpus is empty (no non-whitespace text to train on)"
            )
        if backend.get_vocab_size() > vocab_size:  # the trainer never drops a character
            raise BertforgeError(
                f"{source}: --vocab_size {vocab_size} cannot hold the special tokens and the "
                f"{backend.get_vocab_size() - len(SPECIAL_TOKENS)} characters (with ## forms) of "
                f"the corpus; use at least {backend.get_vocab_size()} or a lower --limit_alphabet"
            )
        return cls(backend, model_max_length, source)

    @classmethod
    def from_file(cls, path: str | Path, *, lowercase: bool | None = None) -> Tokenizer:
        """Load a ``tokenizer.json``, a ``vocab.txt``, or a directory holding either.

        A directory's ``tokenizer.json`` wins over its ``vocab.txt``. A bare ``vocab.txt`` takes
        ``do_lower_case`` / ``strip_accents`` / ``model_max_length`` from a ``tokenizer_config.json``
        beside it; ``lowercase`` overrides that (default: lowercase, as uncased BERT).
        """
        path = Path(path)
        if path.is_dir():
            for name in (TOKENIZER_FILE, VOCAB_FILE):
                if (path / name).is_file():
                    return cls.from_file(path / name, lowercase=lowercase)
            raise BertforgeError(f"{path}: holds neither {TOKENIZER_FILE} nor {VOCAB_FILE}")
        if not path.is_file():
            raise BertforgeError(f"{path}: tokenizer file not found")
        # an altered vocabulary silently changes every id: check it if a manifest lists it
        verify_manifest(path.parent, [path.name, "tokenizer_config.json"])
        config = read_tokenizer_config(path.parent)
        max_len = config.get("model_max_length")
        max_len = int(max_len) if isinstance(max_len, (int, float)) and max_len < 1e9 else None
        if path.suffix == ".json":
            try:
                backend = _Backend.from_file(str(path))
            except Exception as err:  # the Rust parser raises a plain Exception
                raise BertforgeError(f"{path}: not a tokenizers JSON file ({err})") from err
            return cls(backend, max_len, str(path), read_special_tokens(path.parent))
        if lowercase is None:
            lowercase = bool(config.get("do_lower_case", True))
        backend = bert_backend(read_vocab_txt(path), lowercase, config.get("strip_accents"))
        return cls(backend, max_len, str(path))

    # ---- properties ---------------------------------------------------------------------------

    @property
    def backend(self) -> _Backend:
        """The raw ``tokenizers.Tokenizer``: no special tokens, truncation or padding."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def special_ids(self) -> list[int]:
        """Ids of [PAD] [UNK] [CLS] [SEP] [MASK], in that order."""
        return [self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]

    @property
    def lowercase(self) -> bool | None:
        """Whether text is lowercased (None when the normaliser is not BERT's)."""
        return self._bert_normalizer.get("lowercase")

    @property
    def strip_accents(self) -> bool | None:
        """Whether accents are stripped; None means "when lowercasing", as in BERT."""
        return self._bert_normalizer.get("strip_accents")

    @property
    def fingerprint(self) -> str:
        """Hex hash of the vocabulary (in id order) and the normalisation settings.

        Equal fingerprints mean equal token ids for every text; prepared data records it.
        """
        return self._fingerprint

    @property
    def is_continuation(self) -> np.ndarray:
        """Bool array of size ``vocab_size``: True for ``##`` WordPieces (used by whole-word masking)."""
        return self._is_continuation

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, id_: int) -> str | None:
        return self._backend.id_to_token(int(id_))

    def special_tokens_mask(self, ids: Any) -> np.ndarray:
        """Bool array, True where ``ids`` holds a special token (never masked in pretraining)."""
        return np.isin(np.asarray(ids), self.special_ids)

    # ---- encode / decode ----------------------------------------------------------------------

    def _configure(self, max_length: int | None, padding: bool | str, pairs: bool) -> None:
        if max_length is not None:
            if max_length < (3 if pairs else 2):
                raise BertforgeError(
                    f"max_length={max_length} cannot hold [CLS]/[SEP]; use at least {3 if pairs else 2}"
                )
            self._encoder.enable_truncation(max_length, strategy="longest_first")
        else:
            self._encoder.no_truncation()
        if padding == "max_length":
            if max_length is None:
                raise BertforgeError('padding="max_length" needs max_length')
            pad = self.special_tokens["pad"]
            self._encoder.enable_padding(pad_id=self.pad_id, pad_token=pad, length=max_length)
        elif padding is True or padding == "longest":
            self._encoder.enable_padding(pad_id=self.pad_id, pad_token=self.special_tokens["pad"])
        elif padding is False:
            self._encoder.no_padding()
        else:
            raise BertforgeError(f"padding={padding!r}: use True, False or 'max_length'")

    def encode(
        self, text: str, pair: str | None = None, *, max_length: int | None = None
    ) -> dict[str, list[int]]:
        """``[CLS] text [SEP] (pair [SEP])`` as ``input_ids``, ``token_type_ids``, ``attention_mask``.

        ``max_length`` truncates longest-first (the longer of text and pair loses tokens first).
        """
        self._configure(max_length, False, pair is not None)
        try:
            enc = self._encoder.encode(text, pair)
        except TypeError:  # not str, or a str the Rust side refuses (an unpaired surrogate)
            enc = self._encoder.encode(*valid_unicode([text] if pair is None else [text, pair]))
        return {
            "input_ids": enc.ids,
            "token_type_ids": enc.type_ids,
            "attention_mask": enc.attention_mask,
        }

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        max_length: int | None = None,
        padding: bool | str = True,
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        """Encode many texts (or text pairs) at once, in parallel in Rust.

        ``padding=True`` pads to the longest sequence of the batch, ``"max_length"`` to
        ``max_length``. ``return_tensors="pt"`` gives ``(B, T)`` torch int64 tensors, else lists.
        """
        if isinstance(texts, str):
            raise BertforgeError("encode_batch takes a list of texts; use encode for a single text")
        if pairs is not None and len(pairs) != len(texts):
            raise BertforgeError(f"encode_batch: {len(texts)} texts but {len(pairs)} pairs")
        if return_tensors not in (None, "pt"):
            raise BertforgeError(f"return_tensors={return_tensors!r}: use None or 'pt'")
        self._configure(max_length, padding, pairs is not None)
        try:
            encodings = self._encoder.encode_batch(_batch_inputs(texts, pairs))
        except TypeError:  # an unpaired surrogate somewhere: replace it, as decoding would
            texts = valid_unicode(texts)
            pairs = None if pairs is None else valid_unicode(pairs)
            encodings = self._encoder.encode_batch(_batch_inputs(texts, pairs))
        out: dict[str, Any] = {
            "input_ids": [e.ids for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        if return_tensors == "pt":
            if len({len(ids) for ids in out["input_ids"]}) > 1:
                raise BertforgeError('return_tensors="pt" needs equal lengths; use padding=True')
            import torch  # lazily: the tokenizer alone does not need torch

            width = len(out["input_ids"][0]) if encodings else 0
            out = {k: torch.tensor(v, dtype=torch.long).view(len(v), width) for k, v in out.items()}
        return out

    def decode(self, ids: Any, *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``: WordPieces joined, ``##`` merged, BERT's punctuation spacing."""
        return self._backend.decode(
            np.asarray(ids, dtype=np.int64).reshape(-1).tolist(),
            skip_special_tokens=skip_special_tokens,
        )

    def decode_batch(self, batch: Any, *, skip_special_tokens: bool = True) -> list[str]:
        """:meth:`decode` for each row of ``batch`` (a list of id lists or a 2-D array/tensor)."""
        rows = [np.asarray(ids, dtype=np.int64).reshape(-1).tolist() for ids in batch]
        return self._backend.decode_batch(rows, skip_special_tokens=skip_special_tokens)

    # ---- save ---------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``vocab.txt``, ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``.

        The directory loads here (``Tokenizer.from_file``) and in
        ``transformers.BertTokenizerFast.from_pretrained`` with identical ids. Each file is written
        atomically; returns the paths written.
        """
        self._configure(None, False, False)
        if not self.wordpiece:
            return write_fast_tokenizer_files(
                directory,
                self._encoder.to_str(pretty=True),
                self.special_tokens,
                model_max_length=self.model_max_length,
            )
        return write_tokenizer_files(
            directory,
            [self._backend.id_to_token(i) for i in range(self.vocab_size)],
            self._encoder.to_str(pretty=True),
            lowercase=self.lowercase,
            strip_accents=self.strip_accents,
            model_max_length=self.model_max_length,
        )

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
            f"fingerprint={self.fingerprint})"
        )


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_unicode(texts: Sequence[Any]) -> list[str]:
    """``texts`` with each unpaired UTF-16 surrogate (which Python strings may hold, e.g. from a
    JSON ``"\\ud800"`` escape, but which is no character and which the ``tokenizers`` library
    refuses) replaced by U+FFFD, as decoding bad bytes with ``errors="replace"`` does. Anything
    that is not a string is an error naming its type."""
    out = []
    for text in texts:
        if not isinstance(text, str):
            raise BertforgeError(f"texts must be strings, got {type(text).__name__}: {text!r:.60}")
        out.append(_SURROGATE.sub("\ufffd", text))
    return out


def _batch_inputs(texts: Sequence[str], pairs: Sequence[str] | None) -> list[Any]:
    return list(texts) if pairs is None else list(zip(texts, pairs, strict=True))


__all__ = ["SPECIAL_TOKENS", "Tokenizer", "TrainOptions", "valid_unicode"]
