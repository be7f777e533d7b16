"""The pretraining loop end to end on real (tiny) data: it learns, the final directory loads in
transformers, resume is bit-exact, SIGTERM stops cleanly and resumes exactly, and two torchrun
ranks equal one process."""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from safetensors.torch import load_file

from bertforge import cli
from bertforge.cli.pretrain import main
from bertforge.data.shards import PrepareConfig, prepare
from bertforge.errors import BertforgeError
from bertforge.progress import ProgressBar, read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.checkpoints import list_checkpoints
from bertforge.training.config import ModelSection, PretrainConfig, TrainConfig, snapshot_times
from bertforge.training.pretrain import CONFIG_FILE, apply_on_device, pretrain

_APPLY = apply_on_device

TINY_MODEL = ModelSection(
    preset="tiny",
    num_hidden_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)


@pytest.fixture(autouse=True)
def _restore_threads():
    """The runs below use one thread (tiny matrices: more threads only wait on each other when
    other processes share the cores); give the rest of the session its setting back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


TINY_TRAIN = dict(
    batch_size=16,
    lr=3e-3,
    precision="fp32",
    device="cpu",
    eval_examples=64,
    eval_every=0,
    save_every=0,
    log_every=1,
    progress=False,
    warmup_ratio=0.1,
    num_threads=1,
)
"""Fast, deterministic training settings of every run here (one thread, fp32, tiny evaluation)."""


def tiny_cfg(data: Path, output: Path, **train) -> PretrainConfig:
    return PretrainConfig(
        data=str(data),
        output=str(output),
        model=TINY_MODEL,
        train=TrainConfig(**(TINY_TRAIN | train)),
    )


def tiny_argv(data: Path, model: ModelSection = TINY_MODEL, **train) -> list[str]:
    """``tiny_cfg`` as ``bertforge pretrain`` options (without --output)."""
    argv = ["--data", str(data)]
    sections = [("model", asdict(model)), ("train", TINY_TRAIN | train)]
    for section, values in sections:
        for key, value in values.items():
            argv += [
                f"--{section}.{key}",
                str(value).lower() if isinstance(value, bool) else str(value),
            ]
    return argv


def train_losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run) if r["split"] == "train"}


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def test_loss_goes_down_and_the_model_loads_in_transformers(
    pretraining_corpus, tmp_path, monkeypatch
):
    from bertforge.evaluation import plots

    titles, save = [], plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, output: titles.append(fig.get_suptitle())
                        or save(fig, output))  # fmt: skip
    result = pretrain(
        tiny_cfg(pretraining_corpus["nsp"], tmp_path / "run", max_steps=60, eval_every=30)
    )
    assert titles == [f"bertforge pretrain: {tmp_path.name}/run"]  # not "run" alone
    before, after = result["initial"]["val"], result["final"]["val"]
    # 60 steps of a 32-wide model: it learns the token statistics (ln 400 = 6.0 -> ~5.5 nats)
    assert after["loss"] < before["loss"] - 0.4, (before, after)
    assert after["top5_accuracy"] > before["top5_accuracy"] + 0.05
    assert 0.0 <= after["nsp_accuracy"] <= 1.0
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records if r["split"] == "val"] == [0, 30, 60]
    assert len(train_losses(tmp_path / "run")) == 60
    assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000
    model_dir = Path(result["model_dir"])
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json"} <= {
        p.name for p in model_dir.iterdir()
    }

    transformers = pytest.importorskip("transformers")
    from bertforge.modeling.model import BertForPreTraining

    theirs = transformers.BertForPreTraining.from_pretrained(model_dir).eval()
    ours = BertForPreTraining.from_pretrained(model_dir).eval()
    tokenizer = Tokenizer.from_file(model_dir)
    batch = tokenizer.encode_batch(["to be or not to [MASK]", "my lord"], return_tensors="pt")
    with torch.no_grad():
        a = ours(**batch)
        b = theirs(**batch)
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        a.seq_relationship_logits, b.seq_relationship_logits, atol=1e-4, rtol=1e-4
    )


def test_resume_from_a_checkpoint_is_bit_exact(pretraining_corpus, tmp_path):
    # dropout on and an evaluation mid-way: resume must restore RNG and not be perturbed by eval
    cfg = tiny_cfg(
        pretraining_corpus["nsp"],
        tmp_path / "full",
        max_steps=10,
        save_every=3,
        keep_checkpoints=0,
        eval_every=4,
    )
    full = pretrain(cfg)
    assert [p.name for p in list_checkpoints(tmp_path / "full")][-1] == "checkpoint-00000010"
    resumed = pretrain(
        replace(
            cfg,
            output=str(tmp_path / "resumed"),
            resume=str(tmp_path / "full" / "checkpoint-00000006"),
        )
    )
    a, b = train_losses(tmp_path / "full"), train_losses(tmp_path / "resumed")
    assert sorted(b) == [7, 8, 9, 10]
    assert [a[s] for s in b] == [b[s] for s in b]  # exactly equal floats
    wa, wb = weights(tmp_path / "full" / "model"), weights(tmp_path / "resumed" / "model")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert resumed["final"] == full["final"]
    assert resumed["initial"] == full["initial"]  # the random-init baseline survives resume


def test_a_time_budget_resumes_with_the_time_it_has_left(pretraining_corpus, tmp_path, capsys):
    cfg = tiny_cfg(pretraining_corpus["nsp"], tmp_path / "a", max_steps=4, max_time="1h")
    pretrain(cfg)
    checkpoint = tmp_path / "a" / "checkpoint-00000004"
    used = json.loads((checkpoint / "train_state.json").read_text())["elapsed"]
    assert used > 0

    def resume(output: str, **train) -> dict:
        return pretrain(
            replace(
                cfg,
                output=str(tmp_path / output),
                resume=str(checkpoint),
                train=replace(cfg.train, **train),
            )
        )

    assert resume("spent", max_steps=None, max_time=f"{used / 2:.6f}s")["step"] == 4
    # with steps planned beyond it, the budget's end says so last: what share of them ran
    capsys.readouterr()
    assert resume("cut", max_steps=10, max_time=f"{used / 2:.6f}s")["step"] == 4
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("budget cut the schedule: ran 4 of 10 steps (40%) in --train.max_time")
    assert resume("longer", max_steps=6)["step"] == 6
    with pytest.raises(BertforgeError, match="batch_size was 16, now 8"):
        resume("changed", batch_size=8)


def test_output_must_be_new_empty_or_this_commands_own_run(pretraining_corpus, tmp_path, capsys):
    """A finished classifier's directory (or anyone's files) is refused before anything is
    written there; a pretraining run in its own directory resumes as before."""

    def run(output: Path, steps: int) -> tuple[int, str]:
        argv = tiny_argv(pretraining_corpus["nsp"], max_steps=steps)
        code = cli.main(["pretrain", *argv, "--output", str(output)])
        return code, capsys.readouterr().err

    classifier = tmp_path / "classifier"  # what bertforge finetune leaves
    classifier.mkdir()
    for name in ("finetune_config.json", "eval_results.json", "metrics.jsonl", "curves.png"):
        (classifier / name).write_text(f"{name} of the classifier")
    code, err = run(classifier, 2)
    assert code == 2 and err.count("\n") == 1, err
    assert f"error: {classifier} is a fine-tuning run (finetune_config.json, curves.png" in err
    assert "not a pretraining run to resume; choose another --output" in err
    assert {p.name: p.read_text() for p in classifier.iterdir()} == {
        name: f"{name} of the classifier"
        for name in ("finetune_config.json", "eval_results.json", "metrics.jsonl", "curves.png")
    }
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    code, err = run(mine, 2)
    assert code == 2 and f"{mine} is a directory of other files (notes.txt)" in err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]

    own = tmp_path / "run"
    assert run(own, 2)[0] == 0
    code, err = run(own, 3)  # the same run with a larger budget: it continues
    assert code == 0 and f"resuming from {own / 'checkpoint-00000002'} at step 2" in err
    assert sorted(train_losses(own)) == [1, 2, 3]


@pytest.mark.slow
def test_sigterm_saves_exits_zero_and_resumes_exactly(pretraining_corpus, tmp_path):
    run = tmp_path / "run"
    args = [*tiny_argv(pretraining_corpus["nsp"], max_steps=300), "--output", str(run)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertforge.cli", "pretrain", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").is_file() and any(
            r["split"] == "train" for r in read_metrics(run)
        ):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "Resume with" in err and CONFIG_FILE in err
    stopped_at = int(list_checkpoints(run)[-1].name.split("-")[1])
    assert 1 <= stopped_at < 300, "the run finished before the signal arrived"
    assert not (run / "model").exists()  # no final model from an interrupted run

    assert main(["--config", str(run / CONFIG_FILE)]) == 0  # the printed resume command
    reference = tmp_path / "reference"
    main([*args[:-1], str(reference)])
    a, b = train_losses(reference), train_losses(run)
    assert sorted(b) == list(range(1, 301))  # every step logged once across the two processes
    assert a == b
    wa, wb = weights(reference / "model"), weights(run / "model")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


TINY_MODERN = replace(TINY_MODEL, architecture="modernbert", local_attention=16)
"""The same size as a ModernBERT (layer 0 global, layer 1 local): its 32-token packed rows are
longer than the window of 8 either side, so the sliding-window path runs, unpadded."""


@pytest.mark.slow
@pytest.mark.parametrize("model", [TINY_MODEL, TINY_MODERN], ids=["bert", "modernbert"])
def test_two_torchrun_ranks_equal_one_process(pretraining_corpus, tmp_path, model):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not installed next to this python")
    common = tiny_argv(
        pretraining_corpus["packed"], model, objective="mlm", max_steps=8, dropout=0.0
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "bertforge.cli",
            "pretrain",
            *common,
            "--output",
            str(tmp_path / "ddp"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("peak memory:") == 1  # rank 0 speaks for the run
    # one process, full batch in two micro-batches of 8 (gradient accumulation)
    assert (
        main([*common, "--output", str(tmp_path / "single"), "--train.micro_batch_size", "8"]) == 0
    )
    a, b = train_losses(tmp_path / "ddp"), train_losses(tmp_path / "single")
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5, abs=1e-5)
    wa, wb = weights(tmp_path / "ddp" / "model"), weights(tmp_path / "single" / "model")
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=2e-5, rtol=1e-4)
    results = json.loads((tmp_path / "ddp" / "results.json").read_text())
    assert results["final"]["val"]["nsp_accuracy"] is None  # MLM only: no NSP head
    saved = json.loads((tmp_path / "ddp" / "model" / "config.json").read_text())
    if model.architecture == "modernbert":
        assert saved["architectures"] == ["ModernBertForMaskedLM"]
        assert saved["layer_types"] == ["full_attention", "sliding_attention"]
    else:
        assert saved["model_type"] == "bert"


def test_non_finite_losses_are_skipped_then_stop_with_a_message(pretraining_corpus, tmp_path):
    cfg = tiny_cfg(
        pretraining_corpus["nsp"],
        tmp_path / "run",
        max_steps=30,
        lr=1e30,
        warmup_ratio=0.0,
        max_nonfinite=3,
        max_grad_norm=0.0,
    )
    with pytest.raises(BertforgeError, match="non-finite for 3 steps in a row"):
        pretrain(cfg)
    skipped = [r["skipped"] for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
    assert skipped[-1] >= 2  # earlier bad steps were skipped, not applied


def test_config_errors_name_the_option(pretraining_corpus, tmp_path, capsys):
    with pytest.raises(BertforgeError, match="--train.objective mlm"):
        pretrain(tiny_cfg(pretraining_corpus["packed"], tmp_path / "a", max_steps=2))
    with pytest.raises(BertforgeError, match="micro_batch_size"):
        pretrain(
            tiny_cfg(pretraining_corpus["nsp"], tmp_path / "b", max_steps=2, micro_batch_size=5)
        )
    with pytest.raises(BertforgeError, match="budget"):
        pretrain(tiny_cfg(pretraining_corpus["nsp"], tmp_path / "c"))
    with pytest.raises(SystemExit):
        main(
            [
                "--config",
                str(ROOT / "configs" / "mini.yaml"),
                "--data",
                "d",
                "--output",
                "o",
                "--train.lr",
                "5e-4",
                "--print_config",
            ]
        )
    printed = capsys.readouterr().out
    assert "lr: 0.0005" in printed and "preset: mini" in printed
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_nsp_weight_weighs_the_nsp_loss_in_the_total_and_the_gradient(pretraining_corpus, tmp_path):
    records = {}
    for weight in (0.0, 1.0, 3.0):
        run = tmp_path / f"w{weight}"
        pretrain(tiny_cfg(pretraining_corpus["nsp"], run, max_steps=3, nsp_weight=weight))
        records[weight] = [r for r in read_metrics(run) if r["split"] == "train"]
        for r in records[weight]:
            assert r["loss"] == pytest.approx(r["mlm_loss"] + weight * r["nsp_loss"], rel=1e-6)
    first = [(records[w][0]["mlm_loss"], records[w][0]["nsp_loss"]) for w in records]
    assert first[0] == first[1] == first[2]  # step 1 is scored before any update
    assert records[1.0][-1]["mlm_loss"] != records[3.0][-1]["mlm_loss"]  # the gradient changed
    # weight 0: no gradient reaches the NSP head, so its bias (never weight-decayed) stays at 0
    state = load_file(tmp_path / "w0.0" / "model" / "model.safetensors")
    assert state["cls.seq_relationship.bias"].eq(0).all()
    state = load_file(tmp_path / "w1.0" / "model" / "model.safetensors")
    assert not state["cls.seq_relationship.bias"].eq(0).all()
    with pytest.raises(BertforgeError, match="--train.nsp_weight 2.0 weighs the NSP loss"):
        tiny_cfg(pretraining_corpus["packed"], tmp_path, objective="mlm", nsp_weight=2.0)
    with pytest.raises(BertforgeError, match="--train.nsp_weight -1.0 must be 0 or more"):
        tiny_cfg(pretraining_corpus["nsp"], tmp_path, nsp_weight=-1.0)


@pytest.mark.parametrize(
    "config",
    sorted((ROOT / "configs").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_every_shipped_config_parses(config, capsys):
    # the README and scripts/pretrain_imdb.sh point users at these files: none may have rotted
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(config), "--data", "d", "--output", "o", "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "preset:" in printed and "max_time:" in printed


@pytest.mark.parametrize(
    ("config", "env_seq", "expected"),
    [
        ("imdb-moonshot.yaml", "", "256"),
        ("imdb-20m.yaml", "", "128"),
        ("imdb-moonshot.yaml", "64", "64"),
    ],
)
def test_pretrain_imdb_script_takes_the_sequence_length_a_config_asks_for(
    config, env_seq, expected
):
    # the script's own lines, run as the script runs them: SEQ wins, else the config's line, else 128
    script = (ROOT / "scripts" / "pretrain_imdb.sh").read_text()
    start = script.index('if [ -z "${SEQ:-}" ]')
    block = script[start : script.index("\nfi\n", start) + 4]
    env = {"PATH": os.environ["PATH"], "CONFIG": str(ROOT / "configs" / config), "SEQ": env_seq}
    done = subprocess.run(
        ["bash", "-c", block + 'printf "%s" "$SEQ"'], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected


def ppmi_by_hand(counts: torch.Tensor, alpha: float) -> torch.Tensor:
    """Positive PMI with smoothed context probabilities, one cell at a time (float64)."""
    c = counts.double()
    total = c.sum().item()
    p_context = c.sum(0) ** alpha / (c.sum(0) ** alpha).sum()
    out = torch.zeros_like(c)
    for w in range(c.shape[0]):
        for j in range(c.shape[1]):
            if c[w, j] > 0:
                pmi = math.log((c[w, j] / total) / (c[w].sum() / total * p_context[j]))
                out[w, j] = max(pmi, 0.0)
    return out


def test_cooccurrence_vectors_factorise_positive_pmi():
    from bertforge.modeling.model import cooccurrence_vectors

    gen = torch.Generator().manual_seed(0)
    counts = torch.poisson(torch.rand(12, 6, generator=gen) * 5, generator=gen)
    counts[3] = 0  # a word never seen: no vector
    vectors, seen = cooccurrence_vectors(counts, dim=8, std=0.1, alpha=0.75, seed=0)
    assert vectors.shape == (12, 6) and seen.tolist() == [i != 3 for i in range(12)]  # k = 6
    # the reference: a full SVD of the PPMI matrix, U sqrt(S), centred, scaled
    u, s, _ = torch.linalg.svd(ppmi_by_hand(counts, 0.75), full_matrices=False)
    ref = (u * s.sqrt())[seen]
    ref = ref - ref.mean(0)
    ref = ref * (0.1 / ref.pow(2).mean().sqrt())
    got = vectors[seen].double()
    # singular vectors are defined up to sign: compare the Gram matrices
    torch.testing.assert_close(got @ got.T, ref @ ref.T, atol=1e-6, rtol=1e-4)
    assert (vectors[3] == 0).all() and got.mean(0).abs().max() < 1e-6
    assert got.pow(2).mean().sqrt().item() == pytest.approx(0.1, rel=1e-5)
    again, _ = cooccurrence_vectors(counts, dim=8, std=0.1, seed=0)
    assert torch.equal(again, vectors)  # seeded: a rerun starts from the same table


def test_cooccurrence_vectors_put_words_of_the_same_contexts_together():
    from bertforge.modeling.model import cooccurrence_vectors

    counts = torch.zeros(20, 20)  # words 0-9 occur near contexts 0-9, words 10-19 near 10-19
    gen = torch.Generator().manual_seed(1)
    counts[:10, :10] = torch.poisson(torch.full((10, 10), 20.0), generator=gen)
    counts[10:, 10:] = torch.poisson(torch.full((10, 10), 20.0), generator=gen)
    vectors, _ = cooccurrence_vectors(counts, dim=2, std=0.02)  # the two leading directions
    cosine = (
        torch.nn.functional.normalize(vectors, dim=1)
        @ torch.nn.functional.normalize(vectors, dim=1).T
    )
    inside = torch.cat([cosine[:10, :10].flatten(), cosine[10:, 10:].flatten()])
    across = cosine[:10, 10:].flatten()
    assert inside.min() > 0.9 and across.max() < -0.9  # centred: the two groups point apart


# ---- the progress line and the from-scratch table -----------------------------------------------


def test_the_progress_line_shows_the_mlm_loss_beside_the_total(capsys):
    bar = ProgressBar(10, enabled=True, log_interval=0)
    bar.update(step=10, elapsed=1.0, loss=11.9, lr=1e-4, tokens_per_s=100, mlm_loss=5.8)
    bar.close()
    assert "loss 11.9000 (MLM 5.8000)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def pretrain_data(tmp_path_factory, shakespeare_file) -> Path:
    root = tmp_path_factory.mktemp("pretrain-table")
    text = root / "text.txt"
    text.write_text(shakespeare_file.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    cfg = PrepareConfig([str(text)], "", str(root / "data"), max_seq_length=32, progress=False)
    prepare(cfg, Tokenizer.train(text, vocab_size=200))
    return root / "data"


def test_a_from_scratch_table_names_its_columns_and_a_rerun_says_finished(
    pretrain_data, tmp_path, capsys
):
    argv = ["pretrain", "--data", str(pretrain_data), "--output", str(tmp_path / "run")]
    argv += ["--model.preset", "tiny", "--model.hidden_size", "32", "--model.num_hidden_layers"]
    argv += ["1", "--model.num_attention_heads", "2", "--model.intermediate_size", "64"]
    argv += ["--train.max_steps", "2", "--train.batch_size", "8", "--train.eval_examples", "16"]
    argv += ["--train.precision", "fp32", "--train.progress", "false", "--train.num_threads", "1"]
    argv += ["--train.fresh_head", "warm"]  # a start of its own: the table has three columns
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    header = next(line for line in err.splitlines() if "BERT random init" in line)
    assert header.split() == [
        "BERT",
        "random",
        "init",
        "step",
        "0",
        "(own",
        "init)",
        "trained",
        "(2",
        "steps)",
    ]
    assert "step 0 (own init): this run before its first step; BERT random init:" in err
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'run'} holds a finished run (2 steps, its budget reached)" in err
    assert "resuming" not in err


def _lagged(monkeypatch) -> None:
    """The loop that reads each step one step late (CUDA's), forced on the CPU (its fused AdamW
    takes the same ``found_inf``)."""
    P = importlib.import_module("bertforge.training.pretrain")  # (the package exports the function)

    monkeypatch.setattr(P, "reads_late", lambda run: True)


def test_reading_steps_one_late_changes_nothing(pretraining_corpus, tmp_path, monkeypatch):
    """The GPU's loop (each step's numbers read after the next is queued; the non-finite guard
    on the device) gives the plain loop's run bit for bit: losses, gradient norms, evaluations,
    checkpoints and weights, with logs, evaluations and saves at steps the lag must stop for,
    dropout on (the step drawn ahead and dropped at the end must leave the RNG as it was)."""
    P = importlib.import_module("bertforge.training.pretrain")  # (the package exports the function)

    common = dict(max_steps=9, log_every=2, eval_every=4, save_every=3, keep_checkpoints=0)
    plain = pretrain(tiny_cfg(pretraining_corpus["nsp"], tmp_path / "plain", **common))
    _lagged(monkeypatch)
    seen = []
    monkeypatch.setattr(P, "apply_on_device", lambda *a: seen.append(1) or _APPLY(*a))
    lagged = pretrain(tiny_cfg(pretraining_corpus["nsp"], tmp_path / "lagged", **common))
    assert len(seen) == 9  # the lagged path ran every step
    rows = [
        [{k: v for k, v in r.items() if "per_s" not in k and k not in ("elapsed", "time")}
         for r in read_metrics(tmp_path / run)]
        for run in ("plain", "lagged")
    ]  # fmt: skip
    assert rows[0] == rows[1]
    assert lagged["final"] == plain["final"]
    for name in ("model/model.safetensors", "checkpoint-00000009/model.safetensors"):
        a = (tmp_path / "plain" / name).read_bytes()
        assert a == (tmp_path / "lagged" / name).read_bytes(), name
    for step in ("00000003", "00000006"):  # the RNG, optimizer state and data position saved
        a, b = (tmp_path / run / f"checkpoint-{step}" for run in ("plain", "lagged"))
        sa, sb = (torch.load(d / "train_state.pt", weights_only=True) for d in (a, b))
        assert torch.equal(sa["rng"]["torch"], sb["rng"]["torch"]), step
        assert sa["rng"]["python"] == sb["rng"]["python"], step
        moments = [(x["exp_avg"], y["exp_avg"]) for x, y in zip(
            sa["optimizer"]["state"].values(), sb["optimizer"]["state"].values(), strict=True
        )]  # fmt: skip
        assert all(torch.equal(x, y) for x, y in moments), step
        ja, jb = (json.loads((d / "train_state.json").read_text()) for d in (a, b))
        assert ja["data"] == jb["data"] and ja["step"] == jb["step"], step


def test_a_non_finite_step_read_late_is_skipped_on_the_device(
    pretraining_corpus, tmp_path, monkeypatch
):
    """A step whose gradient is not finite leaves the weights and the optimizer's state as they
    were (skipped by ``found_inf`` before the host knows), is counted as skipped when read, and
    the run goes on as the plain loop's does."""
    P = importlib.import_module("bertforge.training.pretrain")  # (the package exports the function)

    real = P.launch_step
    calls = {"n": 0}

    def poisoned(run, batches, stop_requested):  # the third step's gradients become NaN
        launched = real(run, batches, stop_requested)
        calls["n"] += 1
        if calls["n"] == 3:
            next(iter(run.raw.parameters())).grad.fill_(float("nan"))
            launched.norm.fill_(float("nan"))
        return launched

    results = {}
    for name, lag in (("plain", False), ("lagged", True)):
        calls["n"] = 0
        with monkeypatch.context() as m:
            m.setattr(P, "launch_step", poisoned)
            m.setattr(P, "reads_late", lambda run, lag=lag: lag)
            results[name] = pretrain(
                tiny_cfg(pretraining_corpus["nsp"], tmp_path / name, max_steps=6, log_every=6)
            )
        last = list_checkpoints(tmp_path / name)[-1]
        assert json.loads((last / "train_state.json").read_text())["skipped"] == 1
    a = (tmp_path / "plain" / "model" / "model.safetensors").read_bytes()
    assert a == (tmp_path / "lagged" / "model" / "model.safetensors").read_bytes()
    assert results["plain"]["final"] == results["lagged"]["final"]


