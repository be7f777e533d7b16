"""``evaluate(cfg)`` (the command ``bertforge evaluate``): a pretrained masked-language model on
a text file (next to a random-initialised network of the same shape), or a fine-tuned
classifier/regressor, token classifier or question-answering model on a labelled file (with the
per-class report and a trivial baseline), or a sentence-embedding model on pairs (STS or
retrieval scores beside constant and random vectors) or on a retrieval test set in BEIR files
(queries, a corpus, relevance judgments). It sits in the training layer because it reads what
``bertforge finetune`` recorded beside the model (:data:`~bertforge.training.finetune.RESULTS_FILE`,
the training split's baseline)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bertforge import runtime
from bertforge.data.encoding import encode_examples
from bertforge.data.labelled import load_labelled
from bertforge.data.pairs import load_pairs
from bertforge.data.qa import encode_windows, read_qa
from bertforge.data.retrieval import load_beir
from bertforge.data.tagging import encode_tagged, read_tagged, tag_ids
from bertforge.errors import BertforgeError
from bertforge.evaluation.embedding import baselines, model_vectors, score_vectors, scores_table
from bertforge.evaluation.mlm import (
    comparison_table,
    evaluate_mlm,
    frequency_guesser,
    mlm_text_batches,
    random_init_like,
)
from bertforge.evaluation.qa import (
    evaluate_qa_model,
    leading_words_baseline,
    mean_answer_words,
    qa_report,
    squad_metrics,
)
from bertforge.evaluation.rerank import rerank_scores
from bertforge.evaluation.tagging import evaluate_tagging_model, tagging_report
from bertforge.evaluation.task_scores import baseline_warning, evaluate_sequence_model, task_report
from bertforge.inference.loading import finetune_defaults, load_model
from bertforge.inference.rerank import load_reranker, score
from bertforge.io import atomic_write_text, read_json_object
from bertforge.modeling.auto import bert_architectures
from bertforge.modeling.checkpoint import check_model_directory, resolve_model
from bertforge.modeling.config import AnyConfig, load_config
from bertforge.modeling.model import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.modeling.pooling import declared_max_length, declared_pooling
from bertforge.training.finetune import RESULTS_FILE
from bertforge.training.options import ModelOptions, TaskOptions


@dataclass(kw_only=True)
class EvaluateConfig(ModelOptions, TaskOptions):
    """Options of ``bertforge evaluate``."""

    data: list[str] = field(default_factory=list)
    """A text file (pretrained MLM), labelled CSV/TSV/JSONL or Parquet file(s) or a datasets
    folder (fine-tuned classifier),
    CoNLL-style / tokens+tags JSONL file(s) (token classifier), a SQuAD file (question
    answering) or pairs (sentence embedding)."""
    queries: str | None = None
    """Sentence-embedding model, retrieval in BEIR files: queries.jsonl, one {"_id", "text"} per
    line (with --corpus and --qrels, instead of --data)."""
    corpus: str | None = None
    """The corpus searched: corpus.jsonl, one {"_id", "title" (optional), "text"} per line,
    embedded as title + " " + text."""
    qrels: str | None = None
    """Relevance judgments: a TSV file with the header query-id, corpus-id, score (an integer:
    0 not relevant, 1, 2, ... relevant, higher better); queries without a relevant document are
    skipped and counted."""
    retriever: str | None = None
    """With --queries, --corpus and --qrels: an embedding model (directory) that retrieves first;
    --model (a cross-encoder, or an embedding model) then reranks each query's top --top_k,
    and the scores of both orders are printed (nDCG@10 / MRR@10 before and after)."""
    top_k: int = 100
    """With --retriever: documents per query the reranker re-orders."""
    batch_size: int = 64
    """Texts per forward pass."""
    label_column: str | None = None
    """Column holding the label (default: as in fine-tuning, else label)."""
    max_sequences: int | None = None
    """MLM: evaluate at most N sequences (None = all)."""
    seed: int = 0
    """MLM: seed of the masks and of the random-init baseline."""
    output: str | None = None
    """Also write the results to this JSON file."""
    plot: str | None = None
    """Fine-tuned model: write its confusion matrix / scatter plot to this PNG."""
    encoding_errors: Literal["strict", "replace"] = "strict"
    """Bytes that are not UTF-8 stop the evaluation naming where (strict) or become U+FFFD
    (replace)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        retrieval = {"--queries": self.queries, "--corpus": self.corpus, "--qrels": self.qrels}
        given = [name for name, path in retrieval.items() if path]
        if given and len(given) < len(retrieval):
            missing = " and ".join(name for name, path in retrieval.items() if not path)
            raise BertforgeError(
                f"{' and '.join(given)} without {missing}: --queries, --corpus and --qrels go "
                "together (a retrieval test set in BEIR files); give all three"
            )
        if given and self.data:
            raise BertforgeError(
                "--data and --queries/--corpus/--qrels: give one test set, a file of pairs "
                "(--data) or the three BEIR files"
            )
        if self.retriever:  # a published name as --model takes it (all-MiniLM-L6-v2)
            self.retriever = resolve_model(self.retriever)
        if self.retriever and not given:
            raise BertforgeError(
                "--retriever reranks the first stage of a retrieval test set: give --queries, "
                "--corpus and --qrels (BEIR files) with it"
            )
        if self.top_k < 1:
            raise BertforgeError(f"--top_k {self.top_k}: give 1 or more documents to rerank")
        if not given and not self.data:
            raise BertforgeError(
                "give --data FILE (or, for a sentence-embedding model, --queries, --corpus and "
                "--qrels)"
            )


