"""Fine-tuning end to end on a tiny model: it learns a keyword rule far above chance, saves a
model transformers loads with the same outputs, evaluates and classifies through the CLI,
resumes exactly, handles regression, and says clearly what is wrong with bad input."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import QUICK_FINETUNE, TaskFiles, noise
from support.cli import one_line_error, run_cli

from bertforge import cli
from bertforge.data.encoding import batch_order, collate, encode_examples
from bertforge.data.labelled import load_labelled, random_split, stratified_split
from bertforge.data.labels import build_label_map, labels_to_ids
from bertforge.errors import BertforgeError
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForSequenceClassification
from bertforge.progress import read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training import steps as training
from bertforge.training.checkpoints import checkpoint_name, list_checkpoints

FAST = [
    "--max_length",
    "32",
    "--batch_size",
    "16",
    "--lr",
    "3e-3",
    "--dropout",
    "0",
    "--precision",
    "fp32",
    "--progress",
    "false",
    "--warmup_ratio",
    "0.1",
]


@pytest.fixture(scope="module")
def work(task_files, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("finetune")
    paths = {
        "root": root,
        "start": task_files.tiny_start_model(root),
        "train": root / "train.csv",
        "test": root / "test.jsonl",
        "scores": root / "scores.csv",
    }
    task_files.write_sentiment(paths["train"], 480, seed=1)
    task_files.write_sentiment(paths["test"], 200, seed=2, fmt="jsonl")
    task_files.write_scores(paths["scores"], 480, seed=3)
    return paths


def finetune_argv(
    work: dict[str, Path], out: Path, *options: str, train: str = "train"
) -> list[str]:
    """``bertforge finetune`` of the tiny start model on ``work[train]`` into ``out``, with the
    ``FAST`` settings after ``options``."""
    return [
        "finetune",
        "--model",
        str(work["start"]),
        "--train",
        str(work[train]),
        "--output",
        str(out),
        *options,
        *FAST,
    ]


@pytest.fixture(scope="module")
def trained(work) -> Path:
    out = work["root"] / "sentiment"
    options = ["--text_column", "text", "--label_column", "label", "--task", "classification"]
    assert cli.main(finetune_argv(work, out, *options, "--epochs", "4", "--eval_every", "27")) == 0
    return out


def test_finetuning_learns_the_keyword_rule_far_above_chance(trained):
    results = json.loads((trained / "eval_results.json").read_text())
    assert results["validation"]["accuracy"] >= 0.9  # chance is 0.5
    assert results["validation"]["mcc"] >= 0.8
    assert results["baseline"]["accuracy"] < 0.65  # majority class of a balanced split
    val = [r for r in read_metrics(trained) if r["split"] == "val"]
    assert len(val) >= 3 and val[-1]["loss"] < val[0]["loss"]
    for name in ("confusion_matrix.png", "curves.png", "finetune_config.json", "vocab.txt"):
        assert (trained / name).is_file(), name
    assert (trained / "confusion_matrix.png").read_bytes()[:4] == b"\x89PNG"


def test_saved_model_loads_in_transformers_with_labels_and_same_logits(trained):
    transformers = pytest.importorskip("transformers")
    saved = json.loads((trained / "config.json").read_text())
    assert saved["id2label"] == {"0": "neg", "1": "pos"} and saved["label2id"] == {
        "neg": 0,
        "pos": 1,
    }
    assert saved["architectures"] == ["BertForSequenceClassification"]
    ours = BertForSequenceClassification.from_pretrained(trained).eval()
    theirs = transformers.BertForSequenceClassification.from_pretrained(trained).eval()
    assert theirs.config.id2label == {0: "neg", 1: "pos"}
    hf_tok = transformers.BertTokenizerFast.from_pretrained(trained)
    batch = hf_tok(
        ["a good film .", "the plot was bad and long"], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        expected = theirs(**batch).logits
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_evaluate_and_classify_commands_use_the_fine_tuned_model(
    task_files, trained, work, tmp_path, capsys
):
    report = tmp_path / "eval.json"
    assert task_files.evaluate_cli(trained, work["test"], report) == 0
    printed = capsys.readouterr().out
    assert "precision" in printed and "neg" in printed and "pos" in printed
    result = json.loads(report.read_text())
    assert result["accuracy"] >= 0.9 and result["examples"] == 200
    assert [r["label"] for r in result["per_class"]] == ["neg", "pos"]

    texts = ["it was good", "a bad story about people", "music scene good town"]
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("\n".join(texts) + "\n")
    out = tmp_path / "labels.jsonl"
    assert (
        cli.main(
            [
                "classify",
                "--model",
                str(trained),
                "--input",
                str(inputs),
                "--output",
                str(out),
                "--batch_size",
                "2",
                "--precision",
                "fp32",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["label"] for r in rows] == ["pos", "neg", "pos"]  # input order kept
    assert all(abs(sum(r["scores"].values()) - 1) < 1e-5 for r in rows)
    assert (
        cli.main(["classify", "--model", str(trained), "the film was bad", "--precision", "fp32"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["label"] == "neg"


def test_label_map_round_trip():
    assert build_label_map(["b", "a", "b", "c"]) == {0: "a", 1: "b", 2: "c"}
    # integer labels keep numeric order (10 after 9), whatever their spelling in the file
    id2label = build_label_map(["10", 9, "1", 1.0, " 2 "])
    assert id2label == {0: "1", 1: "2", 2: "9", 3: "10"}
    config = BertConfig(hidden_size=32, num_attention_heads=4, id2label=id2label)
    again = BertConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again.id2label == id2label and again.label2id == {"1": 0, "2": 1, "9": 2, "10": 3}
    assert labels_to_ids([10, "9", 1], again.label2id).tolist() == [3, 2, 0]
    with pytest.raises(Exception, match="label '7'.*does not know"):
        labels_to_ids(["7"], again.label2id, "new.csv")


def test_regression_learns_scores_in_their_own_units(work, monkeypatch):
    from bertforge.evaluation import plots

    titles, save = [], plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, output: titles.append(
        (Path(output).name, fig.get_suptitle() or fig.axes[0].get_title())) or save(fig, output))  # fmt: skip
    out = work["root"] / "scores"
    options = ["--text_column", "review", "--label_column", "score", "--task", "regression"]
    argv = finetune_argv(work, out, *options, "--epochs", "5", "--eval_every", "40", train="scores")
    assert cli.main(argv) == 0
    # the task and the run's folder with its parent (a benchmark's STS-B/seed-0, not seed-0)
    run = f"{work['root'].name}/scores"
    assert titles == [
        ("predicted_vs_true.png", f"regression: validation ({run})"),
        ("curves.png", f"bertforge finetune: {run}"),
    ]
    results = json.loads((out / "eval_results.json").read_text())
    assert results["metric"] == "spearman"
    assert results["validation"]["spearman"] >= 0.8
    assert results["baseline"]["spearman"] == 0.0  # a constant prediction has no rank order
    assert results["validation"]["mse"] < 0.5 * results["baseline"]["mse"]
    assert (out / "predicted_vs_true.png").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["num_labels"] == 1 and config["problem_type"] == "regression"
    # the normalisation is folded into the saved head: raw outputs are scores 0..6
    model = BertForSequenceClassification.from_pretrained(out).eval()
    tok = Tokenizer.from_file(out)
    batch = tok.encode_batch(["good good good film .", "a film ."], return_tensors="pt")
    with torch.no_grad():
        values = model(**batch).logits[:, 0]
    assert values[0] > 4.0 and values[1] < 2.0


@pytest.mark.parametrize("micro", [None, "8"])
def test_resume_from_a_checkpoint_continues_exactly(work, micro):
    options = ["--max_steps", "20", "--eval_every", "10", "--keep_checkpoints", "0"]
    options += ["--keep_final_checkpoint"]  # a finished run drops its checkpoints otherwise
    if micro is not None:  # 2 micro-batches of 8 per optimizer step
        options += ["--micro_batch_size", micro]
    full, resumed = work["root"] / f"full-{micro}", work["root"] / f"resumed-{micro}"
    assert cli.main(finetune_argv(work, full, *options)) == 0
    first, last = list_checkpoints(full)
    shutil.copytree(first, resumed / first.name)  # as if the run had been killed after step 10
    for f in full.iterdir():  # ... leaving its best model so far next to the checkpoint
        if f.is_file():
            shutil.copy(f, resumed / f.name)
    assert cli.main(finetune_argv(work, resumed, *options)) == 0
    a = BertForSequenceClassification.from_pretrained(last).state_dict()
    b = BertForSequenceClassification.from_pretrained(list_checkpoints(resumed)[-1]).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    losses = [
        [r["loss"] for r in read_metrics(d) if r["split"] == "train" and r["step"] > 10]
        for d in (full, resumed)
    ]
    assert losses[0] == losses[1] and losses[0]


def test_max_steps_overrides_epochs_as_in_transformers(work):
    """--epochs 0.1 is 3 steps of this data; --max_steps 5 trains 5 (into a second epoch)."""
    out = work["root"] / "max-steps"
    argv = finetune_argv(work, out, "--epochs", "0.1", "--max_steps", "5", "--log_every", "1")
    assert cli.main(argv) == 0
    assert max(r["step"] for r in read_metrics(out) if r["split"] == "train") == 5


def test_resume_with_changed_settings_is_refused(work, capsys):
    out = work["root"] / "changed"
    argv = finetune_argv(work, out, "--max_steps", "2")
    assert cli.main(argv) == 0
    assert cli.main([*argv, "--batch_size", "8"]) == 2
    assert "--batch_size was 16, now 8" in capsys.readouterr().err


def test_a_finished_run_is_kept_only_for_the_same_settings(work, capsys):
    out = work["root"] / "finished"
    argv = finetune_argv(work, out, "--max_steps", "2")
    assert cli.main(argv) == 0
    capsys.readouterr()
    model = (out / "model.safetensors").read_bytes()
    # settings that leave the model as it is: the finished run is the answer
    assert cli.main([*argv, "--progress", "true", "--num_threads", "1"]) == 0
    assert "holds a finished run of these settings" in capsys.readouterr().err
    for changed, said in (
        (["--lr", "0.5"], "--lr was 0.003, now 0.5"),
        (["--max_steps", "30"], "--max_steps was 2, now 30"),
        (["--warmup_ratio", "0", "--weight_decay", "0"], "--weight_decay was 0.01, now 0.0; "),
    ):
        assert cli.main([*argv, *changed]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
        assert f"error: {out} holds a finished run of other settings (" in err
        assert f"choose another --output to train with these, or delete {out}" in err
    assert "--warmup_ratio was 0.1, now 0.0)" in err  # every setting that differs
    assert (out / "model.safetensors").read_bytes() == model


def test_output_must_be_new_empty_or_a_fine_tuning_run(work, capsys):
    """Someone's files, a tokenizer and a pretraining run are refused before anything is
    written: the pretraining run's checkpoint is not read (nor called damaged)."""
    root = work["root"] / "foreign"
    mine, tok, pretraining = root / "mine", root / "tokenizer", root / "pt2"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    Tokenizer.from_file(work["start"]).save(tok)
    checkpoint = pretraining / checkpoint_name(300)  # a pretraining state: no epoch, batch, best
    checkpoint.mkdir(parents=True)
    (checkpoint / "train_state.json").write_text('{"step": 300, "data": {"epoch": 0}}')
    (checkpoint / "train_state.pt").write_bytes(b"")
    (pretraining / "pretrain_config.yaml").write_text("train: {}\n")
    shutil.copytree(work["start"], pretraining / "model")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for out, held in (
        (mine, "a directory of other files (notes.txt)"),
        (tok, "a tokenizer (vocab.txt, tokenizer.json, tokenizer_config.json)"),
        (pretraining, "a pretraining run (pretrain_config.yaml, checkpoint-00000300/, model/)"),
    ):
        assert cli.main(finetune_argv(work, out, "--max_steps", "2")) == 2
        err = capsys.readouterr().err
        assert err == (
            f"error: {out} is {held}, not a fine-tuning run; choose another --output "
            "(a new or empty directory)\n"
        )
    argv = finetune_argv(work, pretraining, "--max_steps", "2")
    argv[argv.index("--model") + 1] = str(pretraining / "model")  # finetune runs/pt2/model
    assert cli.main(argv) == 2 and "damaged" not in capsys.readouterr().err
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_micro_batches_split_rows_and_weight_by_share():
    assert training.micro_batches([7, 3, 5], 2) == [([7, 3], 2 / 3), ([5], 1 / 3)]
    assert training.micro_batches([7, 3, 5, 1], 4) == [([7, 3, 5, 1], 1.0)]
    split = training.micro_batches(np.arange(8), 2)
    assert [c.tolist() for c, _ in split] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [w for _, w in split] == [0.25] * 4
    # weighted by units (a tagger's labelled words); a micro-batch without any is left out
    assert training.micro_batches([7, 3, 5], 2, units=[2, 1, 1]) == [([7, 3], 0.75), ([5], 0.25)]
    assert training.micro_batches([7, 3, 5], 2, units=[0, 0, 4]) == [([5], 1.0)]
    assert training.micro_batches([7, 3], 1, units=[0, 0]) == []


