"""A byte-level BPE tokenizer trained here with the ``tokenizers`` library, RoBERTa-style special
tokens (``<s> </s> <pad> <unk> <mask>``) named in a ``tokenizer_config.json`` beside its
``tokenizer.json``: the kind of tokenizer a published ModernBERT ships, not WordPiece."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL = {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>", "mask": "<mask>"}


def train_bpe(lines: Iterable[str], directory: Path, vocab_size: int = 400) -> Path:
    """``directory`` with ``tokenizer.json`` (its post-processor ``<s> a </s> b </s>``), a
    ``tokenizer_config.json`` naming the special tokens but the mask and a
    ``special_tokens_map.json`` naming the mask as ``{"content": ...}``."""
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(lines), trainer)
    bos, eos = SPECIAL["bos"], SPECIAL["eos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} $B:1 {eos}:1",
        special_tokens=[(bos, tok.token_to_id(bos)), (eos, tok.token_to_id(eos))],
    )
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    config |= {f"{role}_token": token for role, token in SPECIAL.items() if role != "mask"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    # the mask token in the other file and the other form transformers has written
    mask = {"content": SPECIAL["mask"], "lstrip": True, "normalized": False, "special": True}
    (directory / "special_tokens_map.json").write_text(json.dumps({"mask_token": mask}))
    return directory
