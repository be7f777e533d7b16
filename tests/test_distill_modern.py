"""``bertforge distill`` with ModernBERT on either side, on tiny models: a fine-tuned ModernBERT
classifier as the teacher, distilled into a subset of its own layers (each layer keeping its
attention type; transformers' class gives the same logits), into a fresh ModernBERT and a fresh
BERT of a preset; a BERT teacher into a ModernBERT student directory and a fresh ModernBERT
(``--student_architecture``); a ModernBERT tagger and QA reader as teachers; the intermediate
losses with a ModernBERT on either side (what they read checked against transformers' hidden
states); and the one-line errors: a layer subset without layer 0, attention maps of different
windows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import QUICK_FINETUNE
from support.cli import one_line_error
from support.serve import qa_model, tagger_model
from test_modernbert import tiny

from bertforge import cli
from bertforge.modeling.config import load_config
from bertforge.modeling.modernbert import ModernBertForMaskedLM, ModernBertForSequenceClassification
from bertforge.progress import read_metrics
from bertforge.tokenizer import Tokenizer

QUICK = ["--batch_size", "16", "--num_threads", "1", "--precision", "fp32", "--progress", "false"]
QUICK += ["--dropout", "0", "--eval_batch_size", "32"]
SENTIMENT = ["the movie was good", "a bad plot and some actors", "the film was fine and good"]


@pytest.fixture(scope="module")
def models(task_files, tmp_path_factory) -> dict[str, Path]:
    """A tiny ModernBERT masked LM (3 layers: global, local, local) and a BERT one sharing a
    WordPiece tokenizer; a ModernBERT and a BERT sentiment classifier fine-tuned from them."""
    root = tmp_path_factory.mktemp("distill-modern")
    bert = task_files.tiny_start_model(root, kind="mlm")
    tokenizer = Tokenizer.from_file(bert)
    ids = dict(pad_token_id=tokenizer.pad_id, cls_token_id=tokenizer.cls_id)
    ids |= dict(bos_token_id=tokenizer.cls_id, sep_token_id=tokenizer.sep_id)
    ids |= dict(eos_token_id=tokenizer.sep_id, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)
    ModernBertForMaskedLM(tiny(**ids)).save_pretrained(root / "mlm", tokenizer=tokenizer)
    task_files.write_sentiment(root / "train.csv", 128, seed=1)
    task_files.write_sentiment(root / "dev.csv", 48, seed=2)
    paths = {"root": root, "mlm": root / "mlm", "bert_mlm": bert}
    for name, start in (("teacher", root / "mlm"), ("bert_teacher", bert)):
        argv = ["finetune", "--model", str(start), "--task", "classification"]
        argv += ["--train", str(root / "train.csv"), "--validation", str(root / "dev.csv")]
        argv += ["--output", str(root / name), "--epochs", "8", "--lr", "3e-3", *QUICK_FINETUNE]
        assert cli.main(argv) == 0
        paths[name] = root / name
    return paths


def distill(models: dict[str, Path], out: Path, *options: str, teacher: str = "teacher") -> dict:
    argv = ["distill", "--teacher", str(models[teacher]), "--output", str(out), *QUICK]
    argv += ["--train", str(models["root"] / "train.csv")]
    argv += ["--validation", str(models["root"] / "dev.csv"), *options]
    assert cli.main([*argv, "--max_steps", "30", "--lr", "3e-3"]) == 0
    return json.loads((out / "eval_results.json").read_text())


def same_logits_in_transformers(directory: Path) -> None:
    """transformers' class for the saved student (config.json says which) gives our logits on
    a padded batch."""
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    config = load_config(directory / "config.json")
    from bertforge.modeling.auto import model_class

    ours = model_class(config, "sequence").from_pretrained(directory).eval()
    batch = transformers.AutoTokenizer.from_pretrained(directory)(
        SENTIMENT, padding=True, return_tensors="pt"
    )
    batch.pop("token_type_ids", None)
    with torch.no_grad():
        expected, got = theirs(**batch).logits, ours(**batch).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_modernbert_teacher_into_its_own_layers(models):
    """Layers 0 and 2 of the teacher (global, local): the subset keeps their attention types,
    its weights are the teacher's, and transformers reads the student with the same logits."""
    out = models["root"] / "layers"
    results = distill(models, out, "--student_layers", "0", "2")
    assert results["teacher"]["accuracy"] >= 0.9 and results["validation"]["accuracy"] >= 0.8
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "modernbert"
    assert config["architectures"] == ["ModernBertForSequenceClassification"]
    teacher = load_config(models["teacher"] / "config.json")
    assert teacher.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert config["layer_types"] == ["full_attention", "sliding_attention"]
    same_logits_in_transformers(out)