TASK_HEADS = (
    "BertForTokenClassification",
    "BertForSequenceClassification",
    "BertForQuestionAnswering",
)
"""Architectures evaluated by their task; an encoder without one of these heads that is a
``BertModel`` or declares its pooling is a sentence-embedding model."""


def is_embedding_model(directory: str, config: AnyConfig) -> bool:
    """An encoder without a task head that is a ``BertModel`` (or a ``ModernBertModel``) or
    declares its pooling."""
    architectures = bert_architectures(config)
    return not set(TASK_HEADS) & set(architectures) and (
        "BertModel" in architectures or bool(declared_pooling(directory)[0])
    )


def evaluate(cfg: EvaluateConfig) -> dict[str, Any]:
    """Evaluate ``cfg.model`` on ``cfg.data`` (or the retrieval files ``cfg.queries``,
    ``cfg.corpus``, ``cfg.qrels``) as its architecture asks (a token classifier, a sequence
    classifier/regressor, a question-answering model, a sentence-embedding model, else a masked
    LM), print the scores beside their baseline, write them to ``cfg.output`` when given, and
    return them."""

    config = load_config(check_model_directory(cfg.model))  # BERT's or ModernBERT's
    architectures = bert_architectures(config)
    embedding = is_embedding_model(cfg.model, config)
    if cfg.retriever:
        result = _evaluate_reranking(cfg)
    elif cfg.queries and not embedding:
        kind = ", ".join(architectures) or "no architecture"
        raise BertforgeError(
            f"{cfg.model} is not a sentence-embedding model ({kind}); --queries/--corpus/--qrels "
            "score an encoder alone or a model declaring its pooling: evaluate this one on --data"
        )
    elif cfg.queries:
        result = _evaluate_retrieval_files(cfg)
    elif "BertForTokenClassification" in architectures:
        result = _evaluate_tagging_model(cfg, config)
    elif "BertForSequenceClassification" in architectures:
        result = _evaluate_task_model(cfg, config)
    elif "BertForQuestionAnswering" in architectures:
        result = _evaluate_qa_model(cfg)
    elif embedding:
        result = _evaluate_embedding_model(cfg)
    else:
        result = _evaluate_mlm_model(cfg, config)
    result["peak_memory_bytes"] = runtime.peak_memory_bytes()
    if cfg.output:
        atomic_write_text(cfg.output, json.dumps(result, indent=2) + "\n")
        print(f"results: {cfg.output}", file=sys.stderr)
    return result


