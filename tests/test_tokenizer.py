"""The WordPiece tokenizer: same ids as transformers' BertTokenizerFast, round trips, CLI, errors."""

from __future__ import annotations

import bz2
import gzip
import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TaskFiles, noise
from support.cli import one_line_error
from transformers import BertTokenizerFast

from bertforge import cli
from bertforge.cli import main as cli_main
from bertforge.errors import BertforgeError
from bertforge.tokenizer.files import SPECIAL_TOKENS, sample_texts
from bertforge.tokenizer.wordpiece import Tokenizer

MAX_LENGTH = 64


@pytest.fixture(scope="module")
def wiki_lines(shared_data: Path) -> list[str]:
    """1,000 real, non-empty lines of WikiText-2 validation text."""
    path = shared_data / "wikitext2" / "wiki.valid.tokens"
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line]
    assert len(lines) >= 1000
    return lines[:1000]


@pytest.fixture(scope="module")
def shakespeare_lines(shakespeare_file: Path) -> list[str]:
    return [
        line for line in shakespeare_file.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


@pytest.fixture(scope="module")
def shakespeare_tok(shakespeare_file: Path) -> Tokenizer:
    return Tokenizer.train(shakespeare_file, vocab_size=2000)


def assert_same_as_hf(
    ours: Tokenizer, hf: BertTokenizerFast, lines: list[str], max_length: int = MAX_LENGTH
) -> None:
    """Single texts and pairs of consecutive lines, truncated longest-first, padded and not."""
    mine = ours.encode_batch(lines, max_length=max_length, padding=False)
    theirs = hf(lines, max_length=max_length, truncation=True)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert mine[key] == theirs[key], key
    assert max(len(ids) for ids in mine["input_ids"]) == max_length  # truncation did happen

    mine = ours.encode_batch(lines[:-1], lines[1:], max_length=max_length, return_tensors="pt")
    theirs = hf(
        lines[:-1],
        lines[1:],
        max_length=max_length,
        truncation=True,
        padding=True,
        return_tensors="pt",
    )
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert mine[key].dtype == torch.long
        assert torch.equal(mine[key], theirs[key]), key
    one = ours.encode(lines[3], lines[4], max_length=max_length)
    assert one == {
        k: v for k, v in hf(lines[3], lines[4], max_length=max_length, truncation=True).items()
    }


def test_minilm_vocab_txt_alone_matches_transformers(minilm_dir, wiki_lines, tmp_path):
    shutil.copy(minilm_dir / "vocab.txt", tmp_path / "vocab.txt")
    ours = Tokenizer.from_file(tmp_path / "vocab.txt")
    hf = BertTokenizerFast.from_pretrained(str(tmp_path))
    assert ours.vocab_size == len(hf) == 30522
    # BERT's ids come from the file, not our 0-4 layout
    assert ours.special_ids == [0, 100, 101, 102, 103]
    assert ours.special_ids == [hf.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert_same_as_hf(ours, hf, wiki_lines)
    assert Tokenizer.from_file(tmp_path).fingerprint == ours.fingerprint


@pytest.mark.parametrize("source", ["tokenizer.json", "."])
def test_minilm_tokenizer_json_and_directory_match_transformers(minilm_dir, wiki_lines, source):
    ours = Tokenizer.from_file(minilm_dir / source)
    hf = BertTokenizerFast.from_pretrained(str(minilm_dir))
    assert ours.model_max_length == 512  # read from tokenizer_config.json
    # the file's own truncation (128) and padding must not leak into our encodings
    assert len(ours.encode(" ".join(wiki_lines[:20]))["input_ids"]) > 128
    assert_same_as_hf(ours, hf, wiki_lines)


def test_fingerprint_is_the_same_for_every_form_of_a_vocabulary(minilm_dir, tmp_path):
    shutil.copy(minilm_dir / "vocab.txt", tmp_path / "vocab.txt")
    from_txt = Tokenizer.from_file(tmp_path / "vocab.txt")
    assert from_txt.fingerprint == Tokenizer.from_file(minilm_dir / "tokenizer.json").fingerprint
    cased = Tokenizer.from_file(tmp_path / "vocab.txt", lowercase=False)
    assert cased.lowercase is False and cased.fingerprint != from_txt.fingerprint
    assert cased.encode("Hello")["input_ids"] != from_txt.encode("Hello")["input_ids"]


def test_vocab_txt_reads_do_lower_case_from_tokenizer_config(minilm_dir, tmp_path):
    shutil.copy(minilm_dir / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    tok = Tokenizer.from_file(tmp_path)
    hf = BertTokenizerFast.from_pretrained(str(tmp_path))
    text = "Hello World, Café Über"
    assert tok.lowercase is False
    assert tok.encode(text)["input_ids"] == hf(text)["input_ids"]
    lowercased = Tokenizer.from_file(tmp_path, lowercase=True)
    assert lowercased.encode(text)["input_ids"] != tok.encode(text)["input_ids"]


def normalised(tok: Tokenizer, text: str) -> str:
    """What a lossless round trip gives: the backend's normaliser (lowercase, accents, control
    characters, CJK spacing), its pre-tokenizer's words (split at whitespace and punctuation),
    joined by the WordPiece decoder's punctuation spacing ("a , b ." -> "a, b.")."""
    backend = tok.backend
    words = backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(text))
    return backend.decoder.decode([word for word, _ in words])


def test_trained_on_shakespeare_round_trips(shakespeare_tok, shakespeare_lines):
    tok = shakespeare_tok
    assert tok.vocab_size == 2000
    assert [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id] == [0, 1, 2, 3, 4]
    assert [tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    enc = tok.encode_batch(shakespeare_lines, padding=False)
    assert not any(tok.unk_id in ids for ids in enc["input_ids"])
    decoded = tok.decode_batch(enc["input_ids"])
    expected = [normalised(tok, line) for line in shakespeare_lines]
    assert decoded == expected
    assert decoded[1] == "before we proceed any further, hear me speak."
    # words split into several WordPieces survive too, and "##" pieces are flagged
    pieces = [tok.id_to_token(i) for i in tok.encode("Unpitied sacrilegious")["input_ids"]]
    assert any(p.startswith("##") for p in pieces)
    assert tok.decode(tok.encode("Unpitied sacrilegious")["input_ids"]) == "unpitied sacrilegious"
    expected_flags = [tok.id_to_token(i).startswith("##") for i in range(tok.vocab_size)]
    assert tok.is_continuation.tolist() == expected_flags and tok.is_continuation.sum() > 100


def test_saved_directory_loads_identically_here_and_in_transformers(
    shakespeare_tok, shakespeare_lines, tmp_path
):
    written = shakespeare_tok.save(tmp_path / "tok")
    assert sorted(p.name for p in written) == [
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is True and config["tokenizer_class"] == "BertTokenizer"
    lines = shakespeare_lines[:1500]
    expected = shakespeare_tok.encode_batch(lines[:-1], lines[1:], max_length=32)
    for source in ("tok", "tok/vocab.txt", "tok/tokenizer.json"):
        loaded = Tokenizer.from_file(tmp_path / source)
        assert loaded.fingerprint == shakespeare_tok.fingerprint, source
        assert loaded.encode_batch(lines[:-1], lines[1:], max_length=32) == expected, source
    hf = BertTokenizerFast.from_pretrained(str(tmp_path / "tok"))
    assert_same_as_hf(shakespeare_tok, hf, lines, max_length=16)
    # vocab.txt + tokenizer_config.json alone, as Google's checkpoints ship
    (tmp_path / "plain").mkdir()
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(tmp_path / "tok" / name, tmp_path / "plain" / name)
    assert_same_as_hf(
        shakespeare_tok,
        BertTokenizerFast.from_pretrained(str(tmp_path / "plain")),
        lines,
        max_length=16,
    )


def test_cased_vocabulary_keeps_case_in_transformers(shakespeare_lines, tmp_path):
    tok = Tokenizer.train_from_iterator(shakespeare_lines[:4000], vocab_size=800, lowercase=False)
    assert tok.lowercase is False
    tok.save(tmp_path)
    hf = BertTokenizerFast.from_pretrained(str(tmp_path))
    assert_same_as_hf(tok, hf, shakespeare_lines[:400], max_length=16)
    assert tok.decode(tok.encode("First Citizen:")["input_ids"]) == "First Citizen :"


def test_encode_batch_pads_to_longest_and_truncates_longest_first(shakespeare_tok):
    tok = shakespeare_tok
    texts = ["To be, or not to be", "ay"]
    batch = tok.encode_batch(texts, max_length=64, return_tensors="pt")
    lengths = [len(tok.encode(t)["input_ids"]) for t in texts]
    assert batch["input_ids"].shape == (2, max(lengths))  # the longest, not max_length
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert batch["input_ids"][1, lengths[1] :].eq(tok.pad_id).all()
    fixed = tok.encode_batch(texts, max_length=16, padding="max_length", return_tensors="pt")
    assert fixed["input_ids"].shape == (2, 16)

    long, short = "word " * 50, "to be or not"
    enc = tok.encode(long, short, max_length=12)
    types = enc["token_type_ids"]
    # [CLS] a.. [SEP] b.. [SEP]: only the longer first text lost tokens (50 -> 5), b kept its 4
    assert len(enc["input_ids"]) == 12 and types.count(0) == 7 and types.count(1) == 5
    assert enc["input_ids"][0] == tok.cls_id and enc["input_ids"][-1] == tok.sep_id
    mask = tok.special_tokens_mask(enc["input_ids"])
    assert mask.tolist() == [i in (0, 6, 11) for i in range(12)]
    assert tok.encode("the [MASK] of it")["input_ids"].count(tok.mask_id) == 1
    assert np.array_equal(tok.encode_batch([], return_tensors="pt")["input_ids"].shape, (0, 0))


def test_cli_trains_saves_and_summarises(shakespeare_file, tmp_path, capsys):
    corpus = tmp_path / "shakespeare.txt.gz"  # .gz is read transparently
    corpus.write_bytes(gzip.compress(shakespeare_file.read_bytes()))
    out = tmp_path / "tok"
    code = cli_main(
        [
            "tokenizer",
            "train",
            "--input",
            str(corpus),
            "--vocab_size",
            "1000",
            "--output",
            str(out),
            "--min_frequency",
            "3",
        ]
    )
    assert code == 0
    summary = capsys.readouterr().out.strip()
    assert "\n" not in summary
    assert "1000 tokens" in summary and "1 file" in summary and str(out) in summary
    tok = Tokenizer.from_file(out)
    assert tok.vocab_size == 1000 and tok.special_ids == [0, 1, 2, 3, 4]
    assert tok.token_to_id("king") is not None and tok.token_to_id("citizen") is not None
    text = "First Citizen: Before we proceed any further, hear me speak."
    assert tok.decode(tok.encode(text)["input_ids"]) == normalised(tok, text)

    code = cli_main(
        [
            "tokenizer",
            "train",
            "--input",
            str(tmp_path / "nope.txt"),
            "--vocab_size",
            "100",
            "--output",
            str(tmp_path / "x"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: input file(s) not found") and "nope.txt" in err


def test_missing_file_errors(tmp_path):
    with pytest.raises(BertforgeError, match=r"not found: .*missing\.txt"):
        Tokenizer.train([tmp_path / "missing.txt"], vocab_size=100)
    with pytest.raises(BertforgeError, match=r"absent\.txt: tokenizer file not found"):
        Tokenizer.from_file(tmp_path / "absent.txt")
    with pytest.raises(BertforgeError, match="holds neither tokenizer.json nor vocab.txt"):
        Tokenizer.from_file(tmp_path)


def test_vocab_without_mask_names_file_and_token(minilm_dir, tmp_path):
    lines = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "vocab.txt").write_text(
        "".join(x for x in lines if x != "[MASK]\n"), encoding="utf-8"
    )
    with pytest.raises(BertforgeError) as info:
        Tokenizer.from_file(tmp_path / "vocab.txt")
    message = str(info.value)
    assert str(tmp_path / "vocab.txt") in message and "[MASK]" in message
    assert "[PAD]" not in message.split(";")[0]  # only the missing token is named as missing
    assert "\n" not in message


def test_empty_corpus_is_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n   \n\n")
    with pytest.raises(BertforgeError, match=r"empty\.txt: the corpus is empty"):
        Tokenizer.train(empty, vocab_size=100)
    with pytest.raises(BertforgeError, match="corpus is empty"):
        Tokenizer.train_from_iterator(iter([]), vocab_size=100)


def test_bad_arguments_say_how_to_fix(shakespeare_tok):
    with pytest.raises(BertforgeError, match="vocab_size=5 leaves no room"):
        Tokenizer.train_from_iterator(["some text"], vocab_size=5)
    with pytest.raises(BertforgeError, match="max_length=2 cannot hold"):
        shakespeare_tok.encode("a", "b", max_length=2)
    with pytest.raises(BertforgeError, match="3 texts but 2 pairs"):
        shakespeare_tok.encode_batch(["a", "b", "c"], ["x", "y"])


def test_vocab_with_a_repeated_line_is_refused(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join([*SPECIAL_TOKENS, "the", "a", "the"]) + "\n")
    with pytest.raises(BertforgeError, match=r"token 'the' appears on lines 6 and 8"):
        Tokenizer.from_file(tmp_path)


def test_cli_refuses_an_existing_output_and_never_replaces_a_model(task_files, tmp_path, capsys):
    corpus = tmp_path / "cats.txt"
    corpus.write_text("the cat sat on the mat .\nthe dog ate a bone .\n" * 50)

    def train(output: Path, vocab: int, *extra: str) -> tuple[int, str]:
        argv = ["tokenizer", "train", "--input", str(corpus), "--vocab_size", str(vocab)]
        code = cli_main([*argv, "--output", str(output), "--min_frequency", "1", *extra])
        return code, capsys.readouterr().err

    out = tmp_path / "tok"
    assert train(out, 35) == (0, "")
    code, err = train(out, 30)  # a second vocabulary into the same directory
    assert code == 2 and err.count("\n") == 1
    assert f"error: {out}: already exists and is a tokenizer (vocab.txt" in err
    assert "choose another --output or pass --overwrite" in err
    assert Tokenizer.from_file(out).vocab_size == 35  # untouched
    assert train(out, 30, "--overwrite") == (0, "")
    assert Tokenizer.from_file(out).vocab_size == 30
    assert sorted(p.name for p in out.iterdir()) == [
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]

    model = task_files.tiny_start_model(tmp_path)  # a model's tokenizer matches its weights
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    for extra in ((), ("--overwrite",)):
        code, err = train(model, 30, *extra)
        assert code == 2 and f"error: {model} is a model (model.safetensors, config.json" in err
        assert "choose another --output" in err and "--overwrite only" not in err
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    assert cli_main(["verify", str(model)]) == 0

    mine = tmp_path / "mine"  # someone's files, with --overwrite too
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    code, err = train(mine, 30, "--overwrite")
    assert code == 2 and f"{mine} is a directory of other files (notes.txt)" in err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]

    empty = tmp_path / "empty"  # an empty directory is a new one
    empty.mkdir()
    assert train(empty, 30) == (0, "")
    assert Tokenizer.from_file(empty).vocab_size == 30


def test_tokenizer_train_reads_the_text_column_of_a_table(tmp_path, capsys):
    rng = random.Random(2)
    rows = [{"label": "zqxlabel", "text": noise(rng, 12)} for _ in range(200)]
    for fmt in ("csv", "jsonl"):
        table = tmp_path / f"labelled.{fmt}"
        TaskFiles.write_rows(table, rows, fmt)
        out = tmp_path / f"tok-{fmt}"
        base = ["tokenizer", "train", "--input", str(table), "--vocab_size", "200"]
        err = one_line_error([*base, "--output", str(out)], capsys)
        assert "--text_column" in err and "label" in err  # names the columns or keys
        assert cli.main([*base, "--output", str(out), "--text_column", "text"]) == 0
        vocab = (out / "vocab.txt").read_text().split()
        assert "movie" in vocab  # a filler word of the texts
        assert not {"zqxlabel", "label", '"', "{"} & set(vocab), fmt  # nothing but the texts


def test_sample_texts_is_bounded_uniform_ordered_and_seeded():
    texts = [f"line {i:05d} " + "x" * (i % 7) for i in range(20000)]
    whole = sum(len(t) for t in texts)
    sample, read, kept = sample_texts(iter(texts + ["", "  \n"]), whole // 10, seed=1)
    assert read == whole and kept == sum(len(t) for t in sample) <= whole // 10
    assert kept > whole // 10 - 40  # full up to about one line
    positions = [int(t.split()[1]) for t in sample]
    assert positions == sorted(positions)  # the input's order, not the keys'
    # uniform over the input: each tenth of the corpus gives about a tenth of the sample
    per_tenth = [sum(1 for p in positions if p // 2000 == k) for k in range(10)]
    assert min(per_tenth) > 0.75 * len(sample) / 10 and max(per_tenth) < 1.25 * len(sample) / 10
    assert sample_texts(iter(texts), whole // 10, seed=1)[0] == sample
    assert sample_texts(iter(texts), whole // 10, seed=2)[0] != sample
    assert sample_texts(iter(texts), whole, seed=1) == (texts, whole, whole)  # fits: all of it


def test_tokenizer_train_says_it_trained_on_a_sample_of_a_large_input(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt.bz2"
    words = [f"word{i}" for i in range(300)]
    with bz2.open(corpus, "wt", encoding="utf-8") as f:
        for i in range(3000):
            f.write(" ".join(words[(i * 7 + j) % 300] for j in range(12)) + ".\n")
    argv = ["tokenizer", "train", "--input", str(corpus), "--vocab_size", "400"]
    assert cli_main([*argv, "--output", str(tmp_path / "all")]) == 0
    assert "sample" not in capsys.readouterr().out
    assert cli_main([*argv, "--output", str(tmp_path / "part"), "--max_chars", "20000"]) == 0
    out = capsys.readouterr().out
    assert "random sample of 19,9" in out and "(--max_chars 20000, --seed 0)" in out
    assert Tokenizer.from_file(tmp_path / "part").token_to_id("word") is not None


# ---- any tokenizer.json: a BPE one, as a published ModernBERT ships ------------------------------


def test_a_bpe_tokenizer_json_loads_with_its_own_special_tokens(shakespeare_lines, tmp_path):
    """A byte-level BPE trained here: the special tokens come from tokenizer_config.json (cls
    from bos_token, sep from eos_token, the mask in special_tokens_map.json as {"content": ...}), the ids
    equal transformers' for texts and pairs, and the saved directory loads in both alike."""
    from support.bpe import train_bpe
    from transformers import AutoTokenizer

    directory = train_bpe(shakespeare_lines[:2000], tmp_path / "bpe")
    ours = Tokenizer.from_file(directory)
    assert ours.special_tokens == {
        "pad": "<pad>",
        "unk": "<unk>",
        "cls": "<s>",
        "sep": "</s>",
        "mask": "<mask>",
    }
    assert not ours.wordpiece and not ours.is_continuation.any()
    theirs = AutoTokenizer.from_pretrained(directory)
    texts = shakespeare_lines[:20] + ["the king <mask> here"]
    pairs = shakespeare_lines[20:41]
    assert ours.encode_batch(texts, padding=False)["input_ids"] == theirs(texts)["input_ids"]
    got = ours.encode_batch(texts, pairs, padding=False)["input_ids"]
    assert got == theirs(texts, pairs)["input_ids"]
    assert ours.mask_id in ours.encode("the king <mask> here")["input_ids"]
    assert ours.decode(ours.encode(texts[0])["input_ids"]) == texts[0]
    ours.save(tmp_path / "saved")
    assert not (tmp_path / "saved" / "vocab.txt").exists()  # no WordPiece vocabulary
    again = Tokenizer.from_file(tmp_path / "saved")
    assert again.fingerprint == ours.fingerprint
    assert (
        AutoTokenizer.from_pretrained(tmp_path / "saved")(texts)["input_ids"]
        == theirs(texts)["input_ids"]
    )


def test_a_tokenizer_json_without_its_special_tokens_named_is_refused(shakespeare_lines, tmp_path):
    from support.bpe import train_bpe

    directory = train_bpe(shakespeare_lines[:500], tmp_path / "bpe")
    (directory / "tokenizer_config.json").unlink()
    (directory / "special_tokens_map.json").unlink()
    with pytest.raises(BertforgeError, match=r"lacks the special token\(s\) \[PAD\]") as err:
        Tokenizer.from_file(directory)
    assert "tokenizer_config.json" in str(err.value) and "\n" not in str(err.value)


def test_cli_in_a_log_file_says_how_far_it_has_read_and_when_it_trains(
    tmp_path, monkeypatch, capsys
):
    """Where no bar is drawn (a log file, a recipe's step) tokenizer train prints prepare's
    lines: one every 5% of its input's bytes on disk once it has run PROGRESS_AFTER seconds
    (a gzip file by its compressed bytes), then one as the vocabulary training starts and one
    as it ends (those once it has run PROGRESS_AFTER seconds too); --progress false: none."""
    from bertforge.data import shards

    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)]
    plain, packed = tmp_path / "a.txt", tmp_path / "b.txt.gz"
    plain.write_text("".join(" ".join(rng.choices(words, k=10)) + "\n" for _ in range(8_000)))
    packed.write_bytes(gzip.compress(plain.read_bytes()[::-1]))
    monkeypatch.setattr(shards, "PROGRESS_AFTER", 0.0)
    argv = ["tokenizer", "train", "--input", str(plain), str(packed), "--vocab_size", "400"]

    def run(*extra: str) -> list[str]:
        capsys.readouterr()
        out = tmp_path / f"tok{len(list(tmp_path.iterdir()))}"
        assert cli_main([*argv, "--output", str(out), *extra]) == 0
        return [
            x for x in capsys.readouterr().err.splitlines() if x.startswith("tokenizer train: ")
        ]

    for extra, what in ((), "input"), (("--max_chars", "100000"), "sample"):
        lines = run(*extra)
        read = [x for x in lines if "% of the input read" in x]
        shares = [int(x.split("%")[0].removeprefix("tokenizer train: ")) for x in read]
        assert len(shares) >= 12 and shares == sorted(shares) and shares[-1] >= 90, lines
        assert all(b - a >= 5 for a, b in zip(shares, shares[1:], strict=False)), shares
        assert any(" left" in x for x in read)
        half = plain.stat().st_size / (plain.stat().st_size + packed.stat().st_size)
        assert any(abs(s / 100 - half) < 0.06 for s in shares)  # the first file ends there
        start, end = lines.index(read[-1]) + 1, len(lines) - 1
        assert lines[start].startswith(f"tokenizer train: training the vocabulary on the {what}")
        assert re.fullmatch(r"tokenizer train: vocabulary trained in \d+m\d\ds", lines[end])
    assert run("--progress", "false") == []
    monkeypatch.setattr(shards, "PROGRESS_AFTER", 3600.0)  # a short run: nothing
    assert run() == []