def test_the_subset_copies_the_teachers_layers():
    """Before any training, the subset's layer 1 is the teacher's layer 2, weight for weight."""
    from bertforge.training.students import layer_subset

    torch.manual_seed(0)
    teacher = ModernBertForSequenceClassification(tiny(num_labels=2))
    student = layer_subset(teacher, [0, 2])
    theirs, mine = teacher.state_dict(), student.state_dict()
    for key, value in mine.items():
        source = key.replace("layers.1.", "layers.2.")
        assert torch.equal(value, theirs[source]), key
    assert student.config.layer_types == ["full_attention", "sliding_attention"]


def test_fresh_students_of_either_architecture(models):
    """A ModernBERT teacher's preset student is a fresh ModernBERT (the teacher's architecture),
    or a BERT with --student_architecture bert; a BERT teacher's, a ModernBERT with
    --student_architecture modernbert. Each learns, saves in its own layout and reloads in
    transformers with the same logits."""
    cases = [
        ("teacher", [], "modernbert"),
        ("teacher", ["--student_architecture", "bert"], "bert"),
        ("bert_teacher", ["--student_architecture", "modernbert"], "modernbert"),
    ]
    for i, (teacher, options, model_type) in enumerate(cases):
        out = models["root"] / f"fresh-{i}"
        results = distill(models, out, "--student_preset", "tiny", *options, teacher=teacher)
        assert results["validation"]["accuracy"] >= 0.6, (teacher, options, results)  # fresh
        config = json.loads((out / "config.json").read_text())
        assert config["model_type"] == model_type and config["num_hidden_layers"] == 2
        assert config["hidden_size"] == 128
        same_logits_in_transformers(out)


def test_a_bert_teacher_into_a_modernbert_student_directory(models):
    out = models["root"] / "modern-student"
    results = distill(models, out, "--student", str(models["mlm"]), teacher="bert_teacher")
    assert results["validation"]["accuracy"] >= 0.6  # a random-init masked LM
    assert json.loads((out / "config.json").read_text())["model_type"] == "modernbert"
    same_logits_in_transformers(out)


def test_modernbert_tagger_and_reader_teachers(models):
    """A ModernBERT token classifier and QA reader (fine-tuned from the masked LM) distil into
    their own first two layers."""
    root = models["root"] / "tasks"
    root.mkdir(exist_ok=True)
    one = ("--num_threads", "1")
    ner, qa = tagger_model(root, models["mlm"], 40, *one), qa_model(root, models["mlm"], 40, *one)
    for teacher, train, metric in ((ner, root / "ner.conll", "token_accuracy"),
                                   (qa, root / "qa.jsonl", "f1")):  # fmt: skip
        out = root / f"{teacher.name}-student"
        argv = ["distill", "--teacher", str(teacher), "--output", str(out), *QUICK]
        argv += ["--student_layers", "0", "1", "--train", str(train)]
        assert cli.main([*argv, "--max_steps", "20", "--lr", "3e-3"]) == 0
        results = json.loads((out / "eval_results.json").read_text())
        assert results["validation"][metric] > 0, results
        assert json.loads((out / "config.json").read_text())["model_type"] == "modernbert"


@pytest.mark.parametrize(
    "options, message",
    [
        (["--student_layers", "1", "2"], "starts with the teacher's layer 0"),
        (["--student_layers", "0", "2", "--layer_map", "1", "2", "--attention_weight", "1"],
         "the student's layer 0 attends global and the teacher's layer 1 a window of 4"),
        (["--student_preset", "small", "--student_architecture", "modernbert"],
         "unknown ModernBERT preset 'small'"),
        (["--student_layers", "0", "--student_architecture", "bert"],
         "--student_architecture shapes a fresh student"),
    ],
)  # fmt: skip
def test_bad_modernbert_students_are_one_line_errors(models, tmp_path, capsys, options, message):
    argv = ["distill", "--teacher", str(models["teacher"]), "--output", str(tmp_path / "x")]
    argv += ["--train", str(models["root"] / "train.csv"), *options, *QUICK]
    assert message in one_line_error(argv, capsys)
    assert not (tmp_path / "x").exists()


