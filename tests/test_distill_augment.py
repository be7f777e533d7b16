"""TinyBERT's augmentation (``bertforge distill --augment``) and ``--metric``: the word replacement against hand-made
candidates, the words a vocabulary offers for replacement, the candidates a real masked LM
proposes, and distillation runs whose teacher labels the new texts (single texts and pairs),
with the one-line refusals."""

from __future__ import annotations

import csv
import json
import random

import numpy as np
import pytest
import torch
from conftest import TaskFiles
from support.cli import one_line_error
from test_distill import QUICK, distill_argv, work  # noqa: F401 - the module fixture

from bertforge import cli
from bertforge.modeling.model import BertForMaskedLM
from bertforge.progress import read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.distill import AUGMENTED_FILE
from bertforge.training.distill_augment import (
    WORD,
    augment,
    augmented_copies,
    matching_case,
    paired_rows,
    replaceable_words,
    word_candidates,
)


def test_every_word_replaced_at_rate_one_with_its_only_candidate():
    text = "The film, a Good one."
    spans = [(0, 3), (4, 8), (10, 11), (12, 16), (17, 20)]
    candidates = [["a"], ["play"], [], ["bad"], ["day"]]
    rng = np.random.default_rng(0)
    # one candidate each: every copy is the same text, so the second is a duplicate and dropped
    assert augmented_copies(text, spans, candidates, 2, 1.0, rng) == ["A play, a Bad day."]


def test_no_variant_when_nothing_is_replaced():
    rng = np.random.default_rng(0)
    assert augmented_copies("a film", [(2, 6)], [["play"]], 5, 1e-12, rng) == []
    assert augmented_copies("a film", [(2, 6)], [[]], 5, 1.0, rng) == []  # no candidates


def test_variants_are_distinct_draws_at_the_given_rate():
    words = [f"w{i}" for i in range(200)]
    text = " ".join(words)
    spans, at = [], 0
    for w in words:
        spans.append((at, at + len(w)))
        at += len(w) + 1
    candidates = [["x", "y", "z"]] * len(words)
    out = augmented_copies(text, spans, candidates, 8, 0.4, np.random.default_rng(3))
    assert len(out) == len(set(out)) == 8 and text not in out
    for variant in out:
        changed = [a != b for a, b in zip(variant.split(), words, strict=True)]
        assert 0.3 < sum(changed) / len(words) < 0.5  # 0.4 of 200 words, within ~3 s.d.
        assert {b for a, b in zip(words, variant.split(), strict=True) if a != b} <= {"x", "y", "z"}
    # the same seed draws the same variants
    assert augmented_copies(text, spans, candidates, 8, 0.4, np.random.default_rng(3)) == out


def test_a_pair_side_with_fewer_variants_keeps_its_text():
    assert paired_rows([["a1", "a2"]], "a", None) == [("a1", None), ("a2", None)]
    assert paired_rows([["a1", "a2", "a3"], ["b1"]], "a", "b") == [
        ("a1", "b1"), ("a2", "b"), ("a3", "b"),
    ]  # fmt: skip
    assert paired_rows([[], ["b1", "b2"]], "a", "b") == [("a", "b1"), ("a", "b2")]
    assert paired_rows([[], []], "a", "b") == []  # neither side changed: no new row


def test_a_replacement_takes_the_case_of_its_word():
    assert matching_case("play", "Film") == "Play"
    assert matching_case("play", "FILM") == "PLAY"
    assert matching_case("play", "film") == "play"
    assert matching_case("play", "A") == "Play"


@pytest.fixture(scope="module")
def mlm(work) -> tuple[BertForMaskedLM, Tokenizer]:  # noqa: F811
    return BertForMaskedLM.from_pretrained(work["start"]).eval(), Tokenizer.from_file(work["start"])