def _evaluate_task_model(cfg: EvaluateConfig, config: Any) -> dict[str, Any]:

    start = time.perf_counter()
    ft = finetune_defaults(cfg.model)
    model, tokenizer, options = load_model(BertForSequenceClassification, cfg)
    task = "regression" if config.is_regression else "classification"
    data, _ = load_labelled(
        cfg.data,
        text_column=cfg.text_column or ft.get("text_column", "text"),
        label_column=cfg.label_column or ft.get("label_column", "label"),
        text_pair_column=cfg.text_pair_column or ft.get("text_pair_column"),
        task=task,
        label2id=None if config.is_regression else config.label2id,
        encoding_errors=cfg.encoding_errors,
    )
    encoded = encode_examples(
        tokenizer,
        data.texts,
        data.pairs,
        max_length=next(
            v
            for v in (cfg.max_length, ft.get("max_length"), config.max_position_embeddings)
            if v is not None
        ),
        truncation=cfg.truncation or ft.get("truncation", "head"),
    )
    more = f" + {len(cfg.data) - 1} more" if len(cfg.data) > 1 else ""
    metrics, predictions = evaluate_sequence_model(
        model,
        encoded,
        data.labels,
        tokenizer.pad_id,
        **options,
    )
    title = Path(cfg.data[0]).name + more
    report = task_report(
        config,
        data.labels,
        predictions,
        _training_baseline(cfg.model, config),
        plot=cfg.plot,
        plot_title=title,
    )
    result = {
        "model": cfg.model,
        "data": cfg.data,
        "task": task,
        **metrics,
        "seconds": round(time.perf_counter() - start, 1),
        **report,
    }
    lines = [f"{k}: {metrics[k]:.4f}" for k in metrics if k not in ("examples",)]
    lines.append(f"examples: {metrics['examples']:,} ({result['seconds']}s)")
    if "report_text" in report:
        lines += ["", report["report_text"]]
    base = report["baseline"]
    lines.append(
        f"baseline (always {base['predicts']!r}, {base['definition']}): "
        + ", ".join(f"{k} {base[k]:.4f}" for k in metrics if k in base)
    )
    metric = ft.get("metric") or ("spearman" if config.is_regression else "accuracy")
    warning = baseline_warning(metric, metrics[metric], base)
    print("\n".join(lines + ([warning] if warning else [])))
    return result


def _evaluate_embedding_model(cfg: EvaluateConfig) -> dict[str, Any]:
    """A sentence-embedding model (an encoder alone, or one declaring its pooling): STS scores
    of scored pairs (--label_column), retrieval scores of pairs (each anchor's positive among
    every positive and hard negative of the file), beside constant and random vectors."""
    start = time.perf_counter()
    ft = finetune_defaults(cfg.model)
    pair_column = cfg.text_pair_column or ft.get("text_pair_column")
    if pair_column is None:
        raise BertforgeError(
            f"{cfg.model} is a sentence-embedding model: evaluate it on pairs, naming the "
            "columns with --text_column and --text_pair_column (and --label_column for "
            "STS-style scores)"
        )
    recorded = cfg.text_pair_column is None  # the columns of fine-tuning, hard negatives too
    data = load_pairs(
        cfg.data,
        text_column=cfg.text_column or ft.get("text_column", "text"),
        text_pair_column=pair_column,
        negative_column=ft.get("negative_column") if recorded else None,
        label_column=cfg.label_column or ft.get("label_column"),
        encoding_errors=cfg.encoding_errors,
    )
    model, tokenizer, options = load_model(BertModel, cfg)
    length = embedding_length(cfg.model, cfg.max_length, model.config.max_position_embeddings)
    vectors = model_vectors(model, tokenizer, max_length=length["max_length"], **options)
    metrics = score_vectors(data, vectors)
    base = baselines(data, model.config.hidden_size)
    table = scores_table({"model": metrics, **base})
    kind = "sts" if data.kind == "scored" else "retrieval"
    seconds = round(time.perf_counter() - start, 1)
    print(f"{kind}: {len(data):,} pairs ({seconds}s); {length_line(length)}\n" + table, end="")
    return {"model": cfg.model, "data": cfg.data, "task": kind, **metrics, "pairs": len(data),
            "seconds": seconds, **length, "baselines": base, "report_text": table}  # fmt: skip


def default_length(model_dir: str, positions: int) -> tuple[int, str]:
    """The tokens per text a sentence-embedding model is scored with when none is given, and
    why: its fine-tuning's --max_length (finetune_config.json), else the max_seq_length it
    declares (sentence_bert_config.json, as sentence-transformers embeds), else its positions."""
    recorded = finetune_defaults(model_dir).get("max_length")
    if isinstance(recorded, int):
        return recorded, "the --max_length it was fine-tuned with"
    declared = declared_max_length(model_dir)
    if declared is not None:
        return min(declared, positions), "the max_seq_length of its sentence_bert_config.json"
    return positions, "its max_position_embeddings"