def test_gradient_accumulation_takes_the_same_steps_as_the_whole_batch(
    task_files, work, tmp_path, capsys
):
    """Batch 8 in one forward pass, in 2 x 4 and in 4 x 2: the same weights after each of the two
    optimizer steps of an 11-row epoch (8 rows, then 3: split 2 + 1, weighted by rows)."""
    train = tmp_path / "eleven.csv"
    labels = {r["label"] for r in task_files.write_sentiment(train, 11, seed=5)}
    assert labels == {"pos", "neg"}
    task_files.write_sentiment(val := tmp_path / "val.csv", 16, seed=6)
    options = [
        *("--validation", str(val), "--max_steps", "2", "--eval_every", "1"),
        *("--log_every", "1", "--keep_checkpoints", "0", "--schedule", "constant"),
        "--keep_final_checkpoint",
    ]
    runs = {}
    for micro in (None, "4", "2"):
        out = tmp_path / f"micro-{micro}"
        argv = finetune_argv(work, out, *options, *(["--micro_batch_size", micro] * bool(micro)))
        argv[argv.index("--train") + 1] = str(train)
        assert cli.main([*argv, "--batch_size", "8"]) == 0
        accum = 8 // int(micro or 8)
        assert f"2 steps of batch 8 = {accum} x {int(micro or 8)}" in capsys.readouterr().err
        runs[micro] = out
    start = BertForSequenceClassification.from_pretrained(work["start"]).state_dict()
    reference = None
    for micro, out in runs.items():
        checkpoints = list_checkpoints(out)  # eval and checkpoint cadence: optimizer steps
        assert [c.name for c in checkpoints] == [checkpoint_name(1), checkpoint_name(2)], micro
        weights = [
            BertForSequenceClassification.from_pretrained(c).state_dict() for c in checkpoints
        ]
        metrics = read_metrics(out)
        losses = [r["loss"] for r in metrics if r["split"] == "train"]
        assert [r["step"] for r in metrics if r["split"] == "val"] == [1, 2]
        if reference is None:
            reference = weights, losses
            moved = max(
                float((w - start[k]).abs().max()) for k, w in weights[1].items() if k in start
            )
            assert moved > 1e-3  # the steps really changed the encoder
            continue
        for got, expected in zip(weights, reference[0], strict=True):
            for key in expected:
                torch.testing.assert_close(got[key], expected[key], atol=2e-6, rtol=1e-5)
        assert losses == pytest.approx(reference[1], rel=1e-5)


