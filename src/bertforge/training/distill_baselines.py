"""The report of a ``bertforge distill`` run as a run of its own (docs/distillation.md, "The
report"): :func:`distill_and_report` is what the command runs -- the distillation, then, with
``--report true``, :func:`report` -- and :func:`report` alone writes the report of a finished
run. Here live the parts that need the run's data and validation: the rows' scores on the
run's validation rows (:func:`report_scores`), the constant baseline of its task
(:func:`constant_row`), the student and its twin trained alone (``--report_alone``:
:func:`alone_rows`); measuring and rendering are :mod:`bertforge.training.distill_report`'s.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.encoding import encode_examples
from bertforge.data.tagging import IGNORE
from bertforge.errors import BertforgeError
from bertforge.io import read_json_object
from bertforge.modeling.checkpoint import WEIGHTS_NAME
from bertforge.runtime import explain_precision, pick_device, set_threads
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.checkpoints import locks_output
from bertforge.training.distill import (
    PCA_TEXTS,
    RESULTS_FILE,
    DistillData,
    Run,
    cache_path,
    distill,
    drop_teacher_cache,
    load_data,
    loss_module,
    teacher_scores,
    validate,
)
from bertforge.training.distill_config import DistillConfig
from bertforge.training.distill_qa import QADistillData
from bertforge.training.distill_report import (
    Measured,
    ReportRow,
    build_report,
    check_report_task,
    constant_classification,
    constant_embedding,
    constant_regression,
    constant_span,
    constant_tagging,
    fresh_twin,
    trained_row,
    write_report,
)
from bertforge.training.distill_tokens import TokenDistillData, teacher_predictions
from bertforge.training.model_card import distill_card, write_model_card
from bertforge.training.students import load_student
from bertforge.training.teacher import load_teacher


def distill_and_report(cfg: DistillConfig) -> dict[str, Any]:
    """``bertforge distill``: the distillation (or its finished result), then its report where
    ``--report true`` asks for one (not after a run stopped by a signal)."""
    result = distill(cfg)
    if cfg.report and not result.get("stopped"):
        report(cfg)
    return result


@locks_output
def report(cfg: DistillConfig) -> dict[str, Any]:
    """Write the report of the finished run in ``cfg.output`` (and its model card again, now
    showing the table); the teacher's cached outputs are dropped after unless
    ``--keep_final_checkpoint``."""
    out = Path(cfg.output)
    result = read_json_object(out / RESULTS_FILE, "restore it or delete the directory")
    run = scoring_run(cfg)
    written = distill_report(run, result["validation"], int(result["steps"]))
    write_model_card(out, distill_card(cfg, result, out, run.device))
    if not cfg.keep_final_checkpoint:
        drop_teacher_cache(out)
    return written


def scoring_run(cfg: DistillConfig) -> Run:
    """What validating models needs of a finished run (its report): the teacher, the saved
    student's tokenizer, the texts with the teacher's outputs (read from OUTPUT's cache if the
    run kept it, else computed again: the teacher's pass over the texts) and the loss's target.
    No optimizer and no metrics log: nothing trains."""
    set_threads(cfg.num_threads)
    device = pick_device(cfg.device)
    out = Path(cfg.output)
    teacher = load_teacher(cfg.teacher, cfg.max_length)
    check_report_task(cfg, teacher.task)
    tokenizer = Tokenizer.from_file(out)
    data = load_data(cfg, teacher, tokenizer, cache_path(cfg), device, lambda texts: None)
    student = load_student(teacher.task, out)
    precision, _ = explain_precision(cfg.precision, device, student.config.hidden_size)
    loss = loss_module(cfg, teacher, data, student.config.hidden_size).to(device)
    return Run(cfg, out, device, precision, None, 0, 0, teacher, tokenizer, data, student, loss,
               None, None, teacher_scores(teacher, data), torch.nn.ModuleList())  # type: ignore[arg-type]  # fmt: skip


COUNTS = ("examples", "entities", "sentences", "windows")
"""Keys of the validation results that count rows, not scores: left out of the report."""


def scores_only(scores: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in scores.items() if k not in COUNTS}


def report_scores(run: Run, model: torch.nn.Module, tokenizer: Tokenizer) -> dict[str, float]:
    """A model's validation scores on the run's rows, as the student's are measured (a model
    of another vocabulary reads the rows through its own tokenizer; a tagger's must share the
    student's, whose windows the rows are)."""
    data = run.data
    same = tokenizer.fingerprint == run.tokenizer.fingerprint
    if isinstance(data, TokenDistillData | QADistillData) and not same:
        raise BertforgeError(
            f"{getattr(model, 'name_or_path', 'a model')}: another vocabulary than the "
            f"student's; the report scores {run.task} models of the student's vocabulary"
        )
    if isinstance(data, DistillData) and not same:
        val_pairs = None if data.val.pairs is None else list(data.val.pairs)
        encoded = encode_examples(
            tokenizer,
            data.val.texts,
            val_pairs,
            max_length=run.teacher.max_length,
            truncation=run.teacher.truncation,
        )
        run = dataclasses.replace(
            run, tokenizer=tokenizer, data=dataclasses.replace(data, encoded_val=encoded)
        )
    if run.task == "embedding" and model.config.hidden_size != run.model.config.hidden_size:
        raise BertforgeError(
            f"{getattr(model, 'name_or_path', 'a model')}: {model.config.hidden_size}-wide "
            f"vectors, the student's are {run.model.config.hidden_size}; the report compares "
            "embedding models as wide as the student"
        )
    model.to(run.device)
    try:
        scores = validate(run, model)
    finally:
        model.to("cpu")
    return scores_only(scores)


def constant_row(run: Run) -> ReportRow:
    """The constant baseline on the validation rows: the majority class of the training
    labels, their mean target, or one vector (the training targets' mean) for an embedding;
    with no gold training labels, the teacher's training predictions stand in for them."""
    data = run.data
    if isinstance(data, TokenDistillData):
        return constant_tags_row(run, data)
    if isinstance(data, QADistillData):
        answers = [e.answers[0] for e in data.train if e.answers]
        contexts, gold = [e.context for e in data.val], [e.answers for e in data.val]
        words, scores = constant_span(answers, contexts, gold)
        what = (f"the first {words} words of every validation context ({words}: the median "
                "length of the gold training answers), whatever the question")  # fmt: skip
        return ReportRow(f"constant: the context's first {words} words", what, scores, 0, 0, 0.0)
    assert isinstance(data, DistillData)
    n = len(data.texts)
    gold = data.labelled[:n] if data.labels is not None else np.zeros(n, dtype=bool)
    if run.task == "classification":
        predicted = np.asarray(data.outputs[:n]).argmax(-1)
        train = data.labels[gold] if gold.any() else predicted
        majority, scores = constant_classification(
            train, data.val.labels, run.teacher.config.num_labels, data.val_outputs.argmax(-1)
        )
        label = (run.teacher.config.id2label or {}).get(majority, majority)
        name, what = f"constant: always {label}", "the most frequent class of the training labels"
    elif run.task == "regression":
        assert data.scale is not None and data.labels is not None
        targets = data.labels[gold] * data.scale[1] + data.scale[0]
        if not gold.any():
            targets = np.asarray(data.outputs[:n])[:, 0]
        mean, scores = constant_regression(targets, data.val.labels)
        name, what = f"constant: always {mean:.4g}", "the mean of the training targets"
    else:
        with torch.no_grad():
            train = run.loss.target(
                torch.from_numpy(np.array(data.outputs[: min(n, PCA_TEXTS)], dtype=np.float32))
            ).numpy()
            val = run.loss.target(torch.from_numpy(np.array(data.val_outputs, np.float32)))
        scores = constant_embedding(train, val.numpy(), run.teacher.normalize)
        name = "constant: one vector"
        what = "the mean of the teacher's training vectors (as the student learns them)"
    if not gold.any() and run.task != "embedding":
        what = what.replace("training labels", "teacher's training predictions")
        what = what.replace("training targets", "teacher's training predictions")
    return ReportRow(name, what + ", for every validation row", scores, 0, 0, 0.0)


def constant_tags_row(run: Run, data: TokenDistillData) -> ReportRow:
    """A token classifier's constant baseline: every validation word tagged with the most
    frequent gold training tag (the teacher's training tags where there are none)."""
    windows = data.windows
    assert windows.labels is not None
    tags: dict[tuple[int, int], int] = {}  # (sentence, word) -> tag: a word once, however windowed
    for i in np.flatnonzero(data.labelled):
        for word, tag in zip(windows.word[i], windows.labels[i], strict=True):
            if word >= 0 and tag != IGNORE:
                tags[(int(windows.sentence[i]), int(word))] = int(tag)
    what = "the most frequent tag of the gold training words"
    train = np.fromiter(tags.values(), dtype=np.int64, count=len(tags))
    if not len(train):
        words = sum(len(w) for w in data.train.words)
        train = np.nan_to_num(np.asarray(data.outputs[:words], np.float32)).argmax(-1)
        what = "the most frequent tag of the teacher's training words"
    config = run.teacher.config
    majority, scores = constant_tagging(train, data.val_tags, config, teacher_predictions(data))
    label = (config.id2label or {}).get(majority, majority)
    return ReportRow(f"constant: always {label}", what + ", for every validation word",
                     scores_only(scores), 0, 0, 0.0)  # fmt: skip


def report_texts(data: Any, count: int) -> tuple[list[str], list[str] | None]:
    """The first ``count`` validation texts (and pairs) the throughput is measured on; a
    tagger's sentences as their words joined by spaces."""
    if isinstance(data, TokenDistillData):
        return [" ".join(words) for words in data.val.words[:count]], None
    if isinstance(data, QADistillData):  # question and context, cut to a window as inference does
        return [e.question for e in data.val[:count]], [e.context for e in data.val[:count]]
    pairs = None if data.val.pairs is None else list(data.val.pairs)[:count]
    return list(data.val.texts[:count]), pairs


REPORT_DIR = "report"
"""OUTPUT's folder of the models a report trains (--report_alone)."""


def alone_config(cfg: DistillConfig, steps_done: int, output: Path, **start: Any) -> DistillConfig:
    """The settings of training a start on the gold labels alone for ``steps_done`` steps: the
    run's own (data order, batch, LR, validation) less the teacher's terms and transfer text."""
    return dataclasses.replace(
        cfg, output=str(output), alpha=0.0, unlabelled=None, max_unlabelled=None, augment=None,
        balance_transfer=False, max_steps=steps_done, max_time=None, hidden_weight=0.0,
        attention_weight=0.0, relation_weight=0.0, relation_heads=None, layer_map=None, report=False,
        report_compare=None, report_alone=False, keep_final_checkpoint=False, **start,
    )  # fmt: skip


def alone_rows(run: Run, steps_done: int, score: Any) -> list[Measured]:
    """--report_alone: the student's start and its random twin trained on the gold labels
    alone for the distillation's steps (each a ``distill`` run of its own in OUTPUT/report/,
    which a repeated report finds finished)."""
    cfg, out = run.cfg, run.out
    if not cfg.report_alone:
        return []
    if run.task == "embedding" or not cfg.train:
        run.say("report: no gold training labels, so nothing to train alone (--report_alone)")
        return []
    folder = out / REPORT_DIR
    run.say(f"report: training the student's start and its twin alone, {steps_done} steps each")
    distill(alone_config(cfg, steps_done, folder / "alone"))
    trained = f"trained on the gold labels of --train alone (no teacher) for {steps_done} steps"
    alone = trained_row("student alone", f"the student's start, {trained}", folder / "alone",
                        run.task, score, "distilled student")  # fmt: skip
    if cfg.student_preset:  # the start is fresh weights already: it is its own random twin
        alone.row.what += " (fresh weights of the preset: the random twin trained alone)"
        return [alone]
    twin_start = folder / "twin-start"
    if not (twin_start / WEIGHTS_NAME).is_file():
        fresh_twin(run.model, out, run.tokenizer, run.task, cfg.seed, twin_start)
    start = dict(student=str(twin_start), student_layers=None, student_preset=None)
    distill(alone_config(cfg, steps_done, folder / "twin", **start))
    return [
        alone,
        trained_row("random twin alone", f"the student's config with fresh weights, {trained}",
                    folder / "twin", run.task, score, "distilled student"),
    ]  # fmt: skip


def distill_report(run: Run, student_scores: dict[str, Any], steps_done: int) -> dict[str, Any]:
    """Score, size and time the teacher, the saved student and its baselines (``steps_done``:
    the distillation's steps, those a model trained alone gets); write OUTPUT/report.json and
    report.md (:mod:`bertforge.training.distill_report`)."""
    cfg, out, teacher = run.cfg, run.out, run.teacher
    check_report_task(cfg, run.task)
    data = run.data
    run.say("report: scoring, sizing and timing the teacher, the student and the baselines")
    teacher.model.to("cpu")
    size = (teacher.directory / WEIGHTS_NAME).stat().st_size
    scores = scores_only(run.teacher_scores)
    if run.task in ("classification", "token_classification"):
        scores["agreement"] = 1.0  # with itself
    teacher_row = ReportRow(
        "teacher", f"`{cfg.teacher}`", scores,
        sum(p.numel() for p in teacher.model.parameters()), size, size / 1e6,
        directory=str(teacher.directory),
    )  # fmt: skip
    best = load_student(run.task, out)
    size = (out / WEIGHTS_NAME).stat().st_size
    scores = scores_only(student_scores)
    student_row = ReportRow(
        "distilled student", f"`{out}`: the best student by {run.metric}", scores,
        sum(p.numel() for p in best.parameters()), size, size / 1e6, directory=str(out),
    )  # fmt: skip
    score = lambda model, tokenizer: report_scores(run, model, tokenizer)  # noqa: E731
    trained = alone_rows(run, steps_done, score)
    texts, pairs = report_texts(data, cfg.report_texts)
    with tempfile.TemporaryDirectory(dir=out, prefix=".report-") as work:
        report = build_report(
            task=run.task,
            metric=run.metric,
            teacher=Measured(teacher_row, teacher.model, teacher.tokenizer, teacher.directory),
            student=Measured(student_row, best, run.tokenizer, out),
            trained=trained,
            compare=cfg.report_compare or [],
            constant=constant_row(run),
            score=score,
            texts=texts,
            pairs=pairs,
            max_length=teacher.max_length,
            truncation=teacher.truncation,
            validation_rows=len(data.val),
            threads=torch.get_num_threads(),
            rounds=cfg.report_rounds,
            seed=cfg.seed,
            work=Path(work),
        )
    write_report(out, report)
    run.say(f"report: {out / 'report.md'}")
    return report


__all__ = ["distill_and_report", "report"]