def test_replaceable_words_are_single_known_pieces(mlm):
    _, tokenizer = mlm
    vocab = [t for t in (tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)) if t]
    single = next(t for t in vocab if WORD.fullmatch(t) and len(t) > 3)
    text = f"{single.capitalize()}, 42 zzqqxxvv {single}!"
    spans = replaceable_words(tokenizer, text)
    words = [text[s:e] for s, e in spans]
    assert words == [single.capitalize(), single]  # not the number, not the unknown/split word
    assert replaceable_words(tokenizer, "... 12 !") == []
    # the parts of a contraction or a possessive stay as they are
    text = f"{single} won't {single}'s {single}\u2019t {single}"
    assert [text[s:e] for s, e in replaceable_words(tokenizer, text)] == [single, single]


def test_candidates_are_whole_words_from_the_model_and_never_the_word_itself(mlm):
    model, tokenizer = mlm
    text = "a good film and a bad plot"
    spans = replaceable_words(tokenizer, text)
    assert spans
    table = word_candidates(model, tokenizer, [text], [spans], 4, batch_size=8, precision="fp32")[0]
    assert len(table) == len(spans)
    for (s, e), cands in zip(spans, table, strict=True):
        assert len(cands) == 4 and text[s:e].lower() not in cands
        assert all(WORD.fullmatch(c) and not c.startswith("##") for c in cands)
    # the first candidate is the model's likeliest whole word in that place
    s, e = spans[1]
    masked = text[:s] + "[MASK]" + text[e:]
    batch = tokenizer.encode_batch([masked], return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits[0, batch["input_ids"][0].tolist().index(tokenizer.mask_id)]
    for token_id in logits.argsort(descending=True).tolist():
        token = tokenizer.id_to_token(token_id)
        if WORD.fullmatch(token) and token_id not in tokenizer.special_ids and token != "good":
            break
    assert table[1][0] == token


def test_augment_pairs_varies_each_side_from_its_own_text(mlm):
    model, tokenizer = mlm
    texts, pairs = ["a good film", "the plot"], ["bad acting here", "good good"]
    made = augment(
        model, tokenizer, texts, pairs, copies=4, rate=0.9, k=5, seed=0,
        batch_size=8, precision="fp32",
    )  # fmt: skip
    assert made.pairs is not None and len(made.pairs) == len(made.texts) == len(made.source)
    assert set(made.source) == {0, 1} and made.source == sorted(made.source)
    for a, b, i in zip(made.texts, made.pairs, made.source, strict=True):
        assert (a, b) != (texts[i], pairs[i])
        assert len(WORD.findall(a)) == len(WORD.findall(texts[i]))
        assert len(WORD.findall(b)) == len(WORD.findall(pairs[i]))
    again = augment(
        model, tokenizer, texts[:1], pairs[:1], copies=4, rate=0.9, k=5, seed=0,
        batch_size=1, precision="fp32",
    )  # fmt: skip
    first = [j for j, i in enumerate(made.source) if i == 0]
    assert again.texts == [made.texts[j] for j in first]  # row 0 alone: the same draws


def test_distill_with_augmentation_has_the_teacher_label_the_new_texts(work, capsys):  # noqa: F811
    out = work["root"] / "augmented"
    argv = distill_argv(work, out, "--student_preset", "tiny", "--train", str(work["train"]))
    argv += ["--augment", str(work["start"]), "--augment_copies", "3", "--max_steps", "6"]
    assert cli.main([*argv, "--keep_final_checkpoint", "true"]) == 0
    err = capsys.readouterr().err
    rows = [json.loads(line) for line in (out / AUGMENTED_FILE).read_text().splitlines()]
    gold = 240 - 24  # --validation_fraction 0.1 of the 240 rows held out
    assert gold < len(rows) <= 3 * gold
    assert f"augment: {len(rows):,} new texts from {gold:,} labelled ones" in err
    assert all(0 <= r["source"] < gold and "pair" not in r for r in rows)
    # the teacher's outputs: the labelled rows, every new text, then the 24 validation rows
    assert np.load(out / "teacher_outputs.npy", mmap_mode="r").shape[0] == gold + len(rows) + 24
    with open(work["train"], encoding="utf-8") as f:
        originals = [r["text"] for r in csv.DictReader(f)]
    # a new text is an old one with words replaced: the rest of its characters are the same
    skeletons = {WORD.sub("", t) for t in originals}
    assert all(WORD.sub("", r["text"]) in skeletons for r in rows)
    assert (out / "model.safetensors").is_file()


def test_distill_a_pair_teacher_with_augmentation(classifier, work, tmp_path):  # noqa: F811
    out = tmp_path / "pairs"
    argv = ["distill", "--teacher", str(classifier), "--output", str(out), *QUICK]
    argv += ["--student_layers", "0", "--train", str(classifier.parent / "train.csv")]
    argv += ["--augment", str(work["start"]), "--augment_copies", "2", "--max_steps", "2"]
    assert cli.main([*argv, "--batch_size", "8", "--validation_fraction", "0.25"]) == 0
    rows = [json.loads(line) for line in (out / AUGMENTED_FILE).read_text().splitlines()]
    assert rows and all({"source", "text", "pair"} == set(r) for r in rows)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no_mlm_head", "--augment needs a model with a masked-LM head"),
        ("rate_zero", "--augment_rate 0.0 must lie in (0, 1]"),
        ("no_train", "--augment makes new texts from --train's rows"),
        ("copies_zero", "--augment_copies 0 must be at least 1"),
    ],
)
def test_bad_augmentation_is_one_line(work, tmp_path, capsys, case, expected):  # noqa: F811
    out = tmp_path / "out"
    train = ["--train", str(work["train"])]
    base = distill_argv(work, out, "--student_preset", "tiny")
    argv = {
        "no_mlm_head": [*base, *train, "--augment", str(work["teacher"])],
        "rate_zero": [*base, *train, "--augment", str(work["start"]), "--augment_rate", "0"],
        "no_train": [*base, "--unlabelled", str(work["unlabelled"]), "--validation",
                     str(work["train"]), "--augment", str(work["start"])],
        "copies_zero": [*base, *train, "--augment", str(work["start"]), "--augment_copies", "0"],
    }[case]  # fmt: skip
    assert expected in one_line_error(argv, capsys)
    assert not out.exists()