def test_what_the_intermediate_losses_read_of_a_modernbert():
    """The trace of a padded batch through a ModernBERT: each layer's output through the norm
    after it and its normalised input equal those of transformers' hidden states (the residual
    stream) at the real tokens, the last layer's is the last hidden state, and the queries,
    keys and values are Wqkv's three blocks of that input (before the rotary turn)."""
    transformers = pytest.importorskip("transformers")
    from test_modernbert import batch

    from bertforge.training.distill_layers import qkv, traced

    torch.manual_seed(0)
    config = tiny()
    ours = ModernBertForSequenceClassification(config).eval()
    theirs = transformers.ModernBertForSequenceClassification(
        transformers.ModernBertConfig(**config.to_dict())
    ).eval()
    theirs.load_state_dict(ours.state_dict())
    ids, mask = batch(20)  # past the window of 4 either side
    real = mask.bool()
    with torch.no_grad():
        trace = traced(
            ours, lambda: ours(ids, mask, output_attentions=True, cls_only=False), [0, 1, 2]
        )
        states = theirs.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    layers = ours.model.layers
    norms = [layers[1].attn_norm, layers[2].attn_norm, ours.model.final_norm]
    for i in range(3):
        with torch.no_grad():
            after = norms[i](states.hidden_states[i + 1])
            before = layers[i].attn_norm(states.hidden_states[i])
        torch.testing.assert_close(trace.outputs[i][real], after[real], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(trace.inputs[i][real], before[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        trace.outputs[2][real], states.last_hidden_state[real], atol=1e-5, rtol=1e-5
    )
    assert (trace.outputs[1][~real] == 0).all()  # padding stays zero on the grid
    q, k, v = qkv(ours, trace, 1)
    weight = layers[1].attn.Wqkv.weight  # (3H, H): the q, k, v blocks
    H = config.hidden_size
    for got, block in zip((q, k, v), range(3), strict=True):
        want = trace.inputs[1] @ weight[block * H : (block + 1) * H].T
        torch.testing.assert_close(got, want)
    assert [a.shape for a in trace.attentions] == [(4, 2, 20, 20)] * 3
    assert (trace.attentions[1][0, :, 0, 5:] == 0).all()  # a local layer sees 4 either side


def hidden_losses(out: Path) -> list[float]:
    return [r["hidden_loss"] for r in read_metrics(out) if r["split"] == "train"]


def test_intermediate_losses_with_modernbert_on_either_side(models):
    """A ModernBERT teacher into its layers 0 and 2 with all three intermediate losses (layer 1
    of the student is a local layer mapped to the teacher's local layer 2), and a BERT teacher
    into a fresh ModernBERT with the hidden-state and relation losses: each runs, its
    hidden-state loss falls, and the student reloads in transformers with the same logits."""
    cases = {
        "modern-layers": (
            "teacher",
            ["--student_layers", "0", "2", "--attention_weight", "1", "--relation_weight", "1"],
        ),
        "bert-into-modern": (
            "bert_teacher",
            ["--student_preset", "tiny", "--student_architecture", "modernbert",
             "--relation_weight", "1", "--relation_heads", "2"],
        ),
    }  # fmt: skip
    for name, (teacher, options) in cases.items():
        out = models["root"] / f"layers-{name}"
        options = [*options, "--hidden_weight", "1", "--log_every", "1"]
        results = distill(models, out, *options, teacher=teacher)
        assert results["validation"]["accuracy"] >= 0.6, (name, results)
        losses = hidden_losses(out)
        assert len(losses) == 30 and 0 < np.mean(losses[-6:]) < 0.9 * np.mean(losses[:6]), losses
        train = [r for r in read_metrics(out) if r["split"] == "train"]
        assert "relation_loss" in train[0], train[0]
        assert ("attention_loss" in train[0]) == (name == "modern-layers")
        same_logits_in_transformers(out)