def test_micro_batch_size_must_divide_the_batch(work, tmp_path, capsys):
    base = finetune_argv(work, tmp_path / "o", "--batch_size", "16")
    assert "--micro_batch_size 3 does not divide --batch_size 16" in _error(
        [*base, "--micro_batch_size", "3"], capsys
    )
    assert "--micro_batch_size 0 must be at least 1" in _error(
        [*base, "--micro_batch_size", "0"], capsys
    )


# ---- data: formats, splits, truncation, batches ----------------------------------------------


def test_reads_csv_tsv_jsonl_and_gzip_alike(task_files, tmp_path):
    rows = [{"text": "a <br />b", "label": "x"}, {"text": "c", "label": "y"}]
    for name, fmt in (("d.csv", "csv"), ("d.tsv", "tsv"), ("d.jsonl", "jsonl")):
        task_files.write_rows(tmp_path / name, rows, fmt)
        gz = tmp_path / (name + ".gz")
        gz.write_bytes(gzip.compress((tmp_path / name).read_bytes()))
        for path in (tmp_path / name, gz):
            data, id2label = load_labelled(path, text_column="text", label_column="label")
            assert data.texts == ["a  b", "c"] and data.labels.tolist() == [0, 1], path
            assert id2label == {0: "x", 1: "y"}