def embedding_length(model_dir: str, given: int | None, positions: int) -> dict[str, Any]:
    """``max_length`` (the tokens per text used), ``max_length_from`` (why) and, when the model
    was fine-tuned from a start model that scores at another length by default, ``not_like_for_like``:
    the two scores differ in more than the training (the start embeds more or fewer tokens)."""
    length, source = (given, "--max_length") if given else default_length(model_dir, positions)
    result: dict[str, Any] = {"max_length": length, "max_length_from": source}
    start = finetune_defaults(model_dir).get("model")
    try:
        start_dir = Path(resolve_model(start)) if isinstance(start, str) else None
    except BertforgeError:  # a published start model no longer installed
        start_dir = None
    if start_dir is not None and (start_dir / "config.json").is_file():  # else moved or gone
        positions = load_config(start_dir).max_position_embeddings
        theirs, why = default_length(str(start_dir), positions)
        if theirs != length:
            result["not_like_for_like"] = (
                f"not like for like with its start model: {start} scores at {theirs} tokens by "
                f"default ({why}), this score at {length}; score the start with --max_length "
                f"{length} to compare the two at equal length"
            )
    return result


def length_line(length: dict[str, Any]) -> str:
    """What the printed result says about the length: ``max length 128 tokens (why)``, and the
    warning of :func:`embedding_length` on a line of its own."""
    line = f"max length {length['max_length']} tokens ({length['max_length_from']})"
    warning = length.get("not_like_for_like")
    return line + (f"\nnote: {warning}" if warning else "")


def _evaluate_retrieval_files(cfg: EvaluateConfig) -> dict[str, Any]:
    """A sentence-embedding model on a retrieval test set in BEIR files: each query searches the
    whole corpus (MRR@10, nDCG@10, recall@1/10/100), beside constant and random vectors."""
    assert cfg.queries and cfg.corpus and cfg.qrels
    start = time.perf_counter()
    data = load_beir(cfg.queries, cfg.corpus, cfg.qrels, cfg.encoding_errors)
    if not data.queries:
        raise BertforgeError(
            f"{cfg.qrels}: judges no query of {cfg.queries} relevant to a document (every score "
            "is 0 or below); give the qrels of these queries"
        )
    model, tokenizer, options = load_model(BertModel, cfg)
    length = embedding_length(cfg.model, cfg.max_length, model.config.max_position_embeddings)
    vectors = model_vectors(model, tokenizer, max_length=length["max_length"], **options)
    metrics = score_vectors(data, vectors)
    base = baselines(data, model.config.hidden_size)
    table = scores_table({"model": metrics, **base})
    seconds = round(time.perf_counter() - start, 1)
    print(
        f"retrieval: {len(data):,} queries over {len(data.documents):,} documents "
        f"({data.skipped:,} queries without a relevant document skipped; {seconds}s); "
        f"{length_line(length)}\n" + table,
        end="",
    )
    files = {"queries": cfg.queries, "corpus": cfg.corpus, "qrels": cfg.qrels}
    return {"model": cfg.model, "data": files, "task": "retrieval", **metrics,
            "queries": len(data), "documents": len(data.documents),
            "skipped_queries": data.skipped, "seconds": seconds, **length, "baselines": base,
            "report_text": table}  # fmt: skip


