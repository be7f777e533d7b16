"""Inference: fill-mask, classify and embed agree with transformers on the same weights, keep
input order whatever the batching, and reject bad input with a clear message."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import QUICK_FINETUNE, TaskFiles
from support.cli import one_line_error, run_cli

import bertforge
from bertforge import cli
from bertforge.errors import BertforgeError
from bertforge.modeling.model import BertForMaskedLM, BertForSequenceClassification, BertModel
from bertforge.tokenizer.wordpiece import Tokenizer


@pytest.fixture(scope="module")
def classifier_dir(mlm_dir, tmp_path_factory) -> Path:
    """A (random-headed) 3-class classifier built on the tiny encoder."""
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(
        mlm_dir, num_labels=3, id2label={0: "a", 1: "b", 2: "c"}
    )
    out = tmp_path_factory.mktemp("classifier") / "model"
    model.save_pretrained(out, tokenizer=Tokenizer.from_file(mlm_dir))
    return out


TEXTS = [
    "the [MASK] was a film .",
    "good",
    "a [MASK] story about people who went to [MASK] town .",
    "night [MASK]",
]


def test_fill_mask_matches_transformers_and_keeps_order(mlm_dir):
    transformers = pytest.importorskip("transformers")
    model, tok = BertForMaskedLM.from_pretrained(mlm_dir), Tokenizer.from_file(mlm_dir)
    texts = [t for t in TEXTS if "[MASK]" in t]
    one_by_one = [bertforge.fill_mask(model, tok, [t], top_k=3)[0] for t in texts]
    batched = bertforge.fill_mask(model, tok, texts, top_k=3, batch_size=2)
    for a, b in zip(batched, one_by_one, strict=True):  # padding changes float rounding only
        assert a["filled"] == b["filled"]
        assert [[p["id"] for p in m] for m in a["masks"]] == [
            [p["id"] for p in m] for m in b["masks"]
        ]
        assert [p["score"] for m in a["masks"] for p in m] == pytest.approx(
            [p["score"] for m in b["masks"] for p in m], abs=1e-6
        )
    assert [len(r["masks"]) for r in batched] == [1, 2, 1]
    assert all(len(m) == 3 for r in batched for m in r["masks"])
    assert batched[1]["text"] == texts[1] and "[MASK]" not in batched[1]["filled"]

    hf = transformers.BertForMaskedLM.from_pretrained(mlm_dir).eval()
    hf_tok = transformers.BertTokenizerFast.from_pretrained(mlm_dir)
    enc = hf_tok(texts[1], return_tensors="pt")
    with torch.no_grad():
        probs = hf(**enc).logits[0].softmax(-1)  # (T, V)
    positions = (enc["input_ids"][0] == hf_tok.mask_token_id).nonzero()[:, 0]
    for pos, predicted in zip(positions.tolist(), batched[1]["masks"], strict=True):
        top = probs[pos].topk(3)
        assert [p["id"] for p in predicted] == top.indices.tolist()
        np.testing.assert_allclose([p["score"] for p in predicted], top.values.numpy(), atol=1e-5)


def test_fill_mask_errors(mlm_dir):
    model, tok = BertForMaskedLM.from_pretrained(mlm_dir), Tokenizer.from_file(mlm_dir)
    with pytest.raises(BertforgeError, match="text 2 has no \\[MASK\\]"):
        bertforge.fill_mask(model, tok, ["a [MASK] .", "no mask here"])
    with pytest.raises(BertforgeError, match="text 1 is .* tokens long, more than the model's 64"):
        bertforge.fill_mask(model, tok, ["film " * 80 + "[MASK]"])
    with pytest.raises(BertforgeError, match="list of texts"):
        bertforge.fill_mask(model, tok, "a [MASK] .")


def test_fill_mask_keeps_a_lone_surrogate_as_the_replacement_character(mlm_dir):
    """A lone surrogate (what a JSON "\\ud800" escape decodes to) passed the encoding, which
    replaces it with U+FFFD, then raised the tokenizers library's TypeError when fill-mask
    mapped the mask back into the text's characters."""
    mlm, tok = BertForMaskedLM.from_pretrained(mlm_dir), Tokenizer.from_file(mlm_dir)
    out = bertforge.fill_mask(mlm, tok, ["ok [MASK]", "\ud800 [MASK] film"])
    top = out[1]["masks"][0][0]["token"].removeprefix("##")
    assert out[1]["filled"] == f"\ufffd {top} film" and out[1]["text"] == "\ud800 [MASK] film"