def test_stratified_split_keeps_class_shares():
    labels = np.array([0] * 80 + [1] * 20)
    train, val = stratified_split(labels, 0.25, seed=0)
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(100))
    assert np.bincount(labels[val]).tolist() == [20, 5]
    values = np.arange(200, dtype=np.float32)
    _, val = stratified_split(values, 0.1, seed=0, regression=True)
    assert (
        len(val) == 20
        and np.histogram(values[val], bins=10, range=(0, 200))[0].tolist() == [2] * 10
    )


def test_random_split_holds_out_a_seeded_share_and_refuses_an_empty_side():
    train, val = random_split(10, 0.3, seed=0, unit="texts")
    assert len(val) == 3 and sorted([*train, *val]) == list(range(10))
    assert list(train) == sorted(train) and list(val) == sorted(val)
    assert (random_split(10, 0.3, seed=0, unit="texts")[1] == val).all()
    assert not (random_split(10, 0.3, seed=1, unit="texts")[1] == val).all()
    with pytest.raises(BertforgeError, match="of 3 rows leaves an empty split; give more data"):
        random_split(3, 0.1, seed=0, unit="rows")
    with pytest.raises(BertforgeError, match="strictly between 0 and 1"):
        random_split(10, 1.0, seed=0, unit="rows")


