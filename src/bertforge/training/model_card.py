"""Model cards: the ``README.md`` every model directory bertforge trains gets, in the Hugging Face
Hub's layout -- YAML metadata (``library_name``, ``pipeline_tag``, ``base_model``, ``datasets``,
``license`` when known, ``model-index`` with each score's value) above a Markdown page saying what
the model is for, how good it is beside its baselines (and the random-init twin where one was
measured), how to use it, the command that trained it, the data files (sizes and SHA-256) and
the hardware and time.

:func:`write_model_card` renders a :class:`ModelCard` and writes it atomically (adding it to the
directory's manifest, so ``bertforge verify`` checks it too); :func:`pretrain_card` and
:func:`finetune_card` build the card of each command from what it recorded (its resolved config,
``metrics.jsonl``, the results it returns, the data's manifest). Another command (``distill``)
builds a :class:`ModelCard` of its own and calls :func:`write_model_card`.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import yaml

from bertforge.io import (
    MANIFEST_NAME,
    atomic_write_text,
    file_sha256,
    read_manifest,
    write_manifest,
)
from bertforge.modeling.checkpoint import published_hub_id
from bertforge.progress import format_duration, plural, read_metrics
from bertforge.runtime import cpu_model
from bertforge.training.distill_report import read_report, report_notes, report_table

CARD_NAME = "README.md"
"""The card's file name in a model directory (the Hub reads it as the model card)."""

CardKind = Literal[
    "masked_lm",
    "classification",
    "regression",
    "token_classification",
    "question_answering",
    "embedding",
]

PIPELINE_TAGS: dict[str, str] = {
    "masked_lm": "fill-mask",
    "classification": "text-classification",
    "regression": "text-classification",
    "token_classification": "token-classification",
    "question_answering": "question-answering",
    "embedding": "sentence-similarity",
}
"""The Hub's ``pipeline_tag`` of each kind (a regressor is a one-output text classifier there)."""

KNOWN_LICENSES = {"all-minilm-l6-v2": "apache-2.0"}
"""Licences of the published start models bertforge knows (a fine-tune inherits its start's)."""


@dataclass
class DataFile:
    """A file a model was trained or scored on."""

    name: str
    """Its path as given (or as a manifest lists it)."""
    role: str
    """What it was: ``train``, ``validation``, ``shard``..."""
    size: int | None = None
    """Bytes (None: not readable when the card was written)."""
    sha256: str | None = None
    """Its SHA-256 (from the data's manifest, else hashed when the card was written)."""


@dataclass
class Score:
    """One score of the model, with the same score of its baselines."""

    metric: str
    """Its name as ``metrics.jsonl`` spells it (``accuracy``, ``f1``, ``spearman``...)."""
    value: float
    baselines: dict[str, float] = field(default_factory=dict)
    """Baseline name -> its value of this metric (``always 'pos'``, ``random-init twin``...)."""


