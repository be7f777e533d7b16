"""``bertforge pretrain --init_from DIR``: continuing masked-LM training from a published model (a
Hugging Face directory without an MLM head) or from one of ours, the settings it refuses,
``--train.freeze``, and ``bertforge fill-mask --compare``."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import TaskFiles
from safetensors.torch import load_file

from bertforge.cli import main as cli_main
from bertforge.data.shards import PrepareConfig, prepare
from bertforge.errors import BertforgeError
from bertforge.inference.predict import declared_pooling, fill_mask_side_by_side
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForSequenceClassification
from bertforge.progress import read_metrics
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.config import (
    ALL_LAYERS,
    ModelSection,
    PretrainConfig,
    TrainConfig,
    parse_freeze,
)
from bertforge.training.pretrain import pretrain
from bertforge.training.setup import (
    build_model,
    fresh_modules,
    model_contradictions,
    open_data,
)
from bertforge.training.start import warm_fresh_head

TRAIN = dict(
    objective="mlm",
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
TINY = ModelSection(
    preset="tiny",
    num_hidden_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf_model(shakespeare_file: Path, tmp_path_factory) -> dict[str, Path]:
    """A tiny ``transformers.BertModel`` saved in Hugging Face's layout (no MLM head, a pooler)
    with a real WordPiece tokenizer beside it, and Shakespeare prepared with that tokenizer."""
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("init_from")
    text = root / "shakespeare.txt"
    text.write_text(shakespeare_file.read_text(encoding="utf-8")[:200_000], encoding="utf-8")
    tokenizer = Tokenizer.train(text, vocab_size=400)
    hf_dir = root / "hf-encoder"
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(hf_dir)
    tokenizer.save(hf_dir)
    data = root / "data"
    options = dict(max_seq_length=32, mode="packed", validation_fraction=0.05, progress=False)
    prepare(PrepareConfig([str(text)], str(hf_dir), str(data), **options))
    other = root / "data-other-tokenizer"
    prepare(
        PrepareConfig([str(text)], "", str(other), **options), Tokenizer.train(text, vocab_size=300)
    )
    return {"dir": hf_dir, "data": data, "text": text, "other": other}


def cfg(data: Path, output: Path, init_from: Path | None = None, **train) -> PretrainConfig:
    return PretrainConfig(
        data=str(data),
        output=str(output),
        init_from=str(init_from) if init_from else None,
        model=ModelSection() if init_from else TINY,
        train=TrainConfig(**(TRAIN | train)),
    )


def val_records(run: Path) -> list[dict]:
    return [r for r in read_metrics(run) if r["split"] == "val"]


def test_a_hugging_face_encoder_without_mlm_head_gets_fresh_heads_and_loads_in_transformers(
    hf_model, tmp_path, capsys
):
    transformers = pytest.importorskip("transformers")
    # a random head (a warm one starts at the frequency guesser, which 12 steps on a random
    # encoder cannot beat: test_a_warm_fresh_head_starts_nearer_than_a_random_one)
    result = pretrain(
        cfg(hf_model["data"], tmp_path / "run", hf_model["dir"], max_steps=12, fresh_head="random")
    )
    err = capsys.readouterr().err
    start = next(line for line in err.splitlines() if line.startswith("starting from"))
    for head in ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm"):
        assert head in start, start
    assert "cls.predictions.bias" in start and "bert.embeddings" not in start
    # the table: the same network from random init, the starting model, the adapted one
    assert (
        "BERT random init" in err and "step 0 (--init_from)" in err and "adapted (12 steps)" in err
    )
    assert result["random_init"]["val"]["loss"] != result["initial"]["val"]["loss"]
    assert result["final"]["val"]["loss"] < result["initial"]["val"]["loss"]

    # the starting encoder's weights were loaded (not a fresh init): compare before training
    from bertforge.modeling.model import BertForMaskedLM

    start_model = BertForMaskedLM.from_pretrained(hf_model["dir"])
    hf = transformers.BertModel.from_pretrained(hf_model["dir"])
    torch.testing.assert_close(
        start_model.bert.encoder.layer[1].output.dense.weight,
        hf.encoder.layer[1].output.dense.weight,
    )

    model_dir = Path(result["model_dir"])
    theirs = transformers.BertForMaskedLM.from_pretrained(model_dir).eval()
    ours = BertForMaskedLM.from_pretrained(model_dir).eval()
    assert ours.loading_info["missing"] == []
    # MLM does not train the start's pooler, but the run keeps it for a classifier fine-tuned
    # from the run (it had started random there before)
    assert "kept from" in err and "pooler" in err
    classifier = BertForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    assert sorted(classifier.loading_info["missing"]) == ["classifier.bias", "classifier.weight"]
    torch.testing.assert_close(classifier.bert.pooler.dense.weight, hf.pooler.dense.weight)
    torch.testing.assert_close(classifier.bert.pooler.dense.bias, hf.pooler.dense.bias)
    tokenizer = Tokenizer.from_file(model_dir)
    batch = tokenizer.encode_batch(["to be or not to [MASK]", "my lord"], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(
            ours(**batch).logits, theirs(**batch).logits, atol=1e-4, rtol=1e-4
        )


def test_from_our_own_model_it_continues_at_the_loss_it_ended_at(hf_model, tmp_path, capsys):
    first = pretrain(cfg(hf_model["data"], tmp_path / "a", max_steps=100))
    capsys.readouterr()
    second = pretrain(
        cfg(hf_model["data"], tmp_path / "b", Path(first["model_dir"]), max_steps=6, lr=3e-4)
    )
    err = capsys.readouterr().err
    assert "every weight comes from the checkpoint" in err
    # the same validation sequences and masks: the start of b is exactly the end of a
    assert second["initial"]["val"]["loss"] == pytest.approx(
        first["final"]["val"]["loss"], abs=1e-5
    )
    a = [r["loss"] for r in read_metrics(tmp_path / "a") if r["split"] == "train"]
    b = [r["loss"] for r in read_metrics(tmp_path / "b") if r["split"] == "train"]
    began, ended, continued = sum(a[:5]) / 5, sum(a[-10:]) / 10, sum(b) / len(b)
    assert began - ended > 0.3, a  # run a learned something in its 100 steps
    # b's training loss continues at a's end (batch-to-batch noise is ~0.2 nats here), far from
    # where a's random network began
    assert abs(continued - ended) < 0.25 < abs(continued - began), (a[:5], a[-10:], b)
    assert second["random_init"]["val"]["loss"] > second["initial"]["val"]["loss"] + 0.3


def test_resume_of_an_init_from_run_is_exact(hf_model, tmp_path):
    config = cfg(
        hf_model["data"],
        tmp_path / "full",
        hf_model["dir"],
        max_steps=6,
        save_every=3,
        keep_checkpoints=0,
        dropout=0.1,
    )
    full = pretrain(config)
    resumed = pretrain(
        replace(
            config,
            output=str(tmp_path / "resumed"),
            resume=str(tmp_path / "full" / "checkpoint-00000003"),
        )
    )
    wa = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    wb = load_file(str(tmp_path / "resumed" / "model" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert resumed["final"] == full["final"]
    assert resumed["initial"] == full["initial"] and resumed["random_init"] == full["random_init"]


def test_a_contradicting_model_option_is_refused_in_one_line(hf_model, tmp_path, capsys):
    argv = ["pretrain", "--data", str(hf_model["data"]), "--output", str(tmp_path / "run")]
    argv += [
        "--init_from",
        str(hf_model["dir"]),
        "--train.max_steps",
        "2",
        "--train.objective",
        "mlm",
    ]
    assert cli_main(argv + ["--model.hidden_size", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--model.hidden_size 64 contradicts --init_from" in err and "hidden_size 32" in err
    assert cli_main(argv + ["--model.preset", "base"]) == 2
    assert "--model.preset base contradicts" in capsys.readouterr().err
    assert not (tmp_path / "run" / "model").exists()


def test_data_prepared_with_another_tokenizer_is_refused(hf_model, tmp_path):
    with pytest.raises(
        BertforgeError, match=r"prepare the text with bertforge prepare --tokenizer"
    ):
        pretrain(cfg(hf_model["other"], tmp_path / "run", hf_model["dir"], max_steps=2))


def test_model_contradictions_only_counts_values_changed_from_their_default():
    config = BertConfig(
        vocab_size=100,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
    )
    assert model_contradictions(ModelSection(), config) == []
    assert model_contradictions(ModelSection(hidden_size=384, num_hidden_layers=6), config) == []
    assert model_contradictions(ModelSection(hidden_size=256), config) == [
        ("hidden_size", 256, "hidden_size 384")
    ]
    assert [
        c[0] for c in model_contradictions(ModelSection(preset="small", hidden_act="relu"), config)
    ] == [
        "preset",
        "hidden_act",
    ]


def test_fresh_modules_names_modules_not_parameters():
    missing = [
        "cls.predictions.bias",
        "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.LayerNorm.bias",
        "cls.seq_relationship.weight",
    ]
    assert fresh_modules(missing) == [
        "cls.predictions.bias",
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.seq_relationship",
    ]


def frozen_run(hf_model, tmp_path: Path, capsys, freeze: str, **train) -> tuple[dict, dict, dict]:
    """Four steps from the HF encoder with ``--train.freeze FREEZE``: the result and the start and
    end weights (safetensors dicts); checks the run said what it froze."""
    result = pretrain(
        cfg(
            hf_model["data"], tmp_path / "run", hf_model["dir"], max_steps=4, freeze=freeze, **train
        )
    )
    assert f"frozen ({freeze})" in capsys.readouterr().err
    start = load_file(str(hf_model["dir"] / "model.safetensors"))
    return result, start, load_file(str(Path(result["model_dir"]) / "model.safetensors"))


def test_freeze_keeps_the_embeddings_and_lower_layers_fixed(hf_model, tmp_path, capsys):
    assert parse_freeze("embeddings,layers:1") == (True, 1)
    assert parse_freeze(None) == (False, 0)
    with pytest.raises(BertforgeError, match="--train.freeze"):
        TrainConfig(freeze="bottom")
    _, start, end = frozen_run(hf_model, tmp_path, capsys, "embeddings,layers:1")
    for key in ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"):
        assert torch.equal(start[key], end["bert." + key]), key
    key = "encoder.layer.1.attention.self.query.weight"
    assert not torch.equal(start[key], end["bert." + key])
    with pytest.raises(BertforgeError, match="the model has 2 layers"):
        pretrain(
            cfg(
                hf_model["data"], tmp_path / "run2", hf_model["dir"], max_steps=1, freeze="layers:3"
            )
        )


def test_layers_all_trains_the_heads_alone(hf_model, tmp_path, capsys):
    assert parse_freeze("embeddings,layers:all") == (True, ALL_LAYERS)
    result, start, end = frozen_run(
        hf_model, tmp_path, capsys, "embeddings,layers:all", fresh_head="random"
    )
    for key, value in start.items():
        if not key.startswith("pooler"):
            assert torch.equal(value, end["bert." + key]), key
    assert result["final"]["val"]["loss"] < result["initial"]["val"]["loss"]  # the head learned


def test_warm_fresh_head_sets_only_the_missing_parameters():
    from bertforge.modeling.model import BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=6,
            hidden_size=4,
            num_hidden_layers=1,
            num_attention_heads=1,
            intermediate_size=8,
        )
    )
    head = model.cls.predictions
    ln_before = head.transform.LayerNorm.weight.clone()
    dense_before = head.transform.dense.weight.clone()
    counts = torch.tensor([0, 0, 10, 30, 60, 0])
    done = warm_fresh_head(model, ["cls.predictions.bias"], counts)
    assert done == ["cls.predictions.bias = log token frequencies of the training text"]
    log_p = torch.log((counts.double() + 0.5) / (counts.double() + 0.5).sum())
    torch.testing.assert_close(head.bias.double(), log_p - log_p.mean())
    assert torch.equal(head.transform.dense.weight, dense_before)  # not missing: untouched
    assert torch.argmax(head.bias) == 4 and abs(float(head.bias.detach().sum())) < 1e-5
    missing = ["cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias"]
    warm_fresh_head(model, missing, counts)
    assert torch.equal(head.transform.dense.weight, torch.eye(4))
    assert not head.transform.dense.bias.any()
    assert torch.equal(head.transform.LayerNorm.weight, ln_before)


def test_a_warm_fresh_head_starts_nearer_than_a_random_one(hf_model, tmp_path, capsys):
    warm = pretrain(cfg(hf_model["data"], tmp_path / "warm", hf_model["dir"], max_steps=1))
    err = capsys.readouterr().err
    assert "fresh MLM head started warm: cls.predictions.bias = log token frequencies" in err
    cold = pretrain(
        cfg(hf_model["data"], tmp_path / "cold", hf_model["dir"], max_steps=1, fresh_head="random")
    )
    assert "started warm" not in capsys.readouterr().err
    # a random head predicts about uniformly (log of the 400-piece vocabulary, ~6.0 nats); the
    # warm one at least as well as the token frequencies
    assert warm["initial"]["val"]["loss"] < cold["initial"]["val"]["loss"] - 0.5
    with pytest.raises(BertforgeError, match="--train.fresh_head"):
        TrainConfig(fresh_head="hot")


def test_fill_mask_compare_prints_both_models_side_by_side(hf_model, tmp_path, capsys):
    a = pretrain(cfg(hf_model["data"], tmp_path / "a", max_steps=30))["model_dir"]
    b = pretrain(cfg(hf_model["data"], tmp_path / "b", Path(a), max_steps=3))["model_dir"]
    capsys.readouterr()
    text = "to be or not to [MASK] , my [MASK] ."
    assert cli_main(["fill-mask", "--model", a, "--compare", b, "--top_k", "3", text]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == text and "[MASK] 1" in lines[1] and "[MASK] 2" in out
    assert a[-20:] in lines[1] and b[-20:] in lines[1]
    assert len([line for line in lines if line.strip().startswith(("1 ", "2 ", "3 "))]) == 6
    assert (
        cli_main(
            ["fill-mask", "--model", a, "--compare", b, "--output", str(tmp_path / "o.jsonl"), text]
        )
        == 0
    )
    record = json.loads((tmp_path / "o.jsonl").read_text())
    assert set(record["models"]) == {a, b} and record["text"] == text


def test_fill_mask_side_by_side_table():
    def result(tokens):
        return [{"text": "a [MASK] b", "masks": [[{"token": t, "score": s} for t, s in tokens]]}]

    table = fill_mask_side_by_side(
        {"start": result([("good", 0.5), ("bad", 0.25)]), "adapted": result([("great", 0.75)])}
    )
    lines = table.splitlines()
    assert lines[0] == "a [MASK] b"
    assert lines[1].split() == ["[MASK]", "start", "adapted"]
    assert lines[2].split() == ["1", "good", "50.0%", "great", "75.0%"]
    assert lines[3].split() == ["2", "bad", "25.0%"]


def test_a_sentence_transformers_start_keeps_its_pooling(hf_model, tmp_path, capsys):
    """An MLM run from a sentence-transformers model (modules.json, 1_Pooling, 2_Normalize, as
    all-MiniLM-L6-v2 ships) writes the declaration into its model: embed pools the adapted
    model as it pooled the start (it fell back to [CLS], unnormalised, before)."""
    start = tmp_path / "st-start"
    shutil.copytree(hf_model["dir"], start)
    TaskFiles.declare_mean_pooling(start, dim=32)
    result = pretrain(cfg(hf_model["data"], tmp_path / "run", start, max_steps=2))
    assert "1_Pooling" in capsys.readouterr().err
    model_dir = Path(result["model_dir"])
    assert declared_pooling(model_dir) == declared_pooling(start)
    assert declared_pooling(model_dir)[0] == "mean" and declared_pooling(model_dir)[2] is True
    assert cli_main(["verify", str(model_dir)]) == 0  # the manifest still vouches for the rest


def test_a_started_or_resumed_model_trains_with_dropout(hf_model, tmp_path):
    """from_pretrained returns eval mode (as transformers); pretraining from --init_from, or
    resuming, switches it back to training: dropout on."""
    c = cfg(hf_model["data"], tmp_path / "run", hf_model["dir"], max_steps=1)
    model = build_model(c, open_data(c), None)
    assert all(m.training for m in model.modules())
    model.save_pretrained(tmp_path / "checkpoint")
    resumed = build_model(c, open_data(c), tmp_path / "checkpoint")
    assert all(m.training for m in resumed.modules())