def test_head_tail_truncation_and_dynamic_padding(work):
    tok = Tokenizer.from_file(work["start"])
    words = " ".join(f"w{i}" for i in range(40))
    ids = [int(x) for x in tok.backend.encode(words, add_special_tokens=False).ids]
    ((head, _),) = encode_examples(tok, [words], max_length=10)
    ((ht, _),) = encode_examples(tok, [words], max_length=10, truncation="head_tail")
    assert head.tolist() == [tok.cls_id, *ids[:8], tok.sep_id]
    assert ht.tolist() == [
        tok.cls_id,
        *ids[:2],
        *ids[-6:],
        tok.sep_id,
    ]  # a quarter head, the rest tail
    ((tail, _),) = encode_examples(tok, [words], max_length=10, truncation="tail")
    assert tail.tolist() == [tok.cls_id, *ids[-8:], tok.sep_id]
    short = " ".join(f"w{i}" for i in range(3))
    ((pair, first_len),) = encode_examples(tok, [short], [words], max_length=12, truncation="tail")
    a = [int(x) for x in tok.backend.encode(short, add_special_tokens=False).ids]
    assert first_len == len(a) + 2  # the longer side is cut, from its beginning
    assert pair.tolist() == [tok.cls_id, *a, tok.sep_id, *ids[-(9 - len(a)) :], tok.sep_id]
    enc = encode_examples(tok, ["good", "a film with people"], ["bad", "x"], max_length=64)
    batch = collate(enc, tok.pad_id)
    assert batch["input_ids"].shape[1] == max(len(e[0]) for e in enc)  # longest, not max_length
    assert batch["token_type_ids"][0].tolist()[:5] == [0, 0, 0, 1, 1]
    order = batch_order([5, 1, 9, 3, 7, 2], 2, seed=0, epoch=0)
    assert sorted(np.concatenate(order).tolist()) == list(range(6))
    assert [o.tolist() for o in order] == [
        o.tolist() for o in batch_order([5, 1, 9, 3, 7, 2], 2, seed=0, epoch=0)
    ]


