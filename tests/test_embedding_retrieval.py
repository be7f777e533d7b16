"""Retrieval of a sentence-embedding model scored from a test set in BEIR files (queries, a
corpus, graded relevance judgments): the metrics on hand-computed cases (graded nDCG, ties,
queries with two relevant documents), the files read as BEIR lays them out (compressed too),
``bertforge evaluate --queries --corpus --qrels`` end to end equal to the metric functions on
the model's own vectors, and every bad input as a one-line error naming ``file:line``."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import TaskFiles
from support.cli import one_line_error

import bertforge
from bertforge import cli
from bertforge.data.retrieval import RetrievalData, load_beir
from bertforge.evaluation.embedding import cosine_all, retrieval_scores
from bertforge.evaluation.metrics import retrieval_metrics, retrieval_per_query
from bertforge.modeling.model import BertModel
from bertforge.tokenizer.wordpiece import Tokenizer

# ---- the metrics by hand ----------------------------------------------------------------------


def test_graded_ndcg_mrr_and_recall_by_hand():
    sim = np.array(
        [
            [0.9, 0.8, 0.7, 0.6, 0.5],  # ranks d0..d4: grade 1 at rank 2, grade 2 at rank 4
            [0.1, 0.2, 0.3, 0.4, 0.5],  # its one relevant document (grade 3) ranks 5th
            [0.5, 0.5, 0.5, 0.5, 0.5],  # a tie: the less relevant first, so grade 1 at 4, 2 at 5
        ]
    )
    grades = np.array([[0, 1, 0, 2, 0], [3, 0, 0, 0, 0], [0, 0, 1, 0, 2]])
    per = retrieval_per_query(sim, grades)
    ideal_21 = 2 + 1 / math.log2(3)  # grades 2 then 1 at ranks 1 and 2
    np.testing.assert_allclose(
        per["ndcg@10"],
        [
            (1 / math.log2(3) + 2 / math.log2(5)) / ideal_21,
            (3 / math.log2(6)) / 3,
            (1 / math.log2(5) + 2 / math.log2(6)) / ideal_21,
        ],
    )
    np.testing.assert_allclose(per["mrr@10"], [1 / 2, 1 / 5, 1 / 4])
    assert per["recall@1"].tolist() == [0.0, 0.0, 0.0]
    assert per["recall@10"].tolist() == per["recall@100"].tolist() == [1.0, 1.0, 1.0]
    means = retrieval_metrics(sim, grades)
    assert means["ndcg@10"] == pytest.approx(per["ndcg@10"].mean())
    # binary judgments: booleans and grade 1 are the same thing
    assert retrieval_metrics(sim, grades > 0) == retrieval_metrics(sim, (grades > 0).astype(int))


def test_recall_at_k_counts_the_relevant_documents_in_the_top_k():
    sim = np.tile(np.linspace(1.0, 0.0, 12), (2, 1))  # both queries rank d0..d11 in order
    grades = np.zeros((2, 12), dtype=int)
    grades[0, 10] = 1  # rank 11: out of the top 10
    grades[1, [0, 11]] = [1, 2]  # two relevant: rank 1 (grade 1) and rank 12 (grade 2)
    per = retrieval_per_query(sim, grades)
    assert per["mrr@10"].tolist() == [0.0, 1.0]
    assert per["recall@1"].tolist() == [0.0, 0.5]
    assert per["recall@10"].tolist() == [0.0, 0.5]
    assert per["recall@100"].tolist() == [1.0, 1.0]
    assert per["ndcg@10"][0] == 0.0
    assert per["ndcg@10"][1] == pytest.approx(1 / (2 + 1 / math.log2(3)))
    with pytest.raises(ValueError, match="every query needs one above 0"):
        retrieval_per_query(sim, np.zeros((2, 12)))


def test_scores_in_blocks_of_queries_equal_one_block_and_skip_the_query_itself():
    rng = np.random.default_rng(0)
    q, d = rng.standard_normal((7, 4)), rng.standard_normal((9, 4))
    picks = zip(rng.integers(0, 9, 7), rng.integers(1, 4, 7), strict=True)
    judgments = [{int(i): int(g)} for i, g in picks]  # a relevant document per query, graded
    data = RetrievalData([f"q{i}" for i in range(7)], [f"d{i}" for i in range(9)], judgments)
    whole = retrieval_metrics(cosine_all(q, d), data.relevance(0, 7))
    for cells in (1, 20, 10_000):  # 1 query, 2 queries, every query per block
        blocks = retrieval_scores(data, q, d, chunk_cells=cells)
        assert blocks == pytest.approx(whole, abs=1e-12)
    # a query's own document (its text in the corpus, not judged relevant) is not ranked for it
    d2 = np.vstack([d, q[0]])  # document 9 is query 0 itself: it would rank first
    with_itself = RetrievalData(["q0"], [*data.documents, "q0"], [{0: 1}])
    assert retrieval_scores(with_itself, q[:1], d2)["recall@1"] == 0.0
    with_itself.own_documents = [9]
    alone = retrieval_scores(RetrievalData(["q0"], data.documents, [{0: 1}]), q[:1], d)
    assert retrieval_scores(with_itself, q[:1], d2) == pytest.approx(alone)


# ---- the files ----------------------------------------------------------------------------------


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


CORPUS = [
    {"_id": "d1", "title": "music", "text": "the film had music at night ."},
    {"_id": "d2", "title": "", "text": "a story about a town ."},
    {"_id": "d3", "text": "the actors and the plot ."},
    {"_id": "q4", "title": "scene", "text": "a scene in the day ."},
    {"_id": "7", "text": "some good movie ."},
    {"_id": "d5", "title": "day", "text": "one day in the film ."},
]
QUERIES = [
    {"_id": "q1", "text": "music at night"},
    {"_id": "q2", "text": "a town story"},
    {"_id": "q3", "text": "who acted"},  # judged 0 only: skipped
    {"_id": "q4", "text": "a scene in the day ."},  # in the corpus too (as ArguAna's are)
    {"_id": "q5", "text": "not judged"},  # not in the qrels: skipped
    {"_id": "7", "text": "a good movie"},  # numbered as its relevant document
]
QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td5\t1\nq2\td2\t1\nq2\td1\t0\n"
QRELS += "q3\td3\t0\nq4\td5\t1\n7\t7\t1\n"


def write_beir(root: Path, compress: str = "") -> tuple[Path, Path, Path]:
    """The test set above as BEIR files in ``root`` (``compress``: "", ".gz", ".bz2" or ".xz")."""
    opener = {"": open, ".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}[compress]
    paths = []
    for name, text in (
        ("queries.jsonl", _jsonl(QUERIES)),
        ("corpus.jsonl", _jsonl(CORPUS)),
        ("qrels.tsv", QRELS),
    ):
        path = root / (name + compress)
        with opener(path, "wt", encoding="utf-8") as f:
            f.write(text)
        paths.append(path)
    return paths[0], paths[1], paths[2]


@pytest.mark.parametrize("compress", ["", ".gz", ".bz2", ".xz"])
def test_beir_files_are_read_as_beir_lays_them_out(tmp_path, compress):
    data = load_beir(*write_beir(tmp_path, compress))
    assert data.queries == [
        "music at night",
        "a town story",
        "a scene in the day .",
        "a good movie",
    ]
    assert data.skipped == 2  # q3 (judged 0 only) and q5 (not judged)
    assert data.documents == [
        "music the film had music at night .",  # title + " " + text
        "a story about a town .",  # an empty title adds nothing
        "the actors and the plot .",
        "scene a scene in the day .",
        "some good movie .",
        "day one day in the film .",
    ]
    assert data.judgments == [{0: 2, 5: 1}, {1: 1}, {5: 1}, {4: 1}]  # grade 0 is not relevant
    assert data.relevance(1, 3).tolist() == [[0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1]]
    assert data.relevance(0, 1).tolist() == [[2, 0, 0, 0, 0, 1]]
    # q4's own document is left out of its ranking; 7's is the one judged relevant: ranked
    assert data.own_documents == [None, None, 3, None]


# ---- the command end to end -----------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Path:
    """A tiny, untrained encoder declaring mean pooling: a sentence-embedding model."""
    root = tmp_path_factory.mktemp("retrieval")
    model = TaskFiles.tiny_start_model(root, kind="mlm")
    TaskFiles.declare_mean_pooling(model, 32)
    return model


def test_evaluate_scores_beir_files_as_the_metrics_do_on_the_models_vectors(
    embedder, tmp_path, capsys
):
    queries, corpus, qrels = write_beir(tmp_path, ".gz")
    argv = ["evaluate", "--model", str(embedder), "--queries", str(queries)]
    argv += ["--corpus", str(corpus), "--qrels", str(qrels), "--batch_size", "2"]
    argv += ["--precision", "fp32", "--num_threads", "1", "--progress", "false"]
    assert cli.main([*argv, "--output", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["task"] == "retrieval"
    assert (result["queries"], result["documents"], result["skipped_queries"]) == (4, 6, 2)
    assert "4 queries over 6 documents (2 queries without a relevant document skipped" in out
    assert "max length 64 tokens (its max_position_embeddings)" in out  # the length it used
    assert "like for like" not in out  # no start model to compare with
    assert "constant" in out and "random" in out and "ndcg@10" in out

    data = load_beir(queries, corpus, qrels)
    model, tokenizer = BertModel.from_pretrained(embedder), Tokenizer.from_file(embedder)
    q = bertforge.embed(model, tokenizer, data.queries)  # mean pooling, as the model declares
    d = bertforge.embed(model, tokenizer, data.documents)
    similarity = cosine_all(q, d)
    similarity[2, 3] = -np.inf  # q4's own document
    expected = retrieval_metrics(similarity, data.relevance(0, len(data)))
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-6), name
    assert set(result["baselines"]) == {"constant", "random"}
    assert result["baselines"]["constant"]["recall@1"] == 0.0  # every tie ranks the relevant last
    assert result["data"] == {"queries": str(queries), "corpus": str(corpus), "qrels": str(qrels)}


# ---- bad input ------------------------------------------------------------------------------

BAD_FILES = [
    ("qrels.tsv", QRELS + "q1\td2\n", "qrels.tsv:9: 2 fields where qrels have 3"),
    ("qrels.tsv", QRELS + "q1\td2\t1.5\n", "qrels.tsv:9: score '1.5' is not an integer"),
    ("qrels.tsv", QRELS + "q9\td2\t1\n", """qrels.tsv:9: query-id 'q9' is not an "_id" of"""),
    ("qrels.tsv", QRELS + "q1\td9\t1\n", """qrels.tsv:9: corpus-id 'd9' is not an "_id" of"""),
    ("qrels.tsv", QRELS + "q1\td1\t1\n", "qrels.tsv:9: query 'q1' and document 'd1' were judged"
     " 2 on line 2, here 1"),
    ("corpus.jsonl", _jsonl([*CORPUS, CORPUS[1]]), "corpus.jsonl:7: duplicate _id 'd2' (first on"
     " line 2)"),
    ("queries.jsonl", _jsonl([*QUERIES, {"_id": "q1", "text": "again"}]),
     "queries.jsonl:7: duplicate _id 'q1' (first on line 1)"),
    ("queries.jsonl", _jsonl([*QUERIES, {"text": "no id"}]), 'queries.jsonl:7: no "_id" in this'),
    ("corpus.jsonl", _jsonl([*CORPUS, {"_id": "d9", "title": "t"}]),
     'corpus.jsonl:7: no "text" in this line'),
    ("qrels.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t0\n", "qrels.tsv: judges no query"),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, content, message", BAD_FILES, ids=[m.split(": ")[1][:24] for _, _, m in BAD_FILES]
)
def test_bad_beir_files_are_one_line_errors_naming_the_line(
    embedder, tmp_path, capsys, name, content, message
):
    queries, corpus, qrels = write_beir(tmp_path)
    (tmp_path / name).write_text(content, encoding="utf-8")
    argv = ["evaluate", "--model", str(embedder), "--queries", str(queries)]
    err = one_line_error([*argv, "--corpus", str(corpus), "--qrels", str(qrels)], capsys)
    assert message in err, err
    if '"_id" of' in message:  # names the file the id is missing from
        missing_from = err.split('"_id" of ')[1].split(";")[0]
        assert missing_from == str(queries if "query-id" in message else corpus)


@pytest.mark.parametrize(
    "given, message",
    [
        (["--queries"], "--queries without --corpus and --qrels: --queries, --corpus and --qrels "
         "go together"),
        (["--queries", "--qrels"], "--queries and --qrels without --corpus"),
        (["--corpus"], "--corpus without --queries and --qrels"),
        (["--queries", "--corpus", "--qrels", "--data"], "--data and --queries/--corpus/--qrels"),
        ([], "give --data FILE (or, for a sentence-embedding model, --queries, --corpus"),
    ],
)  # fmt: skip
def test_the_retrieval_files_go_together(embedder, tmp_path, capsys, given, message):
    queries, corpus, qrels = write_beir(tmp_path)
    files = {"--queries": queries, "--corpus": corpus, "--qrels": qrels, "--data": queries}
    argv = ["evaluate", "--model", str(embedder)]
    for option in given:
        argv += [option, str(files[option])]
    assert message in one_line_error(argv, capsys)


def test_the_retrieval_files_need_a_sentence_embedding_model(start, tmp_path, capsys):
    queries, corpus, qrels = write_beir(tmp_path)
    argv = ["evaluate", "--model", str(start), "--queries", str(queries)]
    err = one_line_error([*argv, "--corpus", str(corpus), "--qrels", str(qrels)], capsys)
    assert "is not a sentence-embedding model (BertForMaskedLM)" in err
