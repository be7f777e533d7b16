"""``bertforge benchmark``: the GLUE metrics and baselines on the real dev files, the suite run
end to end in ``--smoke`` mode on a tiny model (results.json, results.md, the chart, a rerun that
skips finished work) and its one-line errors."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from pathlib import Path
from typing import get_args

import pytest
import torch

from bertforge import cli
from bertforge.data.suite_files import DATA_ENV, conll_sentences, data_directory, sample_file
from bertforge.data.tables import read_table
from bertforge.errors import BertforgeError
from bertforge.evaluation import benchmark as B
from bertforge.evaluation.benchmark_report import average_label, lr_grid_note
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForPreTraining
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.benchmark import BenchmarkConfig, task_settings
from bertforge.training.config import Task

GLUE_NAMES = ["CoLA", "SST-2", "MRPC", "STS-B", "RTE"]


def labels(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        return [row["label"] for row in csv.DictReader(f, delimiter="\t")]


# ---- pure parts -----------------------------------------------------------------------------


def test_sequence_scores_by_hand():
    truth = ["1", "1", "1", "0", "0", "0"]
    predicted = ["1", "1", "0", "1", "0", "0"]
    scores = B.sequence_scores(truth, predicted, regression=False, positive="1")
    assert scores["accuracy"] == pytest.approx(4 / 6)
    assert scores["f1"] == pytest.approx(2 / 3)  # precision 2/3, recall 2/3
    assert scores["mcc"] == pytest.approx(1 / 3)  # (TP*TN - FP*FN) / sqrt(3^4) = (4 - 1) / 9
    # never predicting the positive label: its F1 is 0, MCC of a constant predictor is 0
    constant = B.sequence_scores(truth, ["0"] * 6, regression=False, positive="1")
    assert constant["f1"] == 0.0 and constant["mcc"] == 0.0 and constant["accuracy"] == 0.5
    reg = B.sequence_scores([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0], regression=True)
    assert reg["pearson"] == pytest.approx(0.8) and reg["spearman"] == pytest.approx(0.8)
    # a constant prediction correlates with nothing, also when its mean rounds (it did: -8e-19)
    flat = B.sequence_scores([1.0, 2.0, 3.5], [2.7009990253653497] * 3, regression=True)
    assert flat == {"pearson": 0.0, "spearman": 0.0}


def test_constant_baselines_on_the_real_dev_files(shared_data):
    glue = shared_data / "glue"
    mrpc = B.select_tasks("glue", ["mrpc"])[0]
    base = B.constant_baseline(labels(glue / "MRPC/train.tsv"), labels(glue / "MRPC/dev.tsv"), mrpc)
    # train: 2,474 paraphrases of 3,668; dev: 279 of 408 (the data README's counts)
    assert base["predicts"] == "1"
    assert base["scores"]["accuracy"] == pytest.approx(279 / 408)
    assert base["scores"]["f1"] == pytest.approx(2 * 279 / (279 + 408))
    stsb = B.select_tasks("glue", ["STS-B"])[0]
    base = B.constant_baseline(
        labels(glue / "STS-B/train.tsv"), labels(glue / "STS-B/dev.tsv"), stsb
    )
    assert 2.0 < base["predicts"] < 3.0 and base["scores"] == {"pearson": 0.0, "spearman": 0.0}


def test_medians_scores_and_averages():
    runs = [
        {"f1": 0.8, "accuracy": 0.7},
        {"f1": 0.6, "accuracy": 0.9},
        {"f1": 0.7, "accuracy": 0.1},
    ]
    assert B.median_scores(runs, ["f1", "accuracy"]) == {"f1": 0.7, "accuracy": 0.7}
    assert B.median_scores(runs[:2], ["f1"]) == {"f1": pytest.approx(0.7)}
    mrpc = B.select_tasks("glue", ["MRPC"])[0]
    assert B.task_score({"f1": 0.8, "accuracy": 0.6}, mrpc) == pytest.approx(0.7)
    assert B.suite_average({"a": 0.5, "b": 0.7}) == pytest.approx(0.6)
    assert B.suite_average({"a": 0.5, "b": None}) is None
    # Google's BERT-Tiny over our five tasks: (0 + 83.2 + 76.1 + 73.95 + 57.2) / 5
    tiny = {s.name: B.task_score(B.published_scores(s)["BERT-Tiny"], s) for s in B.SUITES["glue"]}
    assert B.suite_average(tiny) == pytest.approx((0 + 0.832 + 0.761 + 0.7395 + 0.572) / 5)


def test_task_settings_defaults_overrides_budget_and_smoke():
    cola, sst2 = B.select_tasks("glue", ["CoLA", "SST-2"])
    cfg = BenchmarkConfig(model="m", output="o", task_budget="6m", lr=[1e-4])
    settings = task_settings(cfg, cola)
    assert (settings["epochs"], settings["lr"], settings["batch_size"]) == (3.0, 1e-4, 32)
    assert settings["seeds"] == 3 and settings["max_time_per_seed"] == 120.0
    assert task_settings(cfg, sst2)["seeds"] == 1  # SST-2: one seed, the whole budget
    assert task_settings(cfg, sst2)["max_time_per_seed"] == 360.0
    smoke = task_settings(BenchmarkConfig(model="m", output="o", smoke=True, seeds=5), cola)
    assert smoke["seeds"] == 1 and smoke["max_steps"] == 2 and smoke["eval_rows"] == 48
    with pytest.raises(BertforgeError, match="--tasks MNLI: not a task of --suite glue"):
        BenchmarkConfig(model="m", output="o", tasks=["MNLI"])
    with pytest.raises(BertforgeError, match="--seeds 0 must be at least 1"):
        BenchmarkConfig(model="m", output="o", seeds=0)


def test_the_seed_line_says_what_runs_and_a_model_folder_is_named_by_its_run(tmp_path):
    from bertforge.training.benchmark import default_name, training_plan

    cola = B.select_tasks("glue", ["CoLA"])[0]
    smoke = task_settings(BenchmarkConfig(model="m", output="o", smoke=True), cola)
    assert training_plan(smoke) == "2 steps, lr 5e-05, batch 8, length 64"  # not "epochs 3"
    full = task_settings(BenchmarkConfig(model="m", output="o"), cola)
    assert training_plan(full).startswith("3 epochs, lr ")
    timed = task_settings(BenchmarkConfig(model="m", output="o", task_budget="6m"), cola)
    assert training_plan(timed).startswith("3 epochs or 2m00s, lr ")
    run = tmp_path / "runs" / "pt-mini" / "model"
    run.mkdir(parents=True)
    assert default_name(str(run)) == "pt-mini"  # a pretraining run's model/: the run's name
    assert default_name(str(run) + "/") == "pt-mini"
    assert default_name(str(tmp_path / "runs" / "pt-mini")) == "pt-mini"


def test_the_average_column_says_what_it_averages():
    assert average_label("glue", 5) == "average"
    assert average_label("glue", 2) == "average (2 of 5 tasks)"
    assert average_label("glue", 1) is None


def test_task_names_and_suites():
    assert [s.name for s in B.select_tasks("glue", None)] == GLUE_NAMES
    assert [s.name for s in B.select_tasks("glue", ["rte,sst2", "cola"])] == [
        "CoLA",
        "SST-2",
        "RTE",
    ]
    with pytest.raises(ValueError, match="--tasks QNLI: not a task of --suite glue; choose from"):
        B.select_tasks("glue", ["QNLI"])
    # every suite's tasks are fine-tuning tasks bertforge finetune offers
    kinds = {spec.kind for suite in B.SUITES.values() for spec in suite}
    assert kinds == {"classification", "regression", "token_classification", "question_answering"}
    assert kinds <= set(get_args(Task))


# ---- the command end to end -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_glue_model(shared_data, tmp_path_factory) -> Path:
    """A tiny randomly initialised BERT with a WordPiece vocabulary trained on GLUE dev text."""
    return tiny_model(shared_data, tmp_path_factory.mktemp("benchmark"), positions=64)


@pytest.fixture(scope="module")
def tiny_qa_model(shared_data, tmp_path_factory) -> Path:
    """The same with room for --smoke's question-answering windows."""
    return tiny_model(shared_data, tmp_path_factory.mktemp("benchmark-qa"), positions=256)