# ---- bad input --------------------------------------------------------------------------------


def _error(argv: list[str], capsys) -> str:
    assert cli.main(argv) == 2
    return capsys.readouterr().err


def test_bad_inputs_get_clear_messages(task_files, work, trained, tmp_path, capsys):
    base = ["finetune", "--model", str(work["start"]), "--output", str(tmp_path / "o"), *FAST]
    err = _error([*base, "--train", str(work["train"]), "--text_column", "review"], capsys)
    assert "no column 'review'" in err and "'text', 'label'" in err
    empty = tmp_path / "empty.csv"
    empty.write_text("text,label\n")
    assert "empty" in _error([*base, "--train", str(empty)], capsys)
    one_class = tmp_path / "one.csv"
    task_files.write_rows(one_class, [{"text": "a", "label": "x"}, {"text": "b", "label": "x"}])
    assert "single label" in _error(
        [*base, "--train", str(one_class), "--validation", str(one_class)], capsys
    )
    not_number = tmp_path / "nan.csv"
    task_files.write_rows(not_number, [{"text": "a", "label": "high"}])
    assert "not a number" in _error(
        [*base, "--train", str(not_number), "--task", "regression"], capsys
    )
    unknown = tmp_path / "unknown.csv"
    task_files.write_rows(
        unknown, [{"text": "a good one", "label": "pos"}, {"text": "so so", "label": "meh"}]
    )
    err = _error(["evaluate", "--model", str(trained), "--data", str(unknown)], capsys)
    assert f"{unknown}:3 has label 'meh'" in err and "'neg', 'pos'" in err
    assert "unknown file type" in _error([*base, "--train", str(tmp_path / "data.xlsx")], capsys)
    assert "max_position_embeddings" in _error(
        [*base, "--train", str(work["train"]), "--max_length", "100"], capsys
    )


def test_finetune_refuses_a_batch_larger_than_the_training_set(start, tmp_path, capsys):
    rng = random.Random(3)
    TaskFiles.write_rows(
        tmp_path / "t.csv", [{"text": noise(rng), "label": i % 2} for i in range(20)]
    )
    argv = ["finetune", "--model", str(start), "--train", str(tmp_path / "t.csv")]
    err = one_line_error(
        [*argv, "--output", str(tmp_path / "o"), "--batch_size", "1000000"], capsys
    )
    assert "--batch_size 1000000 is larger than the 18 training examples" in err
    assert not (tmp_path / "o").exists()


def test_empty_texts_and_labels_are_refused_naming_the_file_line(start, tmp_path, capsys):
    """Row numbers are the lines an editor shows, also after a text that spans lines."""
    rng = random.Random(4)
    rows = [{"text": noise(rng), "label": i % 2} for i in range(20)]
    rows[0]["text"] = "a text\nover two lines"  # quoted: one row, lines 2-3
    rows[5]["text"] = "  "
    TaskFiles.write_rows(tmp_path / "t.csv", rows)
    argv = ["finetune", "--model", str(start), "--train", str(tmp_path / "t.csv")]
    argv += ["--output", str(tmp_path / "o"), *QUICK_FINETUNE]
    err = one_line_error(argv, capsys)
    assert f"{tmp_path / 't.csv'}:8: empty 'text' (1 such row in" in err  # row 6 is on line 8
    rows[5]["text"], rows[7]["label"] = "fine again", ""
    TaskFiles.write_rows(tmp_path / "t.csv", rows)
    assert f"{tmp_path / 't.csv'}:10: empty 'label'" in one_line_error(argv, capsys)


# ---- the majority baseline and a finished run ----------------------------------------------------