class _StopAtLaunch:
    """GracefulStop's stand-in: a stop asked for as the ``at``-th step is launched."""

    def __init__(self, at: int) -> None:
        self.at, self.asked, self.signal_name = at, 0, "SIGTERM"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    @property
    def requested(self) -> bool:
        self.asked += 1
        return self.asked >= self.at


def test_a_stop_read_late_drops_the_step_queued_after_it(pretraining_corpus, tmp_path, monkeypatch):
    """A stop seen one step late: the step already queued behind it is not taken (its gradients
    dropped, the RNG it drew put back), so the checkpoint equals the plain loop's."""
    P = importlib.import_module("bertforge.training.pretrain")
    for name, lag in (("plain", False), ("lagged", True)):
        with monkeypatch.context() as m:
            m.setattr(P, "GracefulStop", lambda: _StopAtLaunch(4))
            m.setattr(P, "reads_late", lambda run, lag=lag: lag)
            result = pretrain(tiny_cfg(pretraining_corpus["nsp"], tmp_path / name, max_steps=9))
        assert result["stopped"] and result["step"] == 4, name
    a, b = (tmp_path / run / "checkpoint-00000004" for run in ("plain", "lagged"))
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    sa, sb = (torch.load(d / "train_state.pt", weights_only=True) for d in (a, b))
    assert torch.equal(sa["rng"]["torch"], sb["rng"]["torch"])
    ja, jb = (json.loads((d / "train_state.json").read_text()) for d in (a, b))
    assert ja["data"] == jb["data"]