@dataclass
class ModelCard:
    """What a model card says; :func:`render_model_card` lays it out."""

    name: str
    """The model's name: its directory's."""
    kind: CardKind
    summary: str
    """What the model is and what it is for, in a sentence or two."""
    command: str
    """The command that trained it."""
    scores: list[Score]
    evaluated_on: str
    """Where the scores were measured (``the validation split, 10% of train.csv held out``)."""
    base_model: str | None = None
    """The model it started from (None: a random network)."""
    datasets: list[str] = field(default_factory=list)
    """The data sets as given (file paths or names)."""
    data_files: list[DataFile] = field(default_factory=list)
    baseline_notes: dict[str, str] = field(default_factory=dict)
    """Baseline name -> what it is."""
    usage: str = ""
    """Markdown: how to use the model."""
    hardware: str = ""
    seconds: float | None = None
    """Training time."""
    facts: dict[str, Any] = field(default_factory=dict)
    """More training facts for the table (steps, tokens, precision...)."""
    license: str | None = None
    library_name: str = "transformers"
    tags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Paragraphs the reader should see (a score that does not beat its baseline...)."""
    more_results: list[tuple[str, list[Score]]] = field(default_factory=list)
    """Scores measured elsewhere (where, scores): a test file beside the random-init twin..."""


# ---- rendering -------------------------------------------------------------------------------


def card_metadata(card: ModelCard) -> dict[str, Any]:
    """The card's YAML front matter as a dict (the Hub's model-card metadata)."""
    meta: dict[str, Any] = {
        "library_name": card.library_name,
        "pipeline_tag": PIPELINE_TAGS[card.kind],
        "tags": ["bertforge", *card.tags],
    }
    if card.license:
        meta["license"] = card.license
    if card.base_model:  # a published start by its Hub id, which the Hub links
        meta["base_model"] = published_hub_id(card.base_model) or card.base_model
    if card.datasets:
        meta["datasets"] = list(card.datasets)
    measured = [(card.evaluated_on, card.scores), *card.more_results]
    results = [
        {
            "task": {"type": PIPELINE_TAGS[card.kind], "name": card.kind},
            "dataset": {"name": where, "type": "local"},
            "metrics": [
                {"type": s.metric, "name": s.metric, "value": float(s.value)} for s in scores
            ],
        }
        for where, scores in measured
        if scores
    ]
    if results:
        meta["model-index"] = [{"name": card.name, "results": results}]
    return meta


def _number(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"


LOWER_IS_BETTER = frozenset({"loss", "perplexity", "mse", "mae"})
"""Scores where less is better (every other score of bertforge's: more is better)."""


def _scores_table(scores: list[Score]) -> str:
    baselines = list(dict.fromkeys(b for s in scores for b in s.baselines))
    header = ["metric", "better", "this model", *baselines]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in scores:
        better = "lower" if s.metric in LOWER_IS_BETTER else "higher"
        cells = [s.metric, better, f"**{_number(s.value)}**"]
        cells += [_number(s.baselines[b]) if b in s.baselines else "" for b in baselines]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _verdict(score: Score) -> str:
    """One sentence: how the run's metric compares with each baseline's."""
    if not score.baselines:
        return ""
    lower = score.metric in LOWER_IS_BETTER
    parts = []
    for name, value in score.baselines.items():
        gain = value - score.value if lower else score.value - value
        how = "beats" if gain > 0 else "does not beat"
        parts.append(
            f"{how} *{name}* ({_number(value)}) by {_number(gain)}"
            if gain > 0
            else f"{how} *{name}* ({_number(value)})"
        )
    return (
        f"On {score.metric}, the first score, the model ({_number(score.value)}) "
        + "; ".join(parts)
        + "."
    )


def _files_table(files: list[DataFile]) -> str:
    lines = ["| file | role | bytes | SHA-256 |", "|---|---|---|---|"]
    for f in files:
        size = "" if f.size is None else f"{f.size:,}"
        lines.append(f"| `{f.name}` | {f.role} | {size} | `{f.sha256 or 'unreadable'}` |")
    return "\n".join(lines)


def render_model_card(card: ModelCard) -> str:
    """The card as a ``README.md``: YAML front matter, then the page."""
    front = yaml.safe_dump(card_metadata(card), sort_keys=False, allow_unicode=True)
    parts = [f"---\n{front}---\n", f"# {card.name}\n", card.summary + "\n"]
    parts.append("## How good it is\n")
    if card.scores:
        parts.append(f"Measured on {card.evaluated_on}.\n")
        parts.append(_scores_table(card.scores) + "\n")
        if verdict := _verdict(card.scores[0]):
            parts.append(verdict + "\n")
        for where, scores in card.more_results:
            parts += [f"Measured on {where}.\n", _scores_table(scores) + "\n"]
        for name, what in card.baseline_notes.items():
            parts.append(f"- *{name}*: {what}")
        parts.append("")
    else:
        parts.append("No score was measured.\n")
    parts += [note + "\n" for note in card.notes]
    if card.usage:
        parts += ["## How to use it\n", card.usage + "\n"]
    parts += ["## How it was trained\n", "```bash", card.command, "```\n"]
    facts = {"started from": card.base_model or "a random network (from scratch)"}
    facts |= {"hardware": card.hardware} if card.hardware else {}
    if card.seconds is not None:
        facts["training time"] = f"{format_duration(card.seconds)} ({card.seconds:,.1f} s)"
    facts |= {k: str(v) for k, v in card.facts.items()}
    parts += [f"- {k}: {v}" for k, v in facts.items()] + [""]
    if card.data_files:
        parts += ["### Data files\n", _files_table(card.data_files) + "\n"]
    parts.append(
        "Written by bertforge with the model; `bertforge verify DIR` checks every file against "
        "`manifest.json`.\n"
    )
    return "\n".join(parts)


def write_model_card(directory: str | Path, card: ModelCard) -> Path:
    """Write ``card`` as ``directory/README.md`` atomically; a directory with a bertforge manifest
    gets the card added to it (rewritten last, as every manifest is)."""
    directory = Path(directory)
    path = atomic_write_text(directory / CARD_NAME, render_model_card(card))
    listed = read_manifest(directory)
    if listed is not None:
        write_manifest(directory, [*listed, CARD_NAME])
    return path


def read_card_metadata(path: str | Path) -> dict[str, Any]:
    """The YAML front matter of a card (a ``README.md`` or the directory holding one)."""
    path = Path(path)
    text = (path / CARD_NAME if path.is_dir() else path).read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        return {}
    return yaml.safe_load(text[4 : text.index("\n---\n", 4)]) or {}


# ---- facts every card takes ------------------------------------------------------------------


def hardware(device: torch.device | str) -> str:
    """The device a model trained on, in words: the GPU's name, else the CPU's model and the
    threads torch used."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return f"GPU: {torch.cuda.get_device_name(device)} ({torch.cuda.device_count()} visible)"
    if device.type == "mps":
        return "Apple GPU (mps)"
    return f"CPU: {cpu_model()}, {plural(torch.get_num_threads(), 'torch thread')}"


def command_line(command: str, cfg: Any, skip: tuple[str, ...] = ()) -> str:
    """``bertforge COMMAND`` with every option of ``cfg`` (a config dataclass, nested sections
    as ``--section.field``) that differs from its default: the run's command, as resolved."""
    words = ["bertforge", command]
    for name, values in _options(cfg, "", skip):
        words += [f"--{name}", *values]
    return " ".join(shlex.quote(w) for w in words)


def _options(cfg: Any, prefix: str, skip: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """(option, its words) of each field off its default; a list of plain values is its items
    (``--train a.csv b.csv``), a mapping or nested list JSON."""
    out = []
    for f in dataclasses.fields(cfg):
        if f.name in skip or not f.init:
            continue
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += _options(value, f"{prefix}{f.name}.", ())
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        if value == default:
            continue
        if isinstance(value, bool):
            words = [str(value).lower()]
        elif isinstance(value, list | tuple) and value and all(_plain(v) for v in value):
            words = [str(v) for v in value]
        elif isinstance(value, list | tuple | dict):
            words = [json.dumps(value)]
        else:
            words = [str(value)]
        out.append((f"{prefix}{f.name}", words))
    return out


def _plain(value: Any) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def data_file(path: str | Path, role: str) -> DataFile:
    """A file given to a command, hashed now (a file that cannot be read has no size or hash)."""
    p = Path(path)
    try:
        return DataFile(str(path), role, p.stat().st_size, file_sha256(p))
    except OSError:
        return DataFile(str(path), role)


def manifest_files(directory: str | Path, role: str) -> list[DataFile]:
    """The files a data directory's bertforge manifest lists, with their recorded sizes and
    hashes (prepared shards: ``DIR/train-00000.ids``...)."""
    listed = read_manifest(directory) or {}
    return [
        DataFile(f"{directory}/{name}", role, entry["size"], entry["sha256"])
        for name, entry in listed.items()
        if name != MANIFEST_NAME
    ]


def logged_row(directory: str | Path, split: str, step: int | None) -> dict[str, Any]:
    """The ``metrics.jsonl`` row of ``split`` at ``step`` (the last one at that step; the last of
    the split when ``step`` is None), or {}."""
    rows = [r for r in read_metrics(directory) if r.get("split") == split]
    if step is not None:
        rows = [r for r in rows if r.get("step") == step]
    return rows[-1] if rows else {}


NOT_SCORES = ("step", "split", "time", "examples", "tokens", "sequences", "epoch", "elapsed")
NOT_SCORES += ("windows", "entities", "questions", "pairs", "queries", "documents")
"""Fields of a metrics.jsonl row that are counts or stamps, not scores."""


def scores_of(row: dict[str, Any], first: str | None = None) -> list[Score]:
    """The numeric scores of a ``metrics.jsonl`` row (``first``, the run's metric, first)."""
    names = [k for k, v in row.items() if k not in NOT_SCORES and _is_number(v)]
    if first in names:
        names.remove(first)
        names.insert(0, first)
    return [Score(k, float(row[k])) for k in names]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def license_of(base_model: str | None) -> str | None:
    """The licence of a start model bertforge knows (:data:`KNOWN_LICENSES`)."""
    if base_model is None:
        return None
    plain = base_model.lower().replace("_", "-")
    return next((lic for name, lic in KNOWN_LICENSES.items() if name in plain), None)


# ---- the cards of bertforge's commands -------------------------------------------------------


def baseline_scores(scores: list[Score], baseline: dict[str, Any] | None) -> dict[str, str]:
    """Put a results ``baseline`` dict (``predicts``, ``definition``, its metric values, and
    nested dicts of other baselines by name) beside ``scores``; returns the notes (name ->
    what it is)."""
    if not baseline:
        return {}
    name = f"baseline: always {baseline['predicts']!r}" if "predicts" in baseline else "baseline"
    if baseline.get("predicts") == "random vectors":
        name = "random vectors"
    groups = {name: baseline} | {k: v for k, v in baseline.items() if isinstance(v, dict)}
    for label, values in groups.items():
        for s in scores:
            if _is_number(values.get(s.metric)):
                s.baselines[label] = float(values[s.metric])
    notes = {name: str(baseline.get("definition", ""))}
    notes |= {k: "the same vector for every text" for k in groups if k == "constant"}
    return notes


def _labels(out: Path) -> list[str]:
    try:
        config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    labels = config.get("id2label") or {}
    return [labels[k] for k in sorted(labels, key=int)]


def _what_finetuned(cfg: Any, out: Path, base: str) -> tuple[str, str]:
    """(summary, usage) of a fine-tuned model."""
    files = ", ".join(f"`{Path(t).name}`" for t in cfg.train)
    pairs = getattr(cfg, "text_pair_column", None)
    reads = f"a pair of texts ({cfg.text_column!r} + {pairs!r})" if pairs else "a text"
    start = f"fine-tuned from `{base}` on {files}"
    d = f"{out}"
    if cfg.task == "classification":
        labels = ", ".join(f"`{x}`" for x in _labels(out))
        summary = (
            f"A classifier (`BertForSequenceClassification`) {start}: it reads {reads} and "
            f"gives the probability of each label ({labels})."
        )
        usage = f'```bash\nbertforge classify --model {d} "a text"\n```'
    elif cfg.task == "regression":
        summary = (
            f"A regressor (`BertForSequenceClassification`, one output) {start}: it reads "
            f"{reads} and predicts the number in column {cfg.label_column!r}."
        )
        usage = f'```bash\nbertforge classify --model {d} "a text"\n```'
    elif cfg.task == "token_classification":
        types = sorted({x.split("-", 1)[-1] for x in _labels(out) if x != "O"})
        summary = (
            f"A token classifier (`BertForTokenClassification`) {start}: it tags each word "
            f"of a text with an IOB2 tag, finding entities of the types {', '.join(types)}."
        )
        usage = f'```bash\nbertforge tag --model {d} "Anna flew to Paris ."\n```'
    elif cfg.task == "question_answering":
        summary = (
            f"An extractive question-answering model (`BertForQuestionAnswering`) {start}: "
            "given a question and a context, it answers with a span of the context (SQuAD "
            "v1.1 style)."
        )
        usage = f'```bash\nbertforge answer --model {d} --question "Who?" --context "..."\n```'
    else:
        summary = (
            f"A sentence-embedding model {start}: it maps a text to one vector (the pooling "
            "its `modules.json` declares); texts that mean the same have a high cosine "
            "(search, clustering, deduplication). Saved in the sentence-transformers layout."
        )
        usage = (
            f"```bash\nbertforge embed --model {d} --input texts.txt --output vectors.npy\n```"
            f"\n\n```python\nfrom sentence_transformers import SentenceTransformer\n"
            f'vectors = SentenceTransformer("{d}").encode(["a text"])\n```'
        )
    if cfg.task in ("classification", "regression"):
        if pairs:
            summary += (
                " A pair model is a cross-encoder: sentence-transformers' "
                "`CrossEncoder(dir)` loads it with the same scores, and `bertforge rerank` "
                "ranks candidate texts for a query with it."
            )
            usage = (
                f'```bash\nbertforge rerank --model {d} --query "a query" --input '
                f"candidates.jsonl\n```\n\n```python\nfrom sentence_transformers import "
                f'CrossEncoder\nscores = CrossEncoder("{d}").predict([("a query", "a text")])'
                "\n```"
            )
        usage += (
            "\n\nIt loads in transformers too: `AutoModelForSequenceClassification"
            f'.from_pretrained("{d}")`.'
        )
    return summary, usage


def finetune_card(cfg: Any, result: dict[str, Any], out: Path, device: Any) -> ModelCard:
    """The card of a ``bertforge finetune`` run (``cfg``: its FinetuneConfig; ``result``: what
    :func:`~bertforge.training.finetune.finish` returns). Its scores are the validation row
    ``metrics.jsonl`` logged at the saved model's step."""
    out = Path(out)
    base = cfg.model
    row = logged_row(out, "val", result.get("best_step"))
    scores = scores_of(row, cfg.metric)
    notes = baseline_scores(scores, result.get("baseline"))
    if cfg.validation:
        where = "the validation file(s) " + ", ".join(f"`{Path(v).name}`" for v in cfg.validation)
    else:
        share = f"{cfg.validation_fraction:.0%}"
        where = f"the validation split ({share} of the training rows, held out)"
    where += f", step {result.get('best_step')} (the saved model: the best by {cfg.metric})"
    files = [data_file(t, "train") for t in cfg.train]
    files += [data_file(v, "validation") for v in cfg.validation or []]
    summary, usage = _what_finetuned(cfg, out, base)
    library = "sentence-transformers" if cfg.task == "embedding" else "transformers"
    tags = (
        ["cross-encoder"]
        if cfg.task in ("classification", "regression") and getattr(cfg, "text_pair_column", None)
        else []
    )
    facts = {
        "steps": f"{result.get('steps')} ({result.get('epochs')} epochs)",
        "tokens trained": f"{result.get('tokens', 0):,}",
        "precision": cfg.precision,
        "max_length": cfg.max_length,
    }
    return ModelCard(
        name=out.name,
        kind=cfg.task,
        summary=summary,
        command=command_line("finetune", cfg, skip=("progress",)),
        scores=scores,
        evaluated_on=where,
        base_model=base,
        datasets=[str(t) for t in cfg.train],
        data_files=files,
        baseline_notes=notes,
        usage=usage,
        hardware=hardware(device),
        seconds=result.get("train_seconds"),
        facts=facts,
        license=license_of(base),
        library_name=library,
        tags=tags,
    )


def pretrain_card(
    cfg: Any, result: dict[str, Any], out: Path, model_dir: Path, device: Any
) -> ModelCard:
    """The card of a ``bertforge pretrain`` run's model (``cfg``: its PretrainConfig; ``result``:
    its results.json). Its scores are the last validation row of ``metrics.jsonl`` (masked-LM
    loss, accuracy, perplexity...), beside the same network at step 0 (the random-init twin of
    a run from scratch) and, for a run from --init_from, BERT's random initialisation."""
    out, model_dir = Path(out), Path(model_dir)
    row = logged_row(out, "val", result.get("step"))
    scores = [s for s in scores_of(row, "accuracy")]
    initial = (result.get("initial") or {}).get("val") or {}
    twin = (result.get("random_init") or {}).get("val") or {}
    start = "step 0 (the start, --init_from)" if cfg.init_from else "random-init twin (step 0)"
    for s in scores:
        if _is_number(initial.get(s.metric)):
            s.baselines[start] = float(initial[s.metric])
        if _is_number(twin.get(s.metric)):
            s.baselines["BERT random init"] = float(twin[s.metric])
    notes = {
        start: "this network before its first step"
        + ("" if cfg.init_from else ": the same shape, randomly initialised, never trained"),
    }
    if twin:
        notes["BERT random init"] = "the same network as BERT initialises it, never trained"
    meta_inputs: list[str] = []
    try:
        meta = json.loads((Path(cfg.data) / "meta.json").read_text(encoding="utf-8"))
        meta_inputs = list(meta.get("settings", {}).get("inputs", []))
    except (OSError, ValueError):
        pass
    files = manifest_files(cfg.data, "prepared data (bertforge prepare)")
    d = str(model_dir)
    objective = cfg.train.objective
    summary = (
        f"A BERT encoder pretrained by bertforge ({objective}) "
        + (f"from `{cfg.init_from}` " if cfg.init_from else "from a random network ")
        + f"on the prepared data `{cfg.data}`"
        + (f" (text: {', '.join(f'`{Path(i).name}`' for i in meta_inputs)})" if meta_inputs else "")
        + ": a starting point for fine-tuning (classification, regression, named entities, "
        "question answering, sentence embeddings) and a fill-mask model."
    )
    usage = (
        f'```bash\nbertforge fill-mask --model {d} "the man went to the [MASK] ."\n'
        f"bertforge finetune --model {d} --train train.csv --output my-classifier\n```\n\n"
        f'It loads in transformers: `AutoModelForMaskedLM.from_pretrained("{d}")`.'
    )
    facts = {"steps": result.get("step"), "tokens trained": f"{result.get('tokens', 0):,}"}
    facts["precision"] = cfg.train.precision
    return ModelCard(
        name=f"{out.name}/{model_dir.name}" if model_dir.parent == out else model_dir.name,
        kind="masked_lm",
        summary=summary,
        command=command_line("pretrain", cfg),
        scores=scores,
        evaluated_on=f"the validation split of `{cfg.data}` (masked tokens)",
        base_model=cfg.init_from,
        datasets=meta_inputs or [str(cfg.data)],
        data_files=files,
        baseline_notes=notes,
        usage=usage,
        hardware=hardware(device),
        seconds=result.get("elapsed"),
        facts=facts,
        license=license_of(cfg.init_from),
    )


__all__ = [
    "CARD_NAME",
    "CardKind",
    "DataFile",
    "distill_card",
    "ModelCard",
    "PIPELINE_TAGS",
    "Score",
    "card_metadata",
    "command_line",
    "baseline_scores",
    "data_file",
    "finetune_card",
    "pretrain_card",
    "hardware",
    "license_of",
    "logged_row",
    "manifest_files",
    "read_card_metadata",
    "render_model_card",
    "scores_of",
    "write_model_card",
]


def distill_card(cfg: Any, result: dict[str, Any], out: Path, device: Any) -> ModelCard:
    """The card of a ``bertforge distill`` run's student (``cfg``: its DistillConfig;
    ``result``: what :func:`~bertforge.training.distill.finish` returns). Its scores are the
    saved student's validation scores beside its teacher's (measured on the same rows); where
    OUTPUT holds a report (``--report true``), its table follows them."""
    out = Path(out)
    teacher_scores = result.get("teacher") or {}
    scores = [
        Score(k, float(v), {"teacher": float(teacher_scores[k])} if k in teacher_scores else {})
        for k, v in (result.get("validation") or {}).items()
        if _is_number(v) and k != "examples"
    ]
    metric = result.get("metric")
    scores.sort(key=lambda s: s.metric != metric)
    if cfg.validation:
        where = "the validation file(s) " + ", ".join(f"`{Path(v).name}`" for v in cfg.validation)
    else:
        where = f"the validation split ({cfg.validation_fraction:.0%} of the labelled rows)"
    where += f", step {result.get('best_step')} (the saved student: the best by {metric})"
    files = [data_file(t, "train") for t in cfg.train or []]
    files += [data_file(u, "unlabelled (the teacher labels it)") for u in cfg.unlabelled or []]
    files += [data_file(v, "validation") for v in cfg.validation or []]
    if cfg.student_layers:
        layers = ", ".join(map(str, cfg.student_layers))
        student = f"the teacher's layer{'s' if len(cfg.student_layers) > 1 else ''} {layers}"
    elif cfg.student:
        student = f"`{cfg.student}`"
    else:
        student = f"a fresh `{cfg.student_preset}` network"
        if cfg.student_num_layers or cfg.student_hidden_size:
            layers = cfg.student_num_layers
            student += " resized to " + " x ".join(
                f"{n} {what}"
                for n, what in (
                    (layers, "layer" if layers == 1 else "layers"),
                    (cfg.student_hidden_size, "wide"),
                )
                if n
            )
    task = str(result.get("task") or "")
    kind = task if task in PIPELINE_TAGS else "classification"
    params, teacher_params = result.get("parameters"), result.get("teacher_parameters")
    size = (
        f" ({params:,} parameters against the teacher's {teacher_params:,})"
        if params and teacher_params
        else ""
    )
    summary = (
        f"A student distilled by bertforge from the fine-tuned teacher `{cfg.teacher}` "
        f"({task or 'its task'}), starting from {student}{size}: it does the teacher's task "
        "and reads its inputs the way the teacher's saved settings say."
    )
    d = str(out)
    if kind == "embedding":
        usage = f"```bash\nbertforge embed --model {d} --input texts.txt --output vectors.npy\n```"
    else:
        usage = f'```bash\nbertforge classify --model {d} "a text"\n```'
    facts = {
        "steps": result.get("steps"),
        "tokens trained": f"{result.get('tokens', 0):,}",
        "temperature": cfg.temperature,
        "alpha (gold-label share)": cfg.alpha,
    }
    notes = []
    report = read_report(out)
    if report is not None:  # report.md's table and what its columns are
        notes = ["## Beside its teacher and baselines", report_table(report)]
        notes += report_notes(report)
    return ModelCard(
        name=out.name,
        kind=kind,  # type: ignore[arg-type]
        summary=summary,
        command=command_line("distill", cfg, skip=("progress",)),
        notes=notes,
        scores=scores,
        evaluated_on=where,
        base_model=cfg.student or str(cfg.teacher),
        datasets=[str(t) for t in [*(cfg.train or []), *(cfg.unlabelled or [])]],
        data_files=files,
        baseline_notes={"teacher": f"the teacher `{cfg.teacher}` on the same rows"},
        usage=usage,
        hardware=hardware(device),
        seconds=result.get("train_seconds"),
        facts=facts,
        license=license_of(cfg.student or str(cfg.teacher)),
        library_name="sentence-transformers" if kind == "embedding" else "transformers",
        tags=["distillation"],
    )