def test_finetune_prints_the_baseline_and_warns_when_the_model_does_not_beat_it(pair_run, capsys):
    err = pair_run["err"]
    # the training split holds 2 classes, labelled 3 and 4: 1 and 2 are probably missing
    assert "warning: the training data holds 2 classes (3, 4)" in err
    # every validation line carries the baseline: always the training split's majority class
    assert "baseline 0.8000" in err.split("step 3: val")[1].splitlines()[0]
    assert "warning: accuracy" in err and "does not beat the baseline 0.8000" in err
    assert "always '4', the most frequent class of the training split" in err
    # 3 steps with --log_every 10: the last step is still logged, so curves.png has points
    assert [r["step"] for r in read_metrics(pair_run["out"]) if r["split"] == "train"] == [3]
    result = json.loads((pair_run["out"] / "eval_results.json").read_text())
    assert result["baseline"]["predicts"] == "4"
    assert result["baseline"]["definition"] == "the most frequent class of the training split"


def test_evaluate_uses_the_same_baseline_definition_as_finetune(pair_run, tmp_path, capsys):
    # an evaluation file whose own majority (3) differs from the training majority (4)
    rows = [{"title": "the film", "body": "a story", "label": 3 if i % 4 else 4} for i in range(8)]
    TaskFiles.write_rows(tmp_path / "eval.csv", rows)
    capsys.readouterr()
    code, out, err = run_cli(
        ["evaluate", "--model", str(pair_run["out"]), "--data", str(tmp_path / "eval.csv")], capsys
    )
    assert code == 0, err
    assert "baseline (always '4', the most frequent class of the training split)" in out


def test_a_finished_finetune_drops_its_checkpoint_and_prints_sizes(pair_run, capsys):
    out, err = pair_run["out"], pair_run["err"]
    assert not list(out.glob("checkpoint-*"))
    assert "removed the finished run's resumable checkpoint" in err
    assert "--keep_final_checkpoint" in err
    assert f"{out}: " in err and " MB" in err  # the output's size on disk
    code, _, err = run_cli(
        [*pair_run["argv"], "--output", str(out.parent / "kept"), "--keep_final_checkpoint"], capsys
    )
    assert code == 0 and len(list((out.parent / "kept").glob("checkpoint-*"))) == 1


def test_the_start_line_counts_in_words_one_step_not_1_steps(work, tmp_path, capsys):
    argv = finetune_argv(work, tmp_path / "one", "--max_steps", "1", "--num_threads", "1")
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    start = next(line for line in err.splitlines() if line.startswith("fine-tuning "))
    assert "1 step of batch" in start and "1 thread;" in start and "(2 outputs)" in start, start
    assert "(s)" not in start and " 1 steps" not in err, err


def test_a_budget_that_cut_the_schedule_says_so_in_the_last_line(work, tmp_path, capsys):
    """--max_time ended the run before its --epochs: the last line says how much of the
    schedule ran (a 3-minute MiniLM run did 22 of 171 steps and said so only in passing)."""
    out = tmp_path / "cut"
    argv = finetune_argv(work, out, "--epochs", "2", "--max_time", "0.001s", "--num_threads", "1")
    assert cli.main(argv) == 0
    *_, last, memory = capsys.readouterr().err.strip().splitlines()
    assert memory.startswith("peak memory: ")  # the CLI's own last word
    planned = json.loads((out / "eval_results.json").read_text())["planned_steps"]
    assert planned == 54  # 2 epochs of 27 batches of 16 (the 432 training rows)
    assert last.startswith(f"budget cut the schedule: ran 1 of {planned} steps (2%) in --max_time ")
    assert last.endswith(" at this pace"), last
    assert cli.main(finetune_argv(work, tmp_path / "whole", "--max_steps", "2")) == 0
    assert "budget cut" not in capsys.readouterr().err  # no budget, or the schedule finished
    cut = training.schedule_cut
    assert cut(22, 180.4, total_steps=171, budget=180.0, option="--max_time") == (
        "budget cut the schedule: ran 22 of 171 steps (13%) in --max_time 3m00s; all of them "
        "need about 23m22s at this pace"
    )
    assert cut(171, 170.0, total_steps=171, budget=180.0, option="--max_time") is None
    assert cut(22, 180.4, total_steps=None, budget=180.0, option="--max_time") is None