def _evaluate_reranking(cfg: EvaluateConfig) -> dict[str, Any]:
    """``--retriever R --model M`` on BEIR files: R's top --top_k per query re-ordered by M
    (:mod:`bertforge.evaluation.rerank`); the scores of R alone and of R then M."""
    assert cfg.queries and cfg.corpus and cfg.qrels and cfg.retriever
    start = time.perf_counter()
    retriever_config = load_config(check_model_directory(cfg.retriever))
    if not is_embedding_model(cfg.retriever, retriever_config):
        kind = ", ".join(retriever_config.architectures or []) or "no architecture"
        raise BertforgeError(
            f"--retriever {cfg.retriever} is not a sentence-embedding model ({kind}); the first "
            "stage embeds queries and documents apart: give an encoder alone or a model "
            "declaring its pooling"
        )
    data = load_beir(cfg.queries, cfg.corpus, cfg.qrels, cfg.encoding_errors)
    if not data.queries:
        raise BertforgeError(
            f"{cfg.qrels}: judges no query of {cfg.queries} relevant to a document (every score "
            "is 0 or below); give the qrels of these queries"
        )
    retriever, tokenizer, options = load_model(BertModel, replace(cfg, model=cfg.retriever))
    max_length = finetune_defaults(cfg.retriever).get("max_length")
    vectors = model_vectors(retriever, tokenizer, max_length=max_length, **options)
    query_vectors, document_vectors = vectors(data.queries), vectors(data.documents)
    del retriever
    reranker = load_reranker(cfg)

    def pair_scores(query: str, texts: Sequence[str]) -> np.ndarray:
        return score(reranker, query, texts, max_length=cfg.max_length, truncation=cfg.truncation)

    scores = rerank_scores(
        data, query_vectors, document_vectors, pair_scores, cfg.top_k, progress=cfg.progress
    )
    rows = {"retriever": scores["retriever"], f"reranked@{cfg.top_k}": scores["reranked"]}
    table = scores_table(rows)
    seconds = round(time.perf_counter() - start, 1)
    print(
        f"reranking: {len(data):,} queries over {len(data.documents):,} documents, the top "
        f"{cfg.top_k} of {cfg.retriever} re-ordered by {cfg.model} ({reranker.kind}; "
        f"{data.skipped:,} queries without a relevant document skipped; {seconds}s)\n" + table,
        end="",
    )
    files = {"queries": cfg.queries, "corpus": cfg.corpus, "qrels": cfg.qrels}
    return {"model": cfg.model, "retriever": cfg.retriever, "data": files, "task": "reranking",
            "top_k": cfg.top_k, "reranker_kind": reranker.kind, **scores,
            "queries": len(data), "documents": len(data.documents),
            "skipped_queries": data.skipped, "seconds": seconds, "report_text": table}  # fmt: skip


def _evaluate_tagging_model(cfg: EvaluateConfig, config: Any) -> dict[str, Any]:
    start = time.perf_counter()
    ft = finetune_defaults(cfg.model)
    model, tokenizer, options = load_model(BertForTokenClassification, cfg)
    data = read_tagged(cfg.data, encoding_errors=cfg.encoding_errors)
    for note in data.notes:
        print(note, file=sys.stderr)
    true = tag_ids(data, config.label2id, train_source="model's")
    max_length = next(
        v
        for v in (cfg.max_length, ft.get("max_length"), config.max_position_embeddings)
        if v is not None
    )
    windows = encode_tagged(tokenizer, data.words, true, max_length=max_length)
    metrics, predicted = evaluate_tagging_model(model, windows, true, tokenizer.pad_id, **options)
    more = f" + {len(cfg.data) - 1} more" if len(cfg.data) > 1 else ""
    report = tagging_report(
        config, true, predicted, plot=cfg.plot, plot_title=Path(cfg.data[0]).name + more
    )
    result = {
        "model": cfg.model,
        "data": cfg.data,
        "task": "token_classification",
        **metrics,
        "seconds": round(time.perf_counter() - start, 1),
        **report,
    }
    lines = [f"{k}: {metrics[k]:.4f}" for k in metrics if k not in ("examples", "entities")]
    lines.append(
        f"sentences: {metrics['examples']:,} ({len(windows):,} windows), entities: "
        f"{metrics['entities']:,} ({result['seconds']}s)"
    )
    lines += ["", report["report_text"]]
    base = report["baseline"]
    lines.append(
        f"baseline ({base['definition']}): entity_f1 {base['entity_f1']:.4f}, token_accuracy "
        f"{base['token_accuracy']:.4f}"
    )
    print("\n".join(lines))
    return result


