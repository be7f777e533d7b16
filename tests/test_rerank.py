"""Rerankers: a fine-tuned pair classifier or regressor is a cross-encoder that
sentence-transformers' ``CrossEncoder(dir)`` loads with our scores; ``bertforge rerank`` ranks
candidates with it (or with an embedding model, by cosine); ``bertforge evaluate --retriever``
scores a first stage and its reranked top k on BEIR files."""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import QUICK_FINETUNE, TaskFiles, noise
from support.cli import run_cli

from bertforge import cli
from bertforge.data.encoding import encode_examples
from bertforge.evaluation.rerank import reranked_order
from bertforge.inference.loading import LoadOptions
from bertforge.inference.predict import embed
from bertforge.inference.rerank import load_reranker, pair_scores, rerank, score, sigmoid
from bertforge.modeling.model import BertModel
from bertforge.tokenizer.wordpiece import Tokenizer

QUERY = "where is good ?"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A tiny start and two cross-encoders fine-tuned from it on (query, passage) pairs whose
    passage holds "good" when relevant: a regressor on 0/1 and a two-class classifier."""
    root = tmp_path_factory.mktemp("rerank")
    start = TaskFiles.tiny_start_model(root, kind="mlm")
    rng = random.Random(0)
    rows = [
        {"query": QUERY, "passage": ("good " if i % 2 else "bad ") + noise(rng), "label": i % 2}
        for i in range(48)
    ]
    TaskFiles.write_rows(root / "train.csv", rows)
    shutil.copytree(start, root / "encoder")  # an embedding model: mean pooling declared
    TaskFiles.declare_mean_pooling(root / "encoder", 32)
    out = {"start": start, "encoder": root / "encoder"}
    for task in ("regression", "classification"):
        argv = ["finetune", "--model", str(start), "--train", str(root / "train.csv")]
        argv += ["--output", str(root / task), "--task", task, "--text_column", "query"]
        argv += ["--text_pair_column", "passage", *QUICK_FINETUNE, "--max_steps", "3"]
        with contextlib.redirect_stderr(io.StringIO()):
            assert cli.main(argv) == 0
        out[task] = root / task
    # from a start that declares its pooling (as all-MiniLM-L6-v2 does): a cross-encoder still
    argv = ["finetune", "--model", str(root / "encoder"), "--train", str(root / "train.csv")]
    argv += ["--output", str(root / "from-encoder"), "--text_column", "query"]
    argv += ["--text_pair_column", "passage", *QUICK_FINETUNE, "--max_steps", "3"]
    with contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(argv) == 0
    out["from-encoder"] = root / "from-encoder"
    return out


def candidates(n: int = 7) -> list[str]:
    rng = random.Random(1)  # longer than --max_length 16 with the query: truncated pairs
    return [("good " if i % 3 else "bad ") + noise(rng, rng.randint(2, 12)) for i in range(n)]


@pytest.mark.parametrize("task", ["regression", "classification", "from-encoder"])
def test_cross_encoder_loads_a_finetuned_pair_model_with_the_same_scores(models, task, caplog):
    """Also from a start declaring mean pooling: its modules.json is not carried over, which
    would make sentence-transformers read the cross-encoder as a bi-encoder."""
    from sentence_transformers import CrossEncoder

    assert not (models[task] / "modules.json").exists()
    assert (models["encoder"] / "modules.json").exists()

    texts = candidates()
    ours = load_reranker(LoadOptions(model=str(models[task]), precision="fp32"))
    theirs = CrossEncoder(str(models[task]), device="cpu")
    assert "Converting SentenceTransformer" not in caplog.text
    predicted = np.asarray(theirs.predict([(QUERY, t) for t in texts]), dtype=np.float64)
    if task == "regression":  # one output: the value itself, no sigmoid
        np.testing.assert_allclose(score(ours, QUERY, texts), predicted, atol=1e-5)
        ranked = theirs.rank(QUERY, texts)
        assert [r["corpus_id"] for r in ranked] == [r["index"] for r in rerank(ours, QUERY, texts)]
    else:  # (N, 2) logits; our score is the second class's log-odds
        np.testing.assert_allclose(
            score(ours, QUERY, texts), predicted[:, 1] - predicted[:, 0], atol=1e-5
        )


def test_pair_truncation_is_tokenizers_longest_first(models):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(models["start"]))
    ours = Tokenizer.from_file(models["start"])
    rng = random.Random(2)
    for _ in range(60):
        a, b = " ".join(["good"] * rng.randint(1, 14)), " ".join(["bad"] * rng.randint(1, 14))
        m = rng.randint(5, 24)
        expected = theirs(a, b, truncation=True, max_length=m)["input_ids"]
        assert encode_examples(ours, [a], [b], max_length=m)[0][0].tolist() == expected, (a, b, m)


def test_pair_scores_and_sigmoid_by_hand():
    assert pair_scores(np.array([[0.5], [-2.0]])).tolist() == [0.5, -2.0]
    assert pair_scores(np.array([[1.0, 3.0], [2.0, 0.5]])).tolist() == [2.0, -1.5]
    np.testing.assert_allclose(sigmoid(np.array([0.0, np.log(3.0), -800.0])), [0.5, 0.75, 0.0])
    with pytest.raises(ValueError):
        pair_scores(np.zeros((2, 3)))


def test_reranked_order_reorders_the_top_k_only():
    # first stage: doc 2 > 0 > 3 > 1; the reranker prefers 3 over 0 over 2 (the top 3)
    sim = np.array([[0.8, 0.1, 0.9, 0.5]])
    second = {2: 0.1, 0: 0.5, 3: 0.9}
    order = reranked_order(sim, 3, lambda row, top: np.array([second[i] for i in top]))
    assert np.argsort(-order[0]).tolist() == [3, 0, 2, 1]
    same = reranked_order(sim, 1, lambda row, top: np.zeros(len(top)))
    assert np.argsort(-same[0]).tolist() == [2, 0, 3, 1]


def test_rerank_command_ranks_a_jsonl_file_and_text_lines(models, tmp_path, capsys):
    texts = candidates(5)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "c.txt").write_text("\n".join(texts) + "\n")
    reranker = load_reranker(LoadOptions(model=str(models["regression"]), precision="fp32"))
    expected = np.argsort(-score(reranker, QUERY, texts), kind="stable").tolist()
    for name in ("c.jsonl", "c.txt"):
        argv = ["rerank", "--model", str(models["regression"]), "--query", QUERY]
        code, out, err = run_cli(
            [*argv, "--input", str(tmp_path / name), "--precision", "fp32"], capsys
        )
        assert code == 0, err
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["index"] for r in rows] == expected and [r["rank"] for r in rows] == [
            1,
            2,
            3,
            4,
            5,
        ]
        assert [r["text"] for r in rows] == [texts[i] for i in expected]
        assert "cross-encoder" in err
    # an embedding model ranks by the cosine of the vectors; --top_k keeps the best
    code, out, err = run_cli(
        [
            "rerank",
            "--model",
            str(models["encoder"]),
            "--query",
            QUERY,
            *texts,
            "--top_k",
            "2",
            "--precision",
            "fp32",
        ],
        capsys,
    )
    assert code == 0, err
    model = BertModel.from_pretrained(models["encoder"])
    vectors = embed(model, Tokenizer.from_file(models["encoder"]), [QUERY, *texts]).astype(
        np.float64
    )
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cosines = unit[1:] @ unit[0]
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["index"] for r in rows] == np.argsort(-cosines, kind="stable")[:2].tolist()
    np.testing.assert_allclose([r["score"] for r in rows], np.sort(cosines)[::-1][:2], atol=1e-5)


def test_evaluate_with_a_retriever_scores_both_stages(models, tmp_path, capsys):
    rng = random.Random(3)
    docs = [("good " if i % 4 == 0 else "bad ") + noise(rng, 6) for i in range(12)]
    queries = [f"where is good {noise(rng, 2)}" for _ in range(6)]
    (tmp_path / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": q}) + "\n" for i, q in enumerate(queries))
    )
    (tmp_path / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": d}) + "\n" for i, d in enumerate(docs))
    )
    qrels = "".join(f"q{i}\td{4 * (i % 3)}\t1\n" for i in range(6))
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    beir = [
        "--queries",
        str(tmp_path / "queries.jsonl"),
        "--corpus",
        str(tmp_path / "corpus.jsonl"),
    ]
    beir += ["--qrels", str(tmp_path / "qrels.tsv"), "--precision", "fp32"]
    code, _, err = run_cli(
        [
            "evaluate",
            "--model",
            str(models["encoder"]),
            *beir,
            "--output",
            str(tmp_path / "alone.json"),
        ],
        capsys,
    )
    assert code == 0, err
    alone = json.loads((tmp_path / "alone.json").read_text())
    results = {}
    for model, k in (("regression", 5), ("encoder", 12), ("regression", 1)):
        out = tmp_path / f"{model}-{k}.json"
        argv = ["evaluate", "--model", str(models[model]), "--retriever", str(models["encoder"])]
        code, stdout, err = run_cli([*argv, *beir, "--top_k", str(k), "--output", str(out)], capsys)
        assert code == 0, err
        results[model, k] = json.loads(out.read_text())
        assert f"reranked@{k}" in stdout and results[model, k]["task"] == "reranking"
        for name in ("mrr@10", "ndcg@10"):  # the first stage is the retriever evaluated alone
            assert results[model, k]["retriever"][name] == pytest.approx(alone[name])
    # the same model reranking all it retrieved, or a reranker seeing one document: no change
    assert results["encoder", 12]["reranked"] == pytest.approx(results["encoder", 12]["retriever"])
    assert results["regression", 1]["reranked"] == pytest.approx(
        results["regression", 1]["retriever"]
    )


def test_a_published_retriever_is_named_as_a_model_is(models, minilm_dir, tmp_path):
    """``--retriever all-MiniLM-L6-v2`` loads the installed copy, as ``--model`` does."""
    from bertforge.training.evaluate import EvaluateConfig

    files = {name: str(tmp_path / name) for name in ("queries", "corpus", "qrels")}
    cfg = EvaluateConfig(model=str(models["classification"]), retriever="all-MiniLM-L6-v2", **files)
    assert Path(cfg.retriever) == minilm_dir