def test_an_embedding_teacher_refuses_augmentation(work, minilm_dir, tmp_path, capsys):  # noqa: F811
    rng = random.Random(0)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TaskFiles.sentence(rng, "good") for _ in range(40)) + "\n")
    out = tmp_path / "out"
    argv = ["distill", "--teacher", str(minilm_dir), "--output", str(out), *QUICK]
    argv += ["--student_layers", "0", "--unlabelled", str(texts), "--augment", str(work["start"])]
    assert "--augment is for classification and regression teachers" in one_line_error(argv, capsys)
    assert not out.exists()


def test_metric_picks_the_best_student_by_the_named_score(work, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "mcc"
    argv = distill_argv(work, out, "--student_preset", "tiny", "--train", str(work["train"]))
    argv += ["--lr", "3e-3", "--max_steps", "30", "--eval_every", "10"]
    assert cli.main([*argv, "--metric", "mcc"]) == 0
    capsys.readouterr()
    results = json.loads((out / "eval_results.json").read_text())
    assert results["metric"] == "mcc"
    vals = [r for r in read_metrics(out) if r["split"] == "val"]
    best = max(vals, key=lambda r: r["mcc"])  # the first of equal scores is kept
    assert results["best_step"] == best["step"] and best["mcc"] > 0.5
    err = one_line_error([*argv, "--metric", "spearman", "--output", str(tmp_path / "x")], capsys)
    assert "--metric spearman is not a classification metric; choose one of accuracy" in err
    assert not (tmp_path / "x").exists()