def test_classify_is_order_stable_and_sums_to_one(classifier_dir):
    model = BertForSequenceClassification.from_pretrained(classifier_dir)
    tok = Tokenizer.from_file(classifier_dir)
    texts = [t.replace("[MASK]", "movie") for t in TEXTS] * 2
    batched = bertforge.classify(model, tok, texts, batch_size=3)
    single = [bertforge.classify(model, tok, [t])[0] for t in texts]
    for a, b in zip(batched, single, strict=True):
        assert a["label"] == b["label"]
        assert a["scores"] == pytest.approx(b["scores"], abs=1e-5)
        assert set(a["scores"]) == {"a", "b", "c"} and sum(a["scores"].values()) == pytest.approx(1)
    assert bertforge.classify(model, tok, []) == []


@pytest.mark.slow
def test_embed_mean_pooling_matches_sentence_transformers_recipe(minilm_dir):
    transformers = pytest.importorskip("transformers")
    model, tok = BertModel.from_pretrained(minilm_dir), Tokenizer.from_file(minilm_dir)
    texts = ["A man is eating food.", "The new movie is awesome, I loved every minute of it.", "hi"]
    ours = bertforge.embed(model, tok, texts, pooling="mean", batch_size=2, normalize=True)
    hf = transformers.BertModel.from_pretrained(minilm_dir).eval()
    enc = transformers.BertTokenizerFast.from_pretrained(minilm_dir)(
        texts, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = hf(**enc).last_hidden_state
    mask = enc["attention_mask"][..., None].float()
    expected = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    np.testing.assert_allclose(ours, expected.numpy(), atol=1e-5)
    cls = bertforge.embed(model, tok, texts, pooling="cls", normalize=False)
    np.testing.assert_allclose(cls, hidden[:, 0].numpy(), atol=1e-5)
    assert ours.shape == (3, 384) and ours[0] @ ours[1] < ours[0] @ ours[0]
    with pytest.raises(BertforgeError, match="pooling"):
        bertforge.embed(model, tok, texts, pooling="median")


# ---- the commands -------------------------------------------------------------------------------


def test_fill_mask_command(mlm_dir, tmp_path, capsys):
    assert (
        cli.main(
            [
                "fill-mask",
                "--model",
                str(mlm_dir),
                "the [MASK] was good .",
                "--top_k",
                "2",
                "--precision",
                "fp32",
            ]
        )
        == 0
    )
    row = json.loads(capsys.readouterr().out)
    assert len(row["masks"]) == 1 and len(row["masks"][0]) == 2
    assert row["masks"][0][0]["score"] >= row["masks"][0][1]["score"]
    inputs = tmp_path / "in.txt"
    inputs.write_text("a [MASK] .\n\nthe [MASK] [MASK]\n")
    out = tmp_path / "out.jsonl"
    assert (
        cli.main(
            ["fill-mask", "--model", str(mlm_dir), "--input", str(inputs), "--output", str(out)]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in rows] == ["a [MASK] .", "the [MASK] [MASK]"]
    assert cli.main(["fill-mask", "--model", str(mlm_dir), "nothing to fill"]) == 2
    assert "has no [MASK]" in capsys.readouterr().err


def test_classify_command_table_input_and_errors(classifier_dir, mlm_dir, tmp_path, capsys):
    table = tmp_path / "in.jsonl"
    table.write_text(
        "".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(["x", "y z"]))
    )
    assert (
        cli.main(
            [
                "classify",
                "--model",
                str(classifier_dir),
                "--input",
                str(table),
                "--text_column",
                "body",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and all(r["label"] in "abc" for r in rows)
    assert cli.main(["classify", "--model", str(classifier_dir), "--input", str(table)]) == 2
    assert "no column 'text'; the file has columns 'body', 'id'" in capsys.readouterr().err
    assert cli.main(["classify", "--model", str(mlm_dir), "some text"]) == 2
    assert "no classifier weights" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert cli.main(["classify", "--model", str(classifier_dir), "--input", str(empty)]) == 2
    assert "empty" in capsys.readouterr().err


def test_embed_command_writes_npy(mlm_dir, tmp_path, capsys):
    inputs = tmp_path / "in.txt"
    inputs.write_text("a film\nthe good night story\nmusic\n")
    out = tmp_path / "vectors.npy"
    assert (
        cli.main(
            [
                "embed",
                "--model",
                str(mlm_dir),
                "--input",
                str(inputs),
                "--output",
                str(out),
                "--pooling",
                "mean",
                "--precision",
                "fp32",
            ]
        )
        == 0
    )
    vectors = np.load(out)
    assert vectors.shape == (3, 32) and vectors.dtype == np.float32
    model, tok = BertModel.from_pretrained(mlm_dir), Tokenizer.from_file(mlm_dir)
    np.testing.assert_allclose(
        vectors[1], bertforge.embed(model, tok, ["the good night story"], "mean")[0], atol=1e-6
    )
    assert cli.main(["embed", "--model", str(mlm_dir), "--input", str(inputs)]) == 2
    assert "required: --output" in capsys.readouterr().err  # and --help says so
    bad = ["embed", "--model", str(mlm_dir), "--input", str(inputs), "--output", "v.txt"]
    assert cli.main(bad) == 2
    assert "--output FILE.npy" in capsys.readouterr().err


def test_embed_says_when_a_blank_line_was_left_out(mlm_dir, tmp_path, capsys):
    inputs = tmp_path / "in.txt"
    inputs.write_text("a film\nmusic\n\nthe story\n")  # 4 lines, the third blank
    out = tmp_path / "v.npy"
    argv = ["embed", "--model", str(mlm_dir), "--input", str(inputs), "--output", str(out)]
    assert cli.main([*argv, "--precision", "fp32"]) == 0
    said = capsys.readouterr().err
    assert np.load(out).shape[0] == 3  # one row per text: rows 0-2 are lines 1, 2 and 4
    assert "1 blank line of" in said and "(line 3): row i is not line i" in said, said
    inputs.write_text("a film\nmusic\n")
    assert cli.main([*argv, "--precision", "fp32"]) == 0
    assert "left out" not in capsys.readouterr().err


def test_evaluate_command_on_an_mlm_model_compares_with_random_init(
    task_files, mlm_dir, tmp_path, capsys
):
    text = tmp_path / "text.txt"
    text.write_text(
        "the movie was a good film . the actors went to town .\n\n"
        "a story about people who see it on day one . music and a scene at night .\n"
    )
    out = tmp_path / "mlm.json"
    assert task_files.evaluate_cli(mlm_dir, text, out, "--max_length", "16") == 0
    printed = capsys.readouterr().out
    assert "random init" in printed and "this model" in printed and "perplexity" in printed
    result = json.loads(out.read_text())
    assert result["trained"]["tokens"] == result["random_init"]["tokens"] > 0  # same masks
    # the tiny model is itself untrained: both are near-uniform over the vocabulary
    assert abs(result["trained"]["loss"] - np.log(120)) < 1.0
    assert (
        cli.main(["evaluate", "--model", str(mlm_dir), "--data", str(tmp_path / "none.txt")]) == 2
    )
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["fill-mask", "embed", "classify", "evaluate"])
def test_model_commands_take_num_threads(command, mlm_dir, classifier_dir, tmp_path, capsys):
    """``--num_threads N`` on every model-using command (1 on a shared machine), as on
    pretrain and finetune; 0 is one line naming the option."""
    texts = tmp_path / "t.txt"
    texts.write_text("a film [MASK] good\nthe night\n")
    model = classifier_dir if command == "classify" else mlm_dir
    argv = {
        "fill-mask": ["a film [MASK] good"],
        "embed": ["--input", str(texts), "--output", str(tmp_path / "v.npy")],
        "classify": ["a film", "the night"],
        "evaluate": ["--data", str(texts)],
    }[command]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert cli.main([command, "--model", str(model), *argv, "--num_threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    assert cli.main([command, "--model", str(model), *argv, "--num_threads", "0"]) == 2
    assert "--num_threads 0 must be at least 1" in capsys.readouterr().err


# ---- what a first-time user tripped on: pooling, saved settings, [UNK] ---------------------------


def test_embed_uses_the_pooling_and_normalisation_a_sentence_transformers_model_declares(
    minilm_dir, mlm_dir, tmp_path, capsys
):
    texts = ["A man is eating food.", "The new movie is awesome.", "hi"]
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(texts) + "\n")
    model, tok = BertModel.from_pretrained(minilm_dir), Tokenizer.from_file(minilm_dir)
    mean = bertforge.embed(model, tok, texts, pooling="mean", normalize=True)
    cls = bertforge.embed(model, tok, texts, pooling="cls", normalize=True)
    # the Python API defaults to what 1_Pooling/config.json and modules.json declare
    np.testing.assert_allclose(bertforge.embed(model, tok, texts), mean, atol=1e-6)

    out = tmp_path / "v.npy"
    # fp32 like the API: `auto` is bf16 on a CPU with AVX512-BF16/AMX, ~1e-3 from fp32
    base = ["embed", "--model", str(minilm_dir), "--input", str(inputs), "--output", str(out)]
    base += ["--precision", "fp32"]
    code, _, err = run_cli(base, capsys)
    assert code == 0
    np.testing.assert_allclose(np.load(out), mean, atol=1e-6)
    assert "mean pooling (declared in 1_Pooling/config.json)" in err
    assert "normalized (2_Normalize in modules.json)" in err

    code, _, err = run_cli([*base, "--pooling", "cls"], capsys)
    assert code == 0 and "cls pooling (--pooling)" in err
    np.testing.assert_allclose(np.load(out), cls, atol=1e-6)
    code, _, err = run_cli([*base, "--pooling", "cls", "--normalize", "false"], capsys)
    assert code == 0 and "not normalized (--normalize false)" in err
    assert not np.allclose(np.linalg.norm(np.load(out), axis=1), 1.0)

    # a model that declares nothing keeps the documented default (cls, not normalized)
    code, _, err = run_cli(
        ["embed", "--model", str(mlm_dir), "--input", str(inputs), "--output", str(out)], capsys
    )
    assert code == 0 and "cls pooling (the default: the model declares none" in err


def test_classify_api_and_cli_use_the_saved_max_length_and_demand_pairs(pair_run, tmp_path, capsys):
    out = pair_run["out"]
    model, tok = BertForSequenceClassification.from_pretrained(out), Tokenizer.from_file(out)
    title, body = "the movie was a film with some actors", "and a plot about people " * 5
    api = bertforge.classify(model, tok, [title], [body])[0]
    assert api == bertforge.classify(model, tok, [title], [body], max_length=12)[0]
    assert api != bertforge.classify(model, tok, [title], [body], max_length=64)[0]
    table = tmp_path / "in.csv"
    TaskFiles.write_rows(table, [{"title": title, "body": body}])
    # fp32 like the API (`auto` is bf16 on a CPU with AVX512-BF16/AMX)
    argv = ["classify", "--model", str(out), "--input", str(table), "--precision", "fp32"]
    code, printed, err = run_cli(argv, capsys)
    assert code == 0, err
    assert json.loads(printed)["scores"] == pytest.approx(api["scores"], abs=1e-6)

    # positional texts (no pair) on a pair model: say what it expects
    with pytest.raises(BertforgeError, match="fine-tuned on text pairs"):
        bertforge.classify(model, tok, [title])
    code, _, err = run_cli(["classify", "--model", str(out), title], capsys)
    assert code == 2 and "fine-tuned on text pairs ('title' + 'body')" in err
    text = tmp_path / "in.txt"
    text.write_text(title + "\n")
    code, _, err = run_cli(["classify", "--model", str(out), "--input", str(text)], capsys)
    assert code == 2 and "--text_pair_column" not in err
    assert "a .csv, .tsv or .jsonl file with columns 'title' and 'body'" in err


def test_fill_mask_fills_the_input_text_and_keeps_unknown_words(mlm_dir):
    model, tok = BertForMaskedLM.from_pretrained(mlm_dir), Tokenizer.from_file(mlm_dir)
    text = "The [MASK] was in 1990 ."
    assert tok.unk_id in tok.backend.encode(text).ids  # 1990 is not in the tiny vocabulary
    result = bertforge.fill_mask(model, tok, [text, "a [MASK] [MASK]  story"])
    top = result[0]["masks"][0][0]["token"].removeprefix("##")
    assert result[0]["filled"] == f"The {top} was in 1990 ."
    first, second = (m[0]["token"].removeprefix("##") for m in result[1]["masks"])
    assert result[1]["filled"] == f"a {first} {second}  story"


def test_classify_takes_a_text_pair_on_the_command_line(classifier, tmp_path, capsys):
    argv = ["classify", "--model", str(classifier), "--progress", "false"]
    assert cli.main([*argv, "first text", "--text_pair", "good second text"]) == 0
    given = json.loads(capsys.readouterr().out)
    TaskFiles.write_rows(tmp_path / "p.csv", [{"text": "first text", "second": "good second text"}])
    assert cli.main([*argv, "--input", str(tmp_path / "p.csv")]) == 0
    assert json.loads(capsys.readouterr().out) == given  # the same pair, the same answer
    err = one_line_error([*argv, "one", "two", "--text_pair", "only one"], capsys)
    assert "2 text(s) but 1 --text_pair value(s)" in err
    assert "--text_pair SECOND" in one_line_error([*argv, "no pair"], capsys)
    single = tmp_path / "single"
    shutil.copytree(classifier, single)
    settings = json.loads((single / "finetune_config.json").read_text())
    (single / "finetune_config.json").write_text(json.dumps(settings | {"text_pair_column": None}))
    argv = ["classify", "--model", str(single), "a", "--text_pair", "b"]
    assert "fine-tuned on single texts, not pairs; drop --text_pair" in one_line_error(argv, capsys)


def test_a_fine_tuned_model_keeps_its_starts_pooling_for_embed(classifier, tmp_path, capsys):
    """A single-text classifier fine-tuned from a start declaring mean pooling keeps the
    declaration (embed pools it as its start); a pair model (``classifier``) is a cross-encoder
    and does not: sentence-transformers reads a modules.json as a bi-encoder's."""
    start = classifier.parent / "start"
    assert (start / "modules.json").is_file() and not (classifier / "modules.json").exists()
    TaskFiles.write_rows(
        tmp_path / "t.csv", [{"text": f"w{i} film", "label": i % 2} for i in range(20)]
    )
    single = tmp_path / "single"
    argv = ["finetune", "--model", str(start), "--train", str(tmp_path / "t.csv")]
    assert cli.main([*argv, "--output", str(single), *QUICK_FINETUNE, "--max_steps", "1"]) == 0
    assert (single / "1_Pooling" / "config.json").is_file()
    (tmp_path / "s.txt").write_text("a film\n", encoding="utf-8")
    argv = ["embed", "--model", str(single), "--input", str(tmp_path / "s.txt")]
    capsys.readouterr()
    assert cli.main([*argv, "--output", str(tmp_path / "v.npy"), "--progress", "false"]) == 0
    assert "mean pooling (declared in" in capsys.readouterr().err