def _evaluate_qa_model(cfg: EvaluateConfig) -> dict[str, Any]:
    """EM/F1 of a question-answering model on labelled questions, beside the baseline of the
    first words of each context (as many as fine-tuning's baseline took, else the mean answer
    length of this data)."""
    start = time.perf_counter()
    ft = finetune_defaults(cfg.model)
    model, tokenizer, options = load_model(BertForQuestionAnswering, cfg)
    examples, warnings = read_qa(cfg.data, encoding_errors=cfg.encoding_errors)
    for warning in warnings:
        print(warning, file=sys.stderr)
    limit = model.config.max_position_embeddings
    max_length = cfg.max_length or ft.get("max_length") or min(384, limit)
    windows = encode_windows(
        tokenizer, examples, max_length=max_length, doc_stride=ft.get("doc_stride", 128),
        labels=True,
    )  # fmt: skip
    metrics, _ = evaluate_qa_model(
        model, windows, examples, tokenizer.pad_id,
        max_answer_length=ft.get("max_answer_length", 30), **options,
    )  # fmt: skip
    path = Path(cfg.model) / RESULTS_FILE
    recorded = read_json_object(path, "restore it or delete it") if path.is_file() else {}
    n_words = (recorded.get("baseline") or {}).get("words")
    definition = "whatever the question; as many words as the mean training answer has"
    if not isinstance(n_words, int):
        n_words = mean_answer_words(examples)
        definition = "whatever the question; as many words as this data's mean answer has"
    guesses = leading_words_baseline(examples, n_words)
    baseline = squad_metrics(guesses, {e.id: e.answers for e in examples})
    report = qa_report(metrics, baseline, n_words, definition)
    seconds = round(time.perf_counter() - start, 1)
    print(f"{report['report_text']}\nloss: {metrics['loss']:.4f}\nquestions: "
          f"{len(examples):,} ({len(windows):,} windows, {seconds}s)")  # fmt: skip
    warning = baseline_warning("f1", metrics["f1"], report["baseline"])
    if warning:
        print(warning)
    return {"model": cfg.model, "data": cfg.data, "task": "question_answering", **metrics,
            "seconds": seconds, **report}  # fmt: skip


def _training_baseline(model_dir: str, config: Any) -> float | int | None:
    """The training baseline ``bertforge finetune`` recorded in the model's eval_results.json
    (a class id or a regression target), or None when it is not there."""
    path = Path(model_dir) / RESULTS_FILE
    if not path.is_file():
        return None
    base = read_json_object(path, "restore it or delete it").get("baseline") or {}
    if "training split" not in str(base.get("definition", "")):
        return None
    if config.is_regression:
        return float(base["predicts"])
    return (config.label2id or {}).get(str(base["predicts"]))


def _evaluate_mlm_model(cfg: EvaluateConfig, config: Any) -> dict[str, Any]:

    start = time.perf_counter()
    cls = (
        BertForPreTraining
        if "BertForPreTraining" in bert_architectures(config)
        else BertForMaskedLM
    )
    model, tokenizer, options = load_model(
        cls,
        cfg,
        require=(
            "cls.predictions.transform",
            "no masked-language-model head (cls.predictions.*) "
            "and no classifier; evaluate needs a pretrained MLM or a fine-tuned model",
        ),
    )
    device, precision = next(model.parameters()).device, options["precision"]
    if len(cfg.data) != 1:
        raise BertforgeError("an MLM evaluation takes one text file in --data")
    max_len = min(128 if cfg.max_length is None else cfg.max_length, config.max_position_embeddings)
    batches = mlm_text_batches(
        tokenizer,
        cfg.data[0],
        max_seq_length=max_len,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        text_column=cfg.text_column,
        max_sequences=cfg.max_sequences,
        encoding_errors=cfg.encoding_errors,
    )
    show = options["progress"]
    trained = evaluate_mlm(model, batches, device, precision, progress=show, desc="this model")
    baseline = evaluate_mlm(
        random_init_like(model, seed=cfg.seed),
        batches,
        device,
        precision,
        progress=show,
        desc="random init",
    )
    guesser = frequency_guesser(batches)
    print(
        comparison_table(
            {"random init": baseline, "word counts": guesser, "this model": trained},
            title=f"{cfg.data[0]} ({trained['sequences']:,} sequences of <= {max_len} tokens)",
        )
        + "\nword counts: a guesser without context that predicts each masked token from how "
        "often it occurs in this text; a model that learned language beats it"
    )
    return {
        "model": cfg.model,
        "data": cfg.data[0],
        "trained": trained,
        "random_init": baseline,
        "frequency_guesser": guesser,
        "seconds": round(time.perf_counter() - start, 1),
    }


__all__ = ["EvaluateConfig", "evaluate"]
