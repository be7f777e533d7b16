"""Every recipe's ``--smoke`` variant end to end (a tiny model on a slice of the real data, a few
steps), so none of them rots: the commands run, results.json and results.md are written, and a
rerun skips the finished steps."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from bertforge.cli import main as cli_main
from bertforge.data.dataset import PretrainingDataset
from bertforge.data.shards import PrepareConfig, prepare
from bertforge.recipes import RECIPES
from bertforge.recipes.report import downstream_table, mlm_table, summary
from bertforge.recipes.runner import fixed_split, sample, unigram_baseline
from bertforge.tokenizer.wordpiece import Tokenizer


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run_smoke(name: str, shared_data: Path, output: Path, capsys, *options: str) -> dict:
    argv = ["recipe", name, "--smoke", "--data", str(shared_data), "--output", str(output)]
    argv += options
    assert cli_main(argv) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    results = json.loads((output / "results.json").read_text())
    assert results["smoke"] is True and results["commands"]
    assert all(c["command"].startswith("bertforge ") for c in results["commands"])
    markdown = (output / "results.md").read_text()
    assert markdown in captured.out
    title, settings = markdown.splitlines()[0], markdown.splitlines()[2]
    assert title == f"# bertforge recipe {name} --smoke"
    assert settings.startswith(f"{date.today().isoformat()}; smoke run: a tiny model")
    return results


def finite_mlm(results: dict, split: str, columns: tuple[str, ...]) -> None:
    table = results["mlm"]["eval"][split]
    for column in columns:
        assert math.isfinite(table[column]["loss"]) and table[column]["tokens"] > 0, column


@pytest.mark.slow
def test_reviews_adapted_smoke(shared_data, tmp_path, capsys):
    results = run_smoke("reviews-adapted", shared_data, tmp_path / "r", capsys)
    finite_mlm(results, "val", ("random_init", "start", "final"))
    finite_mlm(results, "val:data-wikitext2", ("random_init", "start", "final"))
    assert len(results["fill_mask"]) == 5
    assert all(len(v["adapted"]) == 5 for v in results["fill_mask"].values())
    assert (
        "I really really [MASK] this show!"
        in (tmp_path / "r" / "adapt-smoke" / "fill-mask.txt").read_text()
    )
    for task in ("imdb", "agnews"):
        for model in ("adapted-smoke", "minilm"):
            assert 0.0 <= results["downstream"][task][model]["mean"]["accuracy"] <= 1.0
    # a rerun skips every finished step
    assert (
        cli_main(
            [
                "recipe",
                "reviews-adapted",
                "--smoke",
                "--data",
                str(shared_data),
                "--output",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )
    assert "== (done) bertforge pretrain" in capsys.readouterr().err
    assert json.loads((tmp_path / "r" / "results.json").read_text())["commands"] == []


def test_review_scores_smoke(shared_data, tmp_path, capsys):
    results = run_smoke("review-scores", shared_data, tmp_path / "r", capsys)
    finite_mlm(results, "val", ("random_init", "start", "final"))
    scores = results["downstream"]["metacritic"]
    for model in ("adapted", "minilm"):
        assert math.isfinite(scores[model]["mean"]["mae"])
    train = (tmp_path / "r" / "train.csv").read_text().splitlines()
    test = (tmp_path / "r" / "test.csv").read_text().splitlines()
    assert len(test) - 1 == 40 and len(train) - 1 == 160  # the fixed 20% of the 200-row slice


@pytest.mark.slow
def test_news_from_scratch_smoke(shared_data, tmp_path, capsys):
    options = ("--num_threads", "1", "--seeds", "[0, 3]")
    results = run_smoke("news-from-scratch", shared_data, tmp_path / "r", capsys, *options)
    finite_mlm(results, "val:data-heldout", ("start", "final"))
    guess = results["mlm"]["frequency_guesser"]
    assert 0 < guess["loss"] < math.log(1000) and guess["tokens"] > 1000
    both = results["downstream"]["agnews"]
    for name in ("pretrained", "random_init"):  # bertforge downstream once per seed
        assert set(both[name]["seeds"]) == {"0", "3"}
        assert 0 <= both[name]["mean"]["accuracy"] <= 1
    commands = [c["command"] for c in results["commands"]]
    assert sum(c.startswith("bertforge downstream") and "--seed 3" in c for c in commands) == 1
    torch_bound = [c for c in commands if c.split()[1] in ("pretrain", "downstream")]
    assert len(torch_bound) == 3
    assert all(c.endswith("num_threads 1") for c in torch_bound), torch_bound
    assert torch.get_num_threads() == 1
    markdown = (tmp_path / "r" / "results.md").read_text()
    assert "; fine-tuning seeds 0, 3; 1 CPU thread(s) per command" in markdown
    rows = [line.split(" | ") for line in markdown.splitlines() if line.startswith("| agnews")]
    assert len(rows) == 4  # 2 models x accuracy, macro-F1
    assert all(len(row[3].split(", ")) == 2 for row in rows), rows  # one score per seed
    # the pretraining text and the held-out test rows do not overlap
    held = set((tmp_path / "r" / "heldout-text.txt").read_text().splitlines())
    assert not held & set((tmp_path / "r" / "pretrain-text.txt").read_text().splitlines())


def test_wikitext_nsp_smoke(shared_data, tmp_path, capsys):
    results = run_smoke("wikitext-nsp", shared_data, tmp_path / "r", capsys)
    table = results["mlm"]["eval"]["val:data-wikitext2-valid"]
    assert 0.0 <= table["final"]["nsp_accuracy"] <= 1.0
    assert table["start"]["perplexity"] > 100


def test_recipe_alone_lists_the_recipes(capsys):
    assert cli_main(["recipe"]) == 0
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines()[1:]] == list(RECIPES)
    assert "peak memory" not in err  # listing is not a run to measure


def test_unknown_recipe_and_missing_data_are_one_line_errors(tmp_path, capsys):
    assert cli_main(["recipe", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bertforge recipe: 'nope' is not one recipe; name one of ")
    assert err.count("bertforge recipe") == 2  # the prefix and the --help hint
    assert err.count("\n") == 1
    assert (
        cli_main(
            [
                "recipe",
                "wikitext-nsp",
                "--smoke",
                "--data",
                str(tmp_path),
                "--output",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "wiki.test.tokens not found; pass --data DIR" in err


def test_fixed_split_and_sample_are_stable():
    train, test = fixed_split(10, 0.2, seed=0)
    assert len(test) == 2 and sorted(train + test) == list(range(10))
    assert fixed_split(10, 0.2, seed=0) == (train, test)
    assert sample(list(range(5)), 10) == list(range(5))
    assert sample(list(range(100)), 3, seed=1) == sample(list(range(100)), 3, seed=1)
    assert set(RECIPES) == {
        "general",
        "reviews-adapted",
        "review-scores",
        "news-from-scratch",
        "wikitext-nsp",
    }


def test_unigram_baseline_on_known_counts():
    class Data:
        meta = {"special_ids": {"pad": 0, "cls": 1}}

        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def token_counts(self, vocab_size, special_ids):
            counts = np.zeros(vocab_size, dtype=np.int64)
            for row in self.rows:
                counts += np.bincount(row, minlength=vocab_size)
            counts[list(special_ids)] = 0
            return counts

    train = Data([[1, 2, 2, 3], [1, 2]])  # token 2: 3 times, token 3: once (+1 smoothing each)
    held = Data([[1, 2, 3]])
    result = unigram_baseline(train, held, vocab_size=4)
    probs = {2: 4 / 8, 3: 2 / 8}  # counts + 1 over 4 tokens: 0 and 1 are special (0 + 1 each)
    assert result["accuracy"] == pytest.approx(0.5)
    assert result["loss"] == pytest.approx(-(math.log(probs[2]) + math.log(probs[3])) / 2)
    assert result["tokens"] == 2


def test_unigram_baseline_counts_what_the_instances_hold(shakespeare_file, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(shakespeare_file.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    tokenizer = Tokenizer.train(text, vocab_size=200)
    options = dict(max_seq_length=32, mode="packed", validation_fraction=0.1, progress=False)
    prepare(PrepareConfig([str(text)], "", str(tmp_path / "data"), **options), tokenizer)
    train = PretrainingDataset(tmp_path / "data", "train", tokenizer)
    held = PretrainingDataset(tmp_path / "data", "validation", tokenizer)
    size = tokenizer.vocab_size
    special = list(train.meta["special_ids"].values())

    def by_instance(ds):  # the oracle: every instance's ids, one by one
        counts = np.zeros(size)
        for i in range(len(ds)):
            counts += np.bincount(np.asarray(ds[i]["input_ids"]), minlength=size)[:size]
        counts[special] = 0
        return counts

    probs = (by_instance(train) + 1) / (by_instance(train) + 1).sum()
    seen = by_instance(held)
    result = unigram_baseline(train, held, vocab_size=size)
    assert result["tokens"] == int(seen.sum()) > 1000
    assert result["loss"] == pytest.approx(-(seen * np.log(probs)).sum() / seen.sum(), rel=1e-9)
    assert result["accuracy"] == pytest.approx(seen[np.argmax(probs)] / seen.sum())
    # the general recipe's table: the guesser's row first in each evaluation set's rows, the
    # line a model that predicts "the , ." everywhere is read against
    from bertforge.recipes.general import frequency_guessers
    from bertforge.recipes.report import mlm_table

    guessers = frequency_guessers(tmp_path / "data", {"val": tmp_path / "data"})
    assert guessers == {"val": result}
    metrics = {"loss": 6.1, "perplexity": 446.0, "accuracy": 0.0415, "top5_accuracy": 0.1}
    metrics |= {"nsp_accuracy": None, "tokens": 900}
    mlm = {"steps": 22, "seconds": 180.0, "eval": {"val": {"final": metrics}}}
    rows = mlm_table(mlm | {"frequency_guesser": guessers}).splitlines()[2:]
    assert rows[0] == (
        f"| val | token-frequency guesser | {result['loss']:.3f} | - | "
        f"{result['accuracy']:.2%} | - | - |"
    )
    assert rows[1].startswith("| val | after (22 steps, 3.0 min) | 6.100 |")


def test_a_recipe_report_marks_a_seed_that_did_not_beat_the_baseline():
    seeds = {"0": {"accuracy": 0.2612, "beats_baseline": False}, "1": {"accuracy": 0.56}}
    table = downstream_table(
        {"agnews": {"random_init": {"seeds": seeds, "mean": {"accuracy": 0.4106}}}}
    )
    assert "| 0.2612*, 0.5600 |" in table
    assert "* did not beat the majority baseline" in table and "--lr" in table


def test_a_recipe_report_puts_the_nsp_majority_class_beside_the_nsp_scores():
    def row(nsp: float) -> dict:
        m = {"loss": 7.0, "perplexity": 1e3, "accuracy": 0.04, "top5_accuracy": 0.1}
        return {**m, "nsp_accuracy": nsp, "nsp_majority": 0.655}

    mlm = {"steps": 10, "seconds": 60.0, "eval": {"val": {"random_init": row(0.8286)}}}
    mlm["eval"]["val"]["final"] = row(0.80)
    lines = mlm_table(mlm).splitlines()
    assert "| val | majority class (NSP) | - | - | - | - | 65.50% |" in lines
    one = summary({"commands": [{"command": "bertforge pretrain", "seconds": 60.0}]})
    assert "1 command, 1.0 minutes in all" in one  # not "1 commands"


@pytest.mark.slow
def test_general_script_smoke_holds_out_documents_and_passes_options_to_pretrain(
    shared_data, tmp_path
):
    # scripts/pretrain_general.sh -> bertforge recipe general: held-out documents, a tokenizer,
    # sentence pairs of the paragraph-per-line text, pretraining with the options after OUT
    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "general"
    env = {**os.environ, "SMOKE": "1", "BERTFORGE_SHARED_DATA": str(shared_data)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    script = [str(repo / "scripts/pretrain_general.sh"), str(out), "--train.lr", "1e-3"]
    script += ["--train.max_time", "7m"]  # the smoke run's 3 steps end first
    done = subprocess.run(["bash", *script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["smoke"] and results["budget"] == "7m"
    assert results["pretrain_args"] == ["--train.lr", "1e-3", "--train.max_time", "7m"]
    assert yaml.safe_load((out / "run/pretrain_config.yaml").read_text())["train"]["lr"] == 1e-3
    heldout = (out / "heldout.txt").read_text().split("\n\n")
    assert len(heldout) == 2  # the smoke slice's last two Wikipedia articles
    meta = json.loads((out / "data-1000-128-nsp/meta.json").read_text())
    counts = meta["counts"]
    assert counts["documents_used"]["validation"] == 2  # held out, and left out of training
    assert counts["skipped_documents"] == {"text in --validation": 2}
    finite_mlm(results, "val", ("random_init", "start", "final"))
    assert (out / "run/model/model.safetensors").is_file()
    table = (out / "results.md").read_text()
    for split in ("val", "val:wikitext2-1000"):  # the line a frequent-words model scores
        assert f"| {split} | token-frequency guesser | " in table, table
    # a rerun continues: every finished step is skipped; CURVE=1 then benchmarks the model and
    # each snapshot (one copied in here: the smoke run's 3 steps end before any snapshot time)
    # and draws them against their pretraining minutes, the twin at 0
    shutil.copytree(out / "run/model", out / "run/snapshots/model-1m")
    env |= {"CURVE": "1", "LRS": "1e-3"}
    again = subprocess.run(["bash", *script], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stderr.count("== (done)") == 4, again.stderr[-2000:]
    curve = json.loads((out / "curve/curve.json").read_text())
    assert [p["minutes"] for p in curve["points"]] == [1.0, 7.0]
    assert [p["results"] for p in curve["points"]] == [str(out / "glue-1m"), str(out / "glue")]
    assert curve["random_twin"]["results"] == str(out / "glue") and curve["smoke"]
    assert (out / "curve/curve.png").stat().st_size > 10_000
    settings = json.loads((out / "glue-1m/results/model/RTE.json").read_text())["settings"]
    assert settings["lr"] == 1e-3 and settings["epochs"] == 4
    assert not (out / "glue-1m/results/random_init").exists()  # the twin once, with the final


def test_dapt_script_names_what_it_needs_before_doing_anything(tmp_path):
    # scripts/dapt_general.sh continues a finished general recipe: without one it stops at once,
    # naming the missing file, and writes nothing into OUT
    repo = Path(__file__).resolve().parents[1]
    script = str(repo / "scripts/dapt_general.sh")
    usage = subprocess.run(["bash", script], capture_output=True, text=True)
    assert (
        usage.returncode == 2 and "usage: bash scripts/dapt_general.sh GENERAL OUT" in usage.stderr
    )
    general = tmp_path / "general"
    (general / "run/model").mkdir(parents=True)
    (general / "run/model/config.json").write_text("{}")
    out = tmp_path / "out"
    done = subprocess.run(["bash", script, str(general), str(out)], capture_output=True, text=True)
    assert done.returncode == 2
    assert f"{general}/tokenizer-8192/vocab.txt is missing" in done.stderr
    assert "finished scripts/pretrain_general.sh output" in done.stderr
    assert not out.exists()


def test_general_recipe_on_a_gpu_takes_its_gpu_settings_and_needs_no_corpus_once_prepared(
    tmp_path, monkeypatch
):
    """With the data steps' outputs in place (copied to a GPU machine, say) the recipe goes
    straight to pretraining without the corpus; on CUDA it adds its GPU settings after the CPU
    ones (later options win) and takes the GPU's default budget, and a budget given after
    ``--`` still wins."""
    from bertforge.recipes import general as recipe
    from bertforge.recipes.runner import Recipe

    out = tmp_path / "out"
    for done in ("heldout.txt", "tokenizer-8192/vocab.txt", "data-8192-128-nsp/meta.json",
                 "wikitext2-8192/meta.json"):  # fmt: skip
        (out / done).parent.mkdir(parents=True, exist_ok=True)
        (out / done).write_text("x")
    ran: list[list[str]] = []

    def command(argv: list[str]) -> int:
        ran.append(argv)
        (out / "run").mkdir(exist_ok=True)
        (out / "run/results.json").write_text("{}")  # what the runner checks a step left
        return 0

    monkeypatch.setattr(recipe, "pretrain_results", lambda run: {})
    monkeypatch.setattr(recipe, "frequency_guessers", lambda train, held_out: {})
    for gpu, extra in ((True, ()), (True, ("--train.max_time", "2m")), (False, ())):
        ran.clear()
        (out / "run/results.json").unlink(missing_ok=True)
        monkeypatch.setattr(recipe, "on_gpu", lambda args, gpu=gpu: gpu)
        r = Recipe("general", out, tmp_path / "no-data", command, pretrain_args=extra)
        recipe.general(r)  # no corpus under tmp_path/no-data: only the pretraining step runs
        (argv,) = ran
        assert argv[0] == "pretrain"
        assert (recipe.option_value(argv, "--model.preset") == "medium") is gpu
        assert (recipe.option_value(argv, "--train.position_init_std") == "0.02") is gpu
        want = extra[1] if extra else recipe.GPU_BUDGET if gpu else recipe.BUDGET
        assert recipe.option_value(argv, "--train.max_time") == want
    assert recipe.option_value(["--a", "1", "--a", "2"], "--a") == "2"
    assert recipe.option_value(["--a"], "--a") is None
    assert recipe.on_gpu(["--train.device", "cpu"]) is False


def test_general_recipe_knows_before_the_data_steps_whether_its_budget_holds_the_count(
    tmp_path, monkeypatch, capsys
):
    """A budget too short for the co-occurrence count (about 4m15s for the general corpus on one
    core) starts from normal word vectors, said in a line, before the data steps (which take
    ~25 minutes); an explicit ``--train.word_init cooccurrence`` then is refused before any step
    runs; counts kept in the data folder by an earlier run are no cost."""
    from bertforge.errors import BertforgeError
    from bertforge.recipes import general as recipe
    from bertforge.recipes.runner import Recipe

    out = tmp_path / "out"
    ran: list[list[str]] = []

    def command(argv: list[str]) -> int:
        ran.append(argv)
        (out / "run").mkdir(parents=True, exist_ok=True)
        (out / "run/results.json").write_text("{}")
        return 0

    monkeypatch.setattr(recipe, "pretrain_results", lambda run: {})
    monkeypatch.setattr(recipe, "frequency_guessers", lambda train, held_out: {})
    monkeypatch.setattr(recipe, "on_gpu", lambda args: False)

    def pretrain_argv(*extra: str, budget: str | None = None) -> list[str]:
        ran.clear()
        (out / "run/results.json").unlink(missing_ok=True)
        recipe.general(Recipe("general", out, tmp_path / "no-data", command, budget=budget,
                              pretrain_args=extra))  # fmt: skip
        return ran[-1]

    explicit = ("--train.word_init", "cooccurrence", "--train.max_time", "3m")
    with pytest.raises(BertforgeError, match=r"recipe general: --train.word_init cooccurrence "
                       r"counts about 4m15s .* budget of 17m00s or more"):  # fmt: skip
        pretrain_argv(*explicit)
    assert ran == [] and not out.exists()  # before the data steps: nothing ran, nothing written
    for done in ("heldout.txt", "tokenizer-8192/vocab.txt", "data-8192-128-nsp/meta.json",
                 "wikitext2-8192/meta.json"):  # fmt: skip
        (out / done).parent.mkdir(parents=True, exist_ok=True)
        (out / done).write_text("x")
    capsys.readouterr()
    argv = pretrain_argv("--train.max_time", "3m")
    words = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--train.word_init"]
    assert words == ["cooccurrence", "normal"]  # the recipe's, then the budget's (later wins)
    said = capsys.readouterr().err
    assert "the budget 3m is under 17m00s, too short to count co-occurrence word vectors " in said
    assert "pretraining starts from --train.word_init normal" in said
    assert "--train.word_init normal" not in " ".join(pretrain_argv(budget="17m"))
    (out / "data-8192-128-nsp/cooccurrence-window10.safetensors").write_text("x")
    assert "--train.word_init normal" not in " ".join(pretrain_argv("--train.max_time", "3m"))
