"""ONNX export: ONNX Runtime runs the exported graph with the eager model's outputs (fp32 within
1e-4) at any batch size and length, int8 quantizes the Linear layers, and classify/embed run it
through ``--backend onnx``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import cli
from bertforge.errors import BertforgeError
from bertforge.modeling.model import BertForSequenceClassification, BertModel
from bertforge.tokenizer.wordpiece import Tokenizer

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from bertforge.inference.onnx import export_onnx, load_onnx  # noqa: E402
from bertforge.inference.predict import PoolingChoice, resolve_pooling  # noqa: E402

TEXTS = [
    "good",
    "the film was a long story about people who went to town and came back .",
    "a fine night",
    "bad bad bad film , the people went home .",
    "town",
]


@pytest.fixture(scope="module")
def classifier_dir(task_files, tmp_path_factory) -> Path:
    """A tiny 3-class classifier with weights far from their init (std 0.3), so every layer
    shapes the output, and a fine-tuning config recording its max_length."""
    root = tmp_path_factory.mktemp("onnx")
    mlm = task_files.tiny_start_model(root, kind="mlm")
    torch.manual_seed(1)
    model = BertForSequenceClassification.from_pretrained(
        mlm, num_labels=3, id2label={0: "neg", 1: "mid", 2: "pos"}
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" not in name:
                p.add_(torch.randn_like(p) * 0.3)
    out = root / "classifier"
    model.save_pretrained(out, tokenizer=Tokenizer.from_file(mlm))
    (out / "finetune_config.json").write_text(json.dumps({"max_length": 32}))
    return out


@pytest.fixture(scope="module")
def exported(classifier_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "onnx"
    assert (
        cli.main(
            ["export", "--model", str(classifier_dir), "--format", "onnx", "--output", str(out)]
        )
        == 0
    )
    return out


def _batch(tokenizer: Tokenizer, texts: list[str]) -> dict[str, np.ndarray]:
    encoded = [tokenizer.backend.encode(t).ids for t in texts]
    ids = np.zeros((len(texts), max(map(len, encoded))), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encoded):
        ids[i, : len(e)], mask[i, : len(e)] = e, 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def test_export_directory_holds_graph_config_tokenizer(exported: Path, classifier_dir: Path):
    names = {p.name for p in exported.iterdir()}
    assert {"model.onnx", "config.json", "vocab.txt", "tokenizer.json"} <= names
    assert json.loads((exported / "finetune_config.json").read_text()) == {"max_length": 32}
    graph = onnx.load(str(exported / "model.onnx")).graph
    onnx.checker.check_model(str(exported / "model.onnx"))
    for value in graph.input:  # batch and length are symbolic, not the sample's 2 x 8
        dims = value.type.tensor_type.shape.dim
        assert [d.dim_param for d in dims] == ["batch", "length"], value.name
    assert [o.name for o in graph.output] == ["logits", "last_hidden_state", "pooler_output"]
    assert (
        Tokenizer.from_file(exported).fingerprint == Tokenizer.from_file(classifier_dir).fingerprint
    )


@pytest.mark.parametrize("texts", [TEXTS, TEXTS[1:2], TEXTS[:4] * 3])
def test_onnx_runtime_equals_eager_fp32(exported: Path, classifier_dir: Path, texts):
    model = BertForSequenceClassification.from_pretrained(classifier_dir).eval()
    tokenizer = Tokenizer.from_file(classifier_dir)
    batch = _batch(tokenizer, texts)
    with torch.inference_mode():
        ref = model(**{k: torch.from_numpy(v) for k, v in batch.items()})
    session = load_onnx(exported)
    logits = session.sequence_logits(batch)
    assert logits.shape == (len(texts), 3)
    np.testing.assert_allclose(logits, ref.logits.numpy(), atol=1e-4, rtol=0)
    hidden = session.hidden_states(batch)
    real = batch["attention_mask"].astype(bool)  # the eager model leaves padding rows zero
    np.testing.assert_allclose(hidden[real], ref.hidden_states.numpy()[real], atol=1e-4, rtol=0)
    # not a degenerate, near-constant model: the logits are far above the 1e-4 tolerance (one
    # text's largest logit was 0.41 in one run and above 0.5 in others: the fixture's tokenizer
    # training is not byte-reproducible, huggingface/tokenizers#1794, so its ids and embeddings move)
    assert np.abs(ref.logits.numpy()).max() > 0.05


def test_encoder_export_and_embed_backend(classifier_dir: Path, tmp_path: Path, capsys):
    encoder_dir = tmp_path / "encoder"
    BertModel.from_pretrained(classifier_dir).save_pretrained(
        encoder_dir, tokenizer=Tokenizer.from_file(classifier_dir)
    )
    export_onnx(encoder_dir, tmp_path / "onnx")
    session = load_onnx(tmp_path / "onnx")
    assert session.output_names == ["last_hidden_state", "pooler_output"]
    model, tokenizer = BertModel.from_pretrained(encoder_dir), Tokenizer.from_file(encoder_dir)
    for pooling in ("cls", "mean"):
        ours = bertforge.embed(model, tokenizer, TEXTS, pooling, batch_size=2)
        theirs = bertforge.embed(session, tokenizer, TEXTS, pooling, batch_size=2)
        np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
    inputs = tmp_path / "texts.txt"
    inputs.write_text("\n".join(TEXTS) + "\n")
    for backend, model_dir in (("torch", encoder_dir), ("onnx", tmp_path / "onnx")):
        argv = ["embed", "--model", str(model_dir), "--input", str(inputs), "--pooling", "mean"]
        argv += ["--precision", "fp32"]  # `auto` is bf16 on a CPU with AVX512-BF16/AMX
        assert (
            cli.main([*argv, "--output", str(tmp_path / f"{backend}.npy"), "--backend", backend])
            == 0
        )
    np.testing.assert_allclose(
        np.load(tmp_path / "onnx.npy"), np.load(tmp_path / "torch.npy"), atol=1e-4, rtol=0
    )
    # an encoder has no classifier: classify says so
    capsys.readouterr()
    assert (
        cli.main(["classify", "--model", str(tmp_path / "onnx"), "--backend", "onnx", "good"]) == 2
    )
    assert "has no 'logits' output" in capsys.readouterr().err


def test_minilm_export_keeps_the_pooling_it_declares(minilm_dir: Path, tmp_path: Path, capsys):
    """The real all-MiniLM-L6-v2 declares mean pooling and a Normalize module (modules.json,
    1_Pooling/): its export carries that declaration, so embed gives the eager model's vectors
    by default on either backend (before, the export fell back to unnormalised cls)."""
    out = tmp_path / "minilm-onnx"
    argv = ["export", "--model", str(minilm_dir), "--format", "onnx", "--output", str(out)]
    assert cli.main(argv) == 0
    assert "pooling declaration for embed: 1_Pooling, modules.json" in capsys.readouterr().out
    inputs = tmp_path / "texts.txt"
    inputs.write_text("A man is eating food.\nThe new movie is awesome.\nhi\n")
    vectors, said = {}, {}
    for backend, model_dir in (("torch", minilm_dir), ("onnx", out)):
        argv = ["embed", "--model", str(model_dir), "--backend", backend, "--input", str(inputs)]
        argv += ["--output", str(tmp_path / f"{backend}.npy"), "--precision", "fp32"]
        assert cli.main(argv) == 0
        said[backend] = capsys.readouterr().err.split("; ", 1)[1]  # after "wrote FILE: N x H"
        vectors[backend] = np.load(tmp_path / f"{backend}.npy")
    assert said["onnx"] == said["torch"]
    assert said["onnx"].startswith(
        "mean pooling (declared in 1_Pooling/config.json), normalized (2_Normalize in modules.json)"
    )
    np.testing.assert_allclose(vectors["onnx"], vectors["torch"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(vectors["onnx"], axis=1), 1.0, atol=1e-5)
    # the Python API reads the declaration beside an export as beside a PyTorch model
    session = load_onnx(out)
    declared = ("declared in 1_Pooling/config.json", "2_Normalize in modules.json")
    assert resolve_pooling(session) == PoolingChoice("mean", True, *declared)
    assert resolve_pooling(session, "cls").normalize  # a given pooling keeps the Normalize


def test_an_export_without_backend_onnx_says_to_add_it(exported: Path, tmp_path: Path, capsys):
    inputs = tmp_path / "texts.txt"
    inputs.write_text("good\n")
    embed = ["embed", "--input", str(inputs), "--output", str(tmp_path / "v.npy")]
    for argv in (["classify", "good"], embed):
        assert cli.main([*argv, "--model", str(exported)]) == 2
        err = capsys.readouterr().err
        assert f"{exported}: an ONNX export (model.onnx, no model.safetensors)" in err, err
        assert "run it with --backend onnx" in err


def test_classify_backend_onnx_matches_torch(
    exported: Path, classifier_dir: Path, tmp_path, capsys
):
    results = {}
    for backend, model_dir in (("torch", classifier_dir), ("onnx", exported)):
        out = tmp_path / f"{backend}.jsonl"
        argv = ["classify", "--model", str(model_dir), "--backend", backend, "--batch_size", "2"]
        assert cli.main([*argv, "--precision", "fp32", "--output", str(out), *TEXTS]) == 0
        results[backend] = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["label"] for r in results["onnx"]] == [r["label"] for r in results["torch"]]
    for a, b in zip(results["onnx"], results["torch"], strict=True):
        assert a["scores"] == pytest.approx(b["scores"], abs=1e-5)
    argv = ["classify", "--model", str(exported), "--backend", "onnx", "--precision", "bf16", "x"]
    assert cli.main(argv) == 2
    assert "drop --precision bf16" in capsys.readouterr().err
    argv = ["classify", "--model", str(classifier_dir), "--backend", "onnx", "x"]
    assert cli.main(argv) == 2
    assert "no model.onnx; export the model first" in capsys.readouterr().err


def test_int8_quantizes_the_linear_layers(
    exported: Path, classifier_dir: Path, tmp_path: Path, caplog
):
    out = tmp_path / "int8"
    summary = export_onnx(classifier_dir, out, quantize="int8")
    assert not [r for r in caplog.records if "pre-processing" in r.getMessage()]  # ORT's advice
    assert summary["quantize"] == "int8"
    graph = onnx.load(str(out / "model.onnx")).graph
    ops = {node.op_type for node in graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops  # int8 GEMMs
    # a scale per output column of each weight matrix (per_channel), not one per matrix
    weight_scales = [i for i in graph.initializer if i.name.endswith("_scale") and i.dims]
    assert weight_scales and all(i.dims[0] > 1 for i in weight_scales)
    fp32_ops = {node.op_type for node in onnx.load(str(exported / "model.onnx")).graph.node}
    assert "MatMulInteger" not in fp32_ops
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in exported.iterdir())
    tokenizer = Tokenizer.from_file(classifier_dir)
    batch = _batch(tokenizer, TEXTS)
    ref = load_onnx(exported).sequence_logits(batch)
    got = load_onnx(out).sequence_logits(batch)
    # int8 rounds each weight to 1/255 of its column's range and each activation of a batch
    # likewise: close to fp32, not equal. This tiny model's large random weights (std 0.3) make
    # the error far larger than a trained model's (0.2 points of IMDB accuracy lost, see
    # benchmarks/quantize_options.py): RMS error 25-30% of the logits' RMS here, run to run
    assert not np.array_equal(got, ref)
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.95
    assert np.sqrt(((got - ref) ** 2).mean()) < 0.4 * np.sqrt((ref**2).mean())


def test_verify_checks_an_export_against_its_manifest(exported: Path, tmp_path: Path, capsys):
    """export writes a manifest last: verify says OK, then DAMAGED once model.onnx changes."""
    assert "model.onnx" in json.loads((exported / "manifest.json").read_text())["files"]
    capsys.readouterr()
    assert cli.main(["verify", str(exported)]) == 0
    assert f"OK         model      {exported}  (" in capsys.readouterr().out
    copy = shutil.copytree(exported, tmp_path / "copy")
    graph = bytearray((copy / "model.onnx").read_bytes())
    graph[-1] ^= 0xFF
    (copy / "model.onnx").write_bytes(bytes(graph))
    assert cli.main(["verify", str(copy)]) == 1
    assert f"DAMAGED    model      {copy}  (" in capsys.readouterr().out


def test_export_refuses_bad_requests(classifier_dir: Path, exported: Path, tmp_path: Path):
    with pytest.raises(BertforgeError, match="already exists and is not empty"):
        export_onnx(classifier_dir, exported)
    with pytest.raises(BertforgeError, match="no config.json"):
        export_onnx(tmp_path, tmp_path / "x")
    with pytest.raises(BertforgeError, match="choose int8"):
        export_onnx(classifier_dir, tmp_path / "y", quantize="int4")
    assert not (tmp_path / "y").exists()


def test_serve_runs_an_export_with_onnx_runtime(exported: Path, classifier_dir: Path, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from support.serve import request, serve

    encoder_dir = tmp_path / "encoder"
    BertModel.from_pretrained(classifier_dir).save_pretrained(
        encoder_dir, tokenizer=Tokenizer.from_file(classifier_dir)
    )
    export_onnx(encoder_dir, tmp_path / "encoder-onnx")
    models = {"clf": classifier_dir, "clf_onnx": exported, "enc_onnx": tmp_path / "encoder-onnx"}
    with serve(models) as (port, _):
        _, info = request(port, "GET", "/info")
        by_name = {m["name"]: m for m in info["models"]}
        assert by_name["clf_onnx"]["backend"] == "onnx" and by_name["clf"]["backend"] == "torch"
        assert by_name["clf_onnx"]["kind"] == "classifier"
        assert by_name["enc_onnx"]["kind"] == "encoder"
        assert by_name["clf_onnx"]["labels"] == ["neg", "mid", "pos"]
        assert by_name["clf_onnx"]["parameters"] > by_name["clf"]["parameters"] * 0.9
        answers = {}
        for name in ("clf", "clf_onnx"):
            status, answers[name] = request(
                port, "POST", "/predict", {"inputs": TEXTS, "model": name}
            )
            assert status == 200, answers[name]
        for a, b in zip(answers["clf_onnx"], answers["clf"], strict=True):
            assert a["label"] == b["label"] and a["scores"] == pytest.approx(b["scores"], abs=1e-5)
        body = {"inputs": TEXTS, "pooling": "mean", "model": "enc_onnx"}
        status, vectors = request(port, "POST", "/embed", body)
        model = BertModel.from_pretrained(encoder_dir)
        direct = bertforge.embed(model, Tokenizer.from_file(encoder_dir), TEXTS, "mean")
        assert status == 200
        np.testing.assert_allclose(np.array(vectors), direct, atol=1e-4, rtol=0)
        status, error = request(port, "POST", "/attention", {"inputs": "good", "model": "clf_onnx"})
        assert status == 422 and "needs a PyTorch model" in json.dumps(error)
        status, error = request(port, "POST", "/predict", {"inputs": "good", "model": "enc_onnx"})
        assert status == 422 and "needs a classifier model" in json.dumps(error)


def test_fused_and_standard_graphs_both_equal_eager_with_padding_anywhere(
    exported: Path, classifier_dir: Path, tmp_path: Path
):
    """The default export keeps standard ONNX operators; ``fuse=True`` uses ONNX Runtime's fused
    ones. Both give the eager outputs, the hidden states also when padding is on the left (the
    fused attention reads the 0/1 mask, not lengths derived from it; the logits read position 0,
    BERT's [CLS], so a classifier needs right padding)."""
    domains = {node.domain for node in onnx.load(str(exported / "model.onnx")).graph.node}
    assert domains <= {"", "ai.onnx"}
    fused = tmp_path / "fused"
    summary = export_onnx(classifier_dir, fused, fuse=True)
    assert summary["fused"]["Attention"] == 2  # one per layer of the 2-layer model
    fused_ops = [node.op_type for node in onnx.load(str(fused / "model.onnx")).graph.node]
    assert fused_ops.count("Attention") == 2
    assert "SkipLayerNormalization" in fused_ops and "Softmax" not in fused_ops
    int8 = export_onnx(classifier_dir, tmp_path / "fused-int8", fuse=True, quantize="int8")
    int8_ops = {node.op_type for node in onnx.load(int8["output"]).graph.node}
    assert "QAttention" in int8_ops and "Attention" not in int8_ops

    model = BertForSequenceClassification.from_pretrained(classifier_dir).eval()
    right = _batch(Tokenizer.from_file(classifier_dir), TEXTS)
    lengths = right["attention_mask"].sum(1)
    left = {
        k: np.stack([np.roll(r, -n) for r, n in zip(v, lengths, strict=True)])
        for k, v in right.items()
    }
    assert left["attention_mask"][0, 0] == 0 and left["attention_mask"][0, -1] == 1
    for batch in (right, left):
        with torch.inference_mode():
            ref = model(**{k: torch.from_numpy(v) for k, v in batch.items()})
        real = batch["attention_mask"].astype(bool)
        for directory in (exported, fused):
            session = load_onnx(directory)
            hidden = session.hidden_states(batch)[real]
            np.testing.assert_allclose(hidden, ref.hidden_states.numpy()[real], atol=1e-4, rtol=0)
            if batch is right:
                logits = session.sequence_logits(batch)
                np.testing.assert_allclose(logits, ref.logits.numpy(), atol=1e-4, rtol=0)