def tiny_model(shared_data: Path, root: Path, positions: int) -> Path:
    text = []
    for task in ("CoLA", "MRPC", "RTE"):
        with open(shared_data / "glue" / task / "dev.tsv", encoding="utf-8", newline="") as f:
            text += [" ".join(row[:-1]) for row in list(csv.reader(f, delimiter="\t"))[1:]]
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(text[:1500]) + "\n", encoding="utf-8")
    tokenizer = Tokenizer.train(corpus, vocab_size=400, min_frequency=1)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=positions,
    )
    torch.manual_seed(0)
    return BertForPreTraining(config).save_pretrained(root / "tiny", tokenizer=tokenizer)


def bench(model: Path, output: Path, *options: str) -> list[str]:
    argv = ["benchmark", "--model", str(model), "--output", str(output), "--num_threads", "1"]
    return [*argv, "--precision", "fp32", *options]


@pytest.mark.slow
def test_glue_smoke_end_to_end_and_rerun(tiny_glue_model, shared_data, tmp_path, capsys):
    out = tmp_path / "bench"
    glue = str(shared_data / "glue")
    argv = bench(tiny_glue_model, out, "--smoke", "--baseline", "--data_dir", glue)
    assert cli.main(argv) == 0
    first = capsys.readouterr()
    assert "== task 5/5: RTE" in first.err and "[MRPC] random_init seed 1/1: F1" in first.err
    # stdout, where the table is read, says it is a smoke run
    assert first.out.rstrip().endswith("A --smoke run: 48 examples per file and 2 steps; its "
                                       "numbers mean nothing.")  # fmt: skip

    result = json.loads((out / "results.json").read_text())
    assert list(result["tasks"]) == GLUE_NAMES and result["smoke"] is True
    for name, entry in result["tasks"].items():
        spec = B.select_tasks("glue", [name])[0]
        assert entry["split"] == "dev" and entry["metrics"] == list(spec.metrics)
        assert entry["examples"] == 48  # --smoke scores 48 rows of each dev file
        for column in ("model", "random_init"):
            res = entry[column]
            assert list(res["scores"]) == list(spec.metrics)
            assert all(-1.0 <= v <= 1.0 for v in res["scores"].values())
            assert [s["seed"] for s in res["seeds"]] == [0] and res["seeds"][0]["steps"] == 2
            assert res["score"] == pytest.approx(B.task_score(res["scores"], spec))
        assert entry["constant"]["definition"].startswith("the m")
        assert entry["published"]["BERT-Tiny"] == B.published_scores(spec)["BERT-Tiny"]
    assert result["tasks"]["SST-2"]["published"]["BERT-Mini"] == {"accuracy": 0.859}
    assert [r["published"] for r in result["rows"]] == [False] * 3 + [True] * 4
    labels_ = [r["label"] for r in result["rows"]]
    assert labels_[:3] == ["tiny", "random twin", "constant baseline"]
    assert labels_[3:] == [f"BERT-{s} (test)*" for s in ("Tiny", "Mini", "Small", "Medium")]
    model_row = result["rows"][0]
    assert model_row["average"] == pytest.approx(
        sum(result["tasks"][t]["model"]["score"] for t in GLUE_NAMES) / 5
    )

    md = (out / "results.md").read_text()
    assert "| model | CoLA (MCC, dev) | SST-2 (acc, dev) | MRPC (F1/acc, dev) |" in md
    assert "| BERT-Small (test)* | 27.8 | 89.7 | 83.4/76.2 | 78.8/77.0 | 61.8 | 67.4 |" in md
    assert "GLUE *test*-set numbers; ours are dev" in md and "--smoke run" in md
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "runs/model/CoLA/seed-0/model.safetensors").exists()  # scored, dropped

    # a rerun trains nothing: every task of both columns is read back
    shutil.rmtree(out / "runs")
    assert cli.main(argv) == 0
    again = capsys.readouterr()
    assert again.err.count("done before") == 10 and "fine-tuning" not in again.err
    assert not (out / "runs").exists()
    assert json.loads((out / "results.json").read_text())["rows"] == result["rows"]

    # another random twin is another column: its old results are refused, not mixed in
    assert cli.main([*argv, "--init_seed", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "random_init/CoLA.json holds a result of other settings (init_seed was 0, now 1)" in err

    # a finished seed of other settings is not silently mixed in
    (out / "results/model/CoLA.json").unlink()
    argv_lr = bench(tiny_glue_model, out, "--smoke", "--data_dir", glue, "--lr", "1e-3")
    assert cli.main(argv_lr) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "seed-0.json holds a result of other settings (lr was 5e-05, now 0.001)" in err


def test_one_line_errors(tiny_glue_model, shared_data, tmp_path, capsys, monkeypatch):
    glue = str(shared_data / "glue")
    monkeypatch.delenv("BERTFORGE_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # no ../shared/data/glue from here
    cases = [
        (["--tasks", "QNLI", "--data_dir", glue], "--tasks QNLI: not a task of --suite glue"),
        ([], "--data_dir ../shared/data/glue (the default): no such directory"),
        (["--data_dir", str(tmp_path / "nowhere")], "nowhere (--data_dir): no such directory"),
        (["--suite", "nope"], "--suite"),
    ]
    partial = tmp_path / "glue"
    shutil.copytree(Path(glue) / "CoLA", partial / "CoLA")
    cases.append((["--data_dir", str(partial)], "no SST-2/train.tsv.gz (the training file)"))
    for options, message in cases:
        assert cli.main(bench(tiny_glue_model, tmp_path / "out", *options)) == 2, options
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and message in err, (options, err)
    assert not (tmp_path / "out" / "runs").exists()


def test_samples_keep_each_layout(shared_data, tmp_path):
    table = sample_file(shared_data / "glue/SST-2/train.tsv.gz", 10, tmp_path, "train")
    header, rows = read_table(table)
    assert table.name == "train.tsv" and header == ["sentence", "label"] and len(rows) == 10
    assert (
        sample_file(shared_data / "glue/SST-2/train.tsv.gz", 10, tmp_path, "again").read_text()
        == table.read_text()
    )

    conll = sample_file(shared_data / "ner/wnut17/train.conll", 5, tmp_path, "train")
    blocks = conll.read_text(encoding="utf-8").strip("\n").split("\n\n")
    source = (shared_data / "ner/wnut17/train.conll").read_text(encoding="utf-8")
    assert conll.name == "train.conll" and len(blocks) == 5
    assert all(block + "\n\n" in source for block in blocks)

    # a training sample is given a sentence for every tag of the scored sample it lacks
    test = sample_file(shared_data / "ner/wnut17/test.conll", 48, tmp_path, "eval")
    covered = sample_file(shared_data / "ner/wnut17/train.conll", 5, tmp_path, "t", cover=test)
    tags = {line.split()[-1] for b in conll_sentences(covered) for line in b}
    assert tags >= {line.split()[-1] for b in conll_sentences(test) for line in b}
    assert 5 < len(conll_sentences(covered)) < 5 + len(tags)

    squad = sample_file(shared_data / "qa/xquad_en_test.json.gz", 7, tmp_path, "test")
    data = json.loads(squad.read_text(encoding="utf-8"))["data"]
    full = json.loads(gzip.decompress((shared_data / "qa/xquad_en_test.json.gz").read_bytes()))
    contexts = {p["context"] for a in full["data"] for p in a["paragraphs"]}
    kept = [(p["context"], qa) for a in data for p in a["paragraphs"] for qa in p["qas"]]
    assert squad.name == "test.json" and len(kept) == 7
    assert all(
        c in contexts and c[qa["answers"][0]["answer_start"] :].startswith(qa["answers"][0]["text"])
        for c, qa in kept
    )


def test_data_directory_from_the_environment(tmp_path, monkeypatch):
    (tmp_path / "glue").mkdir()
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    assert data_directory(None, "glue", "CoLA/train.tsv") == tmp_path / "glue"
    with pytest.raises(BertforgeError, match=r"/qa \(\$BERTFORGE_DATA/qa\): no such directory"):
        data_directory(None, "qa", "squad_dev_train.json.gz")


def test_ner_smoke_end_to_end(tiny_glue_model, shared_data, tmp_path):
    out = tmp_path / "ner"
    argv = bench(tiny_glue_model, out, "--suite", "ner", "--smoke")
    assert cli.main([*argv, "--data_dir", str(shared_data / "ner")]) == 0
    result = json.loads((out / "results.json").read_text())
    assert list(result["tasks"]) == ["WikiANN-en", "WNUT-17"]
    for entry in result["tasks"].values():
        assert entry["split"] == "test" and entry["metrics"] == ["entity_f1"]
        assert 0.0 <= entry["model"]["scores"]["entity_f1"] <= 1.0
        assert entry["constant"]["label"] == "baseline" and entry["published"] == {}
        assert entry["constant"]["scores"] == {"entity_f1": 0.0}  # no entity found
    assert [r["label"] for r in result["rows"]] == ["tiny", "baseline"]
    md = (out / "results.md").read_text()
    assert "| model | WikiANN-en (entity F1, test) | WNUT-17 (entity F1, test) | average |" in md


def test_qa_smoke_end_to_end(tiny_qa_model, shared_data, tmp_path):
    out = tmp_path / "qa"
    argv = bench(tiny_qa_model, out, "--suite", "qa", "--smoke")
    assert cli.main([*argv, "--data_dir", str(shared_data / "qa")]) == 0
    result = json.loads((out / "results.json").read_text())
    assert list(result["tasks"]) == ["XQuAD-en"]
    entry = result["tasks"]["XQuAD-en"]
    assert entry["split"] == "test" and entry["metrics"] == ["exact_match", "f1"]
    scores = entry["model"]["scores"]
    assert 0.0 <= scores["exact_match"] <= scores["f1"] <= 1.0
    md = (out / "results.md").read_text()
    assert "| model | XQuAD-en (EM/F1, test) |" in md


def test_more_seeds_extend_a_finished_task(tmp_path, monkeypatch):
    # --seeds 3 after --seeds 1: seed 0 is read back, seeds 1 and 2 run, the median is of all
    # three; it stopped with "holds a result of other settings (seeds was 1, now 3)" before
    import bertforge.training.benchmark as TB

    trained = []

    def fake_seed(cfg, spec, model_dir, files, run_dir, seed, settings):
        trained.append(seed)
        scores = {"accuracy": 0.5 + seed / 10}
        return {"seed": seed, "scores": scores, "examples": 9, "steps": 3, "epochs": 1.0,
                "train_seconds": 1.0}  # fmt: skip

    monkeypatch.setattr(TB, "run_seed", fake_seed)
    spec = B.select_tasks("glue", ["RTE"])[0]

    def task(seeds: int, **more) -> dict:
        cfg = BenchmarkConfig(model="m", output=str(tmp_path), seeds=seeds, **more)
        return TB.run_task(cfg, spec, "model", "m", (tmp_path, tmp_path), lambda _: None)

    assert task(1)["scores"] == {"accuracy": 0.5} and trained == [0]
    three = task(3)
    assert trained == [0, 1, 2] and [s["seed"] for s in three["seeds"]] == [0, 1, 2]
    assert three["scores"] == {"accuracy": pytest.approx(0.6)}  # the median of 0.5, 0.6, 0.7
    assert task(3) == three and trained == [0, 1, 2]  # done: nothing runs again
    assert task(2)["scores"] == {"accuracy": pytest.approx(0.55)} and trained == [0, 1, 2]
    with pytest.raises(BertforgeError, match=r"RTE.json holds a result of other settings \(lr"):
        task(2, lr=[1e-3])  # other settings than the seed count stay an error

    # a learning-rate grid: every value with every seed, each in its own folder; the best wins
    def by_lr(cfg, spec, model_dir, files, run_dir, seed, settings):
        score = {3e-4: 0.6, 1e-4: 0.7, 5e-5: 0.7}[settings["lr"]] + seed / 100
        return {"seed": seed, "scores": {"accuracy": score}, "examples": 9, "steps": 3,
                "epochs": 1.0, "train_seconds": 1.0}  # fmt: skip

    monkeypatch.setattr(TB, "run_seed", by_lr)
    said: list[str] = []
    cfg = BenchmarkConfig(model="m", output=str(tmp_path / "grid"), seeds=3, lr=[3e-4, 1e-4, 5e-5])
    best = TB.run_grid(cfg, spec, "model", "m", (tmp_path, tmp_path), said.append)
    assert best["settings"]["lr"] == 1e-4  # 1e-4 and 5e-5 tie: the first given wins
    assert best["grid"] == pytest.approx({"0.0003": 0.61, "0.0001": 0.71, "5e-05": 0.71})
    assert sorted(p.name for p in (tmp_path / "grid/results/model").iterdir()) == [
        "lr-0.0001", "lr-0.0003", "lr-5e-05"
    ]  # fmt: skip
    assert "best lr 0.0001 of 0.0003 (61.0), 0.0001 (71.0), 5e-05 (71.0)" in said[-1]
    note = lr_grid_note({"RTE": {"model": best}}, "ours")
    assert note is not None and "grid 0.0003, 0.0001, 5e-05" in note and "RTE ours 0.0001" in note
    with pytest.raises(BertforgeError, match="--lr -0.001: a learning rate must be > 0"):
        BenchmarkConfig(model="m", output="o", lr=[1e-4, -1e-3])


def test_ner_and_qa_charts_say_what_they_show(tmp_path, monkeypatch):
    import bertforge.evaluation.benchmark_report as R
    from bertforge.evaluation.benchmark_report import table_rows
    from bertforge.evaluation.plots import bar_value

    drawn = {}
    monkeypatch.setattr(R, "plot_grouped_bars", lambda bars, cats, out, **kw: drawn.update(
        bars=bars, categories=cats, **kw))  # fmt: skip
    spec = B.select_tasks("qa", None)[0]
    base = {"label": "baseline", "predicts": "the first 3 word(s) of the context",
            "definition": "whatever the question", "scores": {"exact_match": 0.0, "f1": 0.027}}  # fmt: skip
    entry = {"metrics": ["exact_match", "f1"], "split": "test", "published": {},
             "model": {"scores": {"exact_match": 0.0, "f1": 0.041}, "train_seconds": 2.0,
                       "seeds": [{"scores": {"exact_match": 0.0, "f1": 0.041}, "steps": 2,
                                  "epochs": 0.3}]},
             "constant": base}  # fmt: skip
    tasks = {spec.name: entry}
    result = {"suite": "qa", "name": "pt-tiny", "smoke": True, "tasks": tasks,
              "rows": table_rows("qa", "pt-tiny", tasks), "published_source": None}  # fmt: skip
    R.write_report(tmp_path, result)
    assert "GLUE" not in drawn["title"] and "smoke" in drawn["title"]
    assert drawn["categories"] == ["XQuAD-en\n(mean of\nEM, F1)"]  # the bar is their mean: say so
    assert list(drawn["bars"]) == ["pt-tiny", "baseline"]
    md = (tmp_path / "results.md").read_text()
    assert "| baseline | 0.0/2.7 |" in md and "baseline predicts the first 3 word(s)" in md
    assert [bar_value(v) for v in (2.8, 0.26, 0.0, 25.4)] == ["2.8", "0.3", "0.0", "25"]


# ---- the curve: scores against pretraining minutes (--curve) ---------------------------------


def glue_result(name: str, model: Path, scores: dict, twin: dict | None = None) -> dict:
    """A finished GLUE benchmark's results.json as ``bertforge benchmark`` writes it (the keys
    the curve reads): ``scores`` and ``twin`` give each task's metrics, as fractions."""
    tasks = {}
    for spec in B.GLUE:
        entry = {"metrics": list(spec.metrics), "split": "dev",
                 "published": B.published_scores(spec),
                 "model": {"scores": dict(zip(spec.metrics, scores[spec.name], strict=True))}}  # fmt: skip
        if twin is not None:
            entry["random_init"] = {"scores": dict(zip(spec.metrics, twin[spec.name], strict=True))}
        tasks[spec.name] = entry
    return {"suite": "glue", "model": str(model), "name": name, "smoke": False, "tasks": tasks,
            "published_source": B.GOOGLE_SOURCE}  # fmt: skip


def write_results(directory: Path, result: dict) -> str:
    directory.mkdir(parents=True)
    (directory / "results.json").write_text(json.dumps(result))
    return str(directory)


def test_the_curve_draws_glue_scores_against_pretraining_minutes(tmp_path, capsys):
    from bertforge.training.benchmark import default_name

    run = tmp_path / "pt"
    run.mkdir()
    (run / "pretrain_config.yaml").write_text("train:\n  max_time: 30m\n  max_steps: null\n")
    # fractions; MRPC (F1, acc) and STS-B (Pearson, Spearman) score as the mean of the two
    early = {
        "CoLA": [0.10],
        "SST-2": [0.80],
        "MRPC": [0.80, 0.70],
        "STS-B": [0.50, 0.70],
        "RTE": [0.55],
    }  # task scores .10 .80 .75 .60 .55: average 56.0
    final = {
        "CoLA": [0.20],
        "SST-2": [0.84],
        "MRPC": [0.82, 0.74],
        "STS-B": [0.70, 0.72],
        "RTE": [0.58],
    }  # .20 .84 .78 .71 .58: average 62.2
    twin = {
        "CoLA": [0.0],
        "SST-2": [0.50],
        "MRPC": [0.81, 0.68],
        "STS-B": [0.10, 0.20],
        "RTE": [0.50],
    }  # .0 .50 .745 .15 .50: average 37.9
    snapshot = run / "snapshots" / "model-15m"
    a = write_results(tmp_path / "bench-15m", glue_result("pt at 15m", snapshot, early, twin))
    b = write_results(tmp_path / "bench-final", glue_result("pt", run / "model", final))
    assert default_name(str(snapshot)) == "pt at 15m"

    out = tmp_path / "curve"
    assert cli.main(["benchmark", "--curve", b, a, "--output", str(out)]) == 0
    md = (out / "curve.md").read_text()
    assert md.startswith("# What pretraining time buys on GLUE: pt\n")  # the run, not its models
    assert "| pretraining minutes | model | GLUE-5 average | STS-B | SST-2 | benchmark |" in md
    assert f"| 0 | random twin | 37.9 | 15.0 | 50.0 | {a} |" in md  # the twin at minute 0
    assert f"| 15 | pt at 15m | 56.0 | 60.0 | 80.0 | {a} |" in md  # the snapshot's name: 15
    assert f"| 30 | pt | 62.2 | 71.0 | 84.0 | {b} |" in md  # the run's --train.max_time: 30
    assert md.index("| 15 |") < md.index("| 30 |")  # by minutes, whatever the order given
    tiny = next(line for line in md.splitlines() if line.startswith("| – | BERT-Tiny"))
    mini = next(line for line in md.splitlines() if line.startswith("| – | BERT-Mini"))
    assert "| 58.1 |" in tiny and "| 58.9 |" in mini and mini.endswith("| 85.9 | published |")
    assert "GLUE *test*-set numbers; ours are dev" in md
    curve = json.loads((out / "curve.json").read_text())
    assert [p["minutes"] for p in curve["points"]] == [15.0, 30.0]
    assert curve["points"][0]["scores"]["GLUE-5 average"] == pytest.approx(0.56)
    assert curve["random_twins"]["pt"]["scores"]["STS-B"] == pytest.approx(0.15)
    assert curve["references"]["BERT-Mini"]["SST-2"] == pytest.approx(0.859)
    png = (out / "curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000

    # minutes given: they override what the runs say
    c = write_results(tmp_path / "bench-other", glue_result("other", tmp_path / "other", final))
    argv = ["benchmark", "--curve", a, c, "--output", str(tmp_path / "c2")]
    assert cli.main([*argv, "--curve_minutes", "5", "120", "--name", "two runs"]) == 0
    md = (tmp_path / "c2" / "curve.md").read_text()
    assert "| 120 | other | 62.2 |" in md and md.startswith(
        "# What pretraining time buys on GLUE: two runs"
    )
    capsys.readouterr()

    # two runs: a line each (a run's points by minutes, the runs in the order given); the same
    # minute twice is fine across runs, not within one
    run2 = tmp_path / "pt2"
    snap2 = run2 / "snapshots" / "model-30m"
    d = write_results(tmp_path / "bench2-30m", glue_result("pt2 at 30m", snap2, early))
    e = write_results(
        tmp_path / "bench2-15m", glue_result("pt2 at 15m", run2 / "snapshots" / "model-15m", twin)
    )
    out = tmp_path / "c3"
    assert cli.main(["benchmark", "--curve", a, b, d, e, "--output", str(out)]) == 0
    curve = json.loads((out / "curve.json").read_text())
    assert [(p["run"], p["minutes"]) for p in curve["points"]] == [
        (str(run), 15.0),
        (str(run), 30.0),
        (str(run2), 15.0),
        (str(run2), 30.0),
    ]
    md = (out / "curve.md").read_text()
    assert md.startswith("# What pretraining time buys on GLUE: pt, pt2\n")
    png = (out / "curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    # two runs both named "run" by default (the recipes' RUN/run layout): two lines, each named
    # by its path
    same = [
        write_results(tmp_path / f"bench-{r}", glue_result("run at 15m", snap, early))
        for r, snap in [("r1", tmp_path / "a" / "run"), ("r2", tmp_path / "b" / "run")]
        for snap in [snap / "snapshots" / "model-15m"]
    ]
    out = tmp_path / "c4"
    assert cli.main(["benchmark", "--curve", *same, "--output", str(out)]) == 0
    title = (out / "curve.md").read_text().splitlines()[0]
    assert title == "# What pretraining time buys on GLUE: a/run, b/run"
    a2 = write_results(tmp_path / "bench-15m-again", glue_result("pt at 15m", snapshot, final))
    capsys.readouterr()

    # one line each, naming the fix
    other_suite = write_results(tmp_path / "bench-ner", {"suite": "ner", "tasks": {}})
    cases = [
        (argv, "its pretraining minutes are unknown; give them with --curve_minutes"),
        ([*argv, "--curve_minutes", "5"], "--curve_minutes gives 1 values for 2 --curve"),
        (
            ["benchmark", "--curve", a, a2, "--output", "o"],
            "both score a model of 15 minutes of one run",
        ),
        ([*argv, "--model", b], "--curve draws finished benchmarks, --model"),
        ([*argv, "--baseline"], "--baseline: an option of the benchmark run, and --curve runs"),
        (["benchmark", "--curve", other_suite, "--output", "o"], "a benchmark of --suite ner"),
        (["benchmark", "--curve", str(tmp_path), "--output", "o"], "no results.json there"),
        (["benchmark", "--curve_minutes", "5", "--output", "o"], "give them with --curve"),
        (["benchmark", "--output", "o"], "--model DIR: which model to benchmark (or --curve"),
    ]
    for options, message in cases:
        assert cli.main(options) == 2, options
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and message in err, (options, err)


def test_the_charts_legend_leaves_the_task_labels_readable():
    from bertforge.evaluation.benchmark_report import category_label
    from bertforge.evaluation.plots import grouped_bars_figure

    # GLUE's chart: seven rows, and labels of three lines ("STS-B\n(mean of\nPearson, Spearman)")
    categories = [category_label(s.name, s.metrics) for s in B.GLUE] + ["average"]
    rows = ["ours", "random twin", "constant baseline"] + [f"BERT-{s} (test)*" for s in "ABCD"]
    bars = {row: {c: 50.0 + i for c in categories} for i, row in enumerate(rows)}
    fig = grouped_bars_figure(bars, categories, title="t", hatched=tuple(rows[3:]))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    labels = [t.get_window_extent(renderer) for t in fig.axes[0].get_xticklabels()]
    assert len(labels) == 6 and all(t.height > 0 for t in labels)
    covered = [t.get_text() for t, box in zip(fig.axes[0].get_xticklabels(), labels, strict=True)
               if box.overlaps(legend)]  # fmt: skip
    assert covered == [] and legend.y1 < min(box.y0 for box in labels)


def test_each_line_of_the_curve_starts_at_its_own_runs_twin(tmp_path, monkeypatch):
    from bertforge.evaluation import plots
    from bertforge.training.benchmark_curve import distinct_tails

    assert distinct_tails(["x/a/run", "x/b/run", "c/run"]) == ["a/run", "b/run", "c/run"]
    assert distinct_tails(["p/run", "q/run/run"]) == ["p/run", "run/run"]
    scores = {"CoLA": [0.2], "SST-2": [0.8], "MRPC": [0.8, 0.7], "STS-B": [0.6, 0.6], "RTE": [0.6]}

    def scaled(by: float) -> dict:
        return {task: [by * v for v in values] for task, values in scores.items()}

    # three recipes' runs, all .../run (so all named "run"); a's and b's twins differ (another
    # tokenizer and config), c was benchmarked without --baseline
    benches = []
    for run, twin, at in (("x/a/run", scaled(0.5), 0.9), ("x/b/run", scaled(0.3), 1.0),
                          ("c/run", None, 0.8)):  # fmt: skip
        model = tmp_path / run / "snapshots" / "model-15m"
        result = glue_result("run at 15m", model, scaled(at), twin)
        benches.append(write_results(tmp_path / "bench" / run, result))
    drawn = {}
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, output: drawn.update(
        {ax.get_title(): ax for ax in fig.axes}) or save(fig, output))  # fmt: skip
    out = tmp_path / "curve"
    assert cli.main(["benchmark", "--curve", *benches, "--output", str(out)]) == 0
    curve = json.loads((out / "curve.json").read_text())
    assert list(curve["lines"]) == ["a/run", "b/run", "c/run"]
    twins = curve["random_twins"]
    assert list(twins) == ["a/run", "b/run"] and twins["b/run"]["results"] == benches[1]
    md = (out / "curve.md").read_text()
    for line, bench in (("a/run", benches[0]), ("b/run", benches[1])):
        assert f"| 0 | random twin of {line} |" in md and f"| 15 | {line} at 15m |" in md
        assert f"The random twin of {line} (minute 0) is the one benchmarked in {bench}." in md
    assert "| 15 | c/run at 15m |" in md and "c/run has no random twin" in md
    assert md.startswith("# What pretraining time buys on GLUE: a/run, b/run, c/run\n")
    # in the picture: each line's dotted start joins its own twin to its first point
    average = drawn["GLUE-5 average"]
    dotted = sorted(
        (round(line.get_ydata()[0], 3), round(line.get_ydata()[1], 3))
        for line in average.lines
        if line.get_linestyle() == ":" and list(line.get_xdata()) == [0.0, 15.0]
    )  # fmt: skip
    first = {p["results"]: p["scores"]["GLUE-5 average"] for p in curve["points"]}
    own = sorted(
        (round(100 * twins[name]["scores"]["GLUE-5 average"], 3), round(100 * first[bench], 3))
        for name, bench in (("a/run", benches[0]), ("b/run", benches[1]))
    )
    assert dotted == own and len({twin for twin, _ in own}) == 2
    legend = [text.get_text() for text in average.figure.legends[0].get_texts()]
    assert "a/run: random twin: not pretrained, minute 0 (dev)" in legend
    assert "b/run: after N minutes (dev)" in legend and "c/run: after N minutes (dev)" in legend