# ---- time snapshots (--train.snapshots) -------------------------------------------------------


def test_snapshot_times_are_checked_and_named(capsys):
    from bertforge.training.checkpoints import duration_label, snapshot_dir, snapshot_seconds
    from bertforge.training.pretrain import due_snapshots

    def times(**train) -> list[float]:
        return snapshot_times(TrainConfig(**train))

    assert times(max_time="2h", snapshots=["1h", "15m", "90s"]) == [90.0, 900.0, 3600.0]
    assert times(max_time="2h", max_steps=10, snapshots=["30m"]) == [1800.0]  # both budgets
    assert times(max_steps=10) == []
    refused = [
        (dict(max_steps=10, snapshots=["15m"]), "snapshots follow the budget clock of "
         "--train.max_time; set one"),
        (dict(max_time="0", snapshots=["15m"]), "set one (e.g. --train.max_time 2h)"),
        (dict(max_time="1h", snapshots=["1h"]), "--train.snapshots 1h is not before the end of "
         "--train.max_time 1h (the final model/ is the model at the end)"),
        (dict(max_time="1h", snapshots=["2h"]), "drop it or raise --train.max_time"),
        (dict(max_time="1h", snapshots=["15x"]), "duration '15x' is not understood"),
        (dict(max_time="1h", snapshots=["0"]), "a snapshot is a time into the run"),
        (dict(max_time="2h", snapshots=["60m", "1h"]), "60m and 1h are the same time"),
    ]  # fmt: skip
    for train, message in refused:
        with pytest.raises(BertforgeError, match=re.escape(message)):
            times(**train)
    # the command line: a list of durations, refused in one line before any data is read
    code = cli.main(["pretrain", "--data", "nowhere", "--output", "o", "--train.max_steps", "5",
                     "--train.snapshots", "15m", "30m"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--train.snapshots 15m 30m: snapshots" in err

    # names: whole minutes in minutes (an hour is 60m), else seconds; read back from the path
    assert [duration_label(s) for s in (900, 3600, 7200, 90, 2, 0.5)] == [
        "15m", "60m", "120m", "90s", "2s", "0.5s"
    ]  # fmt: skip
    assert snapshot_dir("run", 900) == Path("run/snapshots/model-15m")
    assert snapshot_seconds("run/snapshots/model-15m") == 900.0
    assert snapshot_seconds("run/snapshots/model-0.5s") == 0.5
    assert snapshot_seconds("run/model") is None and snapshot_seconds("x/model-15m") is None
    assert snapshot_seconds("run/snapshots/model-best") is None
    # due: reached by the clock and not written
    assert due_snapshots([60.0, 120.0, 180.0], 120.0, {"1m"}) == [120.0]
    assert due_snapshots([60.0, 120.0], 59.9, set()) == []


class StepClock:
    """``time`` as pretrain.py sees it: ``perf_counter`` advances one second at each call, so a
    step (timed from its start to its report, nothing between) is charged exactly 1 s of the
    budget whatever the machine does: the snapshot's step is known, the test cannot flake."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def test_snapshots_follow_the_budget_clock_and_resume_writes_each_once(
    pretraining_corpus, tmp_path, monkeypatch
):
    from bertforge.modeling.model import BertForPreTraining
    from bertforge.verify import verify

    P = importlib.import_module("bertforge.training.pretrain")  # (the package exports the function)
    monkeypatch.setattr(P, "time", StepClock())
    written: list[str] = []
    save = P.save_model
    monkeypatch.setattr(P, "save_model", lambda run, d: written.append(d.name) or save(run, d))
    run = tmp_path / "run"
    cfg = tiny_cfg(
        pretraining_corpus["nsp"], run, max_time="6s", max_steps=3, snapshots=["2s", "4s"],
        save_every=1, keep_checkpoints=0,
    )  # fmt: skip
    first = pretrain(cfg)  # stops at its 3 steps (3 s): the 2 s snapshot, not the 4 s one
    assert first["step"] == 3 and written == ["model-2s", "model"]
    assert first["snapshots"] == {"2s": {"model_dir": str(run / "snapshots/model-2s"), "step": 2}}

    written.clear()  # the same run, the step budget lifted: it resumes at 3 s, runs to 6 s
    second = pretrain(replace(cfg, train=replace(cfg.train, max_steps=None)))
    assert second["step"] == 6 and written == ["model-4s", "model"]  # 2 s not written again
    assert {k: v["step"] for k, v in second["snapshots"].items()} == {"2s": 2, "4s": 4}
    for label, step in (("2s", 2), ("4s", 4)):  # the model as it was at that step, loadable
        snapshot = run / "snapshots" / f"model-{label}"
        assert {"config.json", "model.safetensors", "tokenizer.json", "manifest.json"} <= {
            p.name for p in snapshot.iterdir()
        }
        ws, wc = weights(snapshot), weights(run / f"checkpoint-{step:08d}")
        assert ws.keys() == wc.keys() and all(torch.equal(ws[k], wc[k]) for k in ws)
        BertForPreTraining.from_pretrained(snapshot)
        assert Tokenizer.from_file(snapshot).vocab_size == 400
    assert not all(torch.equal(a, b) for a, b in zip(
        weights(run / "snapshots/model-2s").values(), weights(run / "model").values(),
        strict=True))  # fmt: skip

    checked = [(f.kind, f.path, f.status) for f in verify(run).findings]  # bertforge verify RUN
    assert checked[-2:] == [("model", run / "snapshots" / f"model-{t}", "ok") for t in ("2s", "4s")]

    # killed after writing the 4 s snapshot, before a checkpoint recorded it: resumed from the
    # checkpoint before, it passes 4 s again and keeps the snapshot on disk
    written.clear()
    pretrain(replace(cfg, train=replace(cfg.train, max_steps=None),
                     resume=str(run / "checkpoint-00000003")))  # fmt: skip
    assert written == ["model"]

    # a time added when resuming past it can no longer be taken: refused, not skipped
    late = replace(cfg.train, max_steps=None, snapshots=["2s", "3s", "4s"])
    with pytest.raises(BertforgeError, match=re.escape("--train.snapshots 3s: this run resumes "
                       "at 0m05s of its budget, past that time, and never saved its snapshot")):  # fmt: skip
        pretrain(replace(cfg, train=late, resume=str(run / "checkpoint-00000005")))
