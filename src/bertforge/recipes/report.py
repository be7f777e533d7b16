"""A recipe's ``results.json`` as Markdown tables (what ``bertforge recipe`` prints at the end and
``docs/results.md`` shows)."""

from __future__ import annotations

from typing import Any

from bertforge.progress import plural

LABELS = {"random_init": "random init", "start": "start", "final": "after"}


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:.2%}"


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def mlm_table(mlm: dict[str, Any]) -> str:
    """One row per (evaluation set, column): MLM loss, perplexity, accuracy, NSP accuracy; with
    NSP, the majority class's NSP accuracy beside them (what a trained NSP head must beat)."""
    lines = [
        "| evaluated on | model | MLM loss | perplexity | masked-token acc. | top-5 | NSP acc. |",
        "|---|---|---|---|---|---|---|",
    ]
    guess = mlm.get("frequency_guesser") or {}
    by_split = guess if "loss" not in guess else {}  # one per evaluation set, or one for all
    for split, columns in mlm["eval"].items():
        if split in by_split:  # the line to beat first: a model of word frequencies alone
            lines.append(guesser_row(split, by_split[split]))
        for key, label in LABELS.items():
            m = columns.get(key)
            if not m:
                continue
            if key == "final":
                label = f"after ({mlm['steps']} steps, {mlm['seconds'] / 60:.1f} min)"
                if "head_steps" in mlm:  # a head-fitting run came first
                    minutes = (mlm["head_seconds"] + mlm["seconds"]) / 60
                    label = (
                        f"after ({mlm['head_steps']} head-only + {mlm['steps']} steps, "
                        f"{minutes:.1f} min)"
                    )
            lines.append(
                f"| {split} | {label} | {_num(m['loss'])} | {_num(m['perplexity'], 1)} | "
                f"{_pct(m['accuracy'])} | {_pct(m['top5_accuracy'])} | {_pct(m.get('nsp_accuracy'))} |"
            )
        majority = next(
            (m["nsp_majority"] for m in columns.values() if m and m.get("nsp_majority")), None
        )
        if majority is not None:  # the NSP score to beat: always the more frequent label
            lines.append(f"| {split} | majority class (NSP) | - | - | - | - | {_pct(majority)} |")
    if "loss" in guess:
        lines.append(guesser_row("held-out text", guess))
    return "\n".join(lines)


def guesser_row(split: str, guess: dict[str, Any]) -> str:
    """The token-frequency guesser's row (:func:`~bertforge.recipes.runner.unigram_baseline`):
    what a model scores that knows only how frequent each word is."""
    return (
        f"| {split} | token-frequency guesser | {_num(guess['loss'])} | - | "
        f"{_pct(guess['accuracy'])} | - | - |"
    )


def downstream_table(downstream: dict[str, Any]) -> str:
    """Per task and model: each seed's scores and their mean."""
    lines = ["| task | model | metric | " + " | ".join(["per seed", "mean"]) + " |"]
    lines.append("|---|---|---|---|---|")
    flagged = False
    for task, models in downstream.items():
        for name, result in models.items():
            if "seeds" not in result:  # bertforge downstream's layout: metric -> value
                metrics = {k: v for k, v in result.items() if isinstance(v, float)}
                for metric in ("accuracy", "macro_f1", "spearman", "mae"):
                    if metric in metrics:
                        lines.append(f"| {task} | {name} | {metric} | - | {metrics[metric]:.4f} |")
                continue
            for metric, mean in result["mean"].items():
                seeds = ", ".join(
                    f"{v[metric]:.4f}" + ("*" if v.get("beats_baseline") is False else "")
                    for v in result["seeds"].values()
                )
                flagged = flagged or "*" in seeds
                lines.append(f"| {task} | {name} | {metric} | {seeds} | {mean:.4f} |")
    if flagged:
        lines.append(
            "\n\\* did not beat the majority baseline (always the most frequent training class): "
            "that column learned nothing from the texts, so its comparison is not fair; run again "
            "with a higher --lr or more --epochs"
        )
    return "\n".join(lines)


def heading(results: dict[str, Any]) -> str:
    """The recipe, whether it was a ``--smoke`` run, its date and main settings."""
    title = f"# bertforge recipe {results.get('recipe', '')}".rstrip()
    title += " --smoke" if results.get("smoke") else ""
    settings = [results.get("date")]
    if results.get("smoke"):
        settings.append("smoke run: a tiny model on a slice of the data, a few steps")
    elif results.get("budget"):
        settings.append(f"pretraining budget {results['budget']}")
    if "downstream" in results and results.get("seeds"):
        settings.append("fine-tuning seeds " + ", ".join(str(s) for s in results["seeds"]))
    if results.get("num_threads"):
        settings.append(f"{results['num_threads']} CPU thread(s) per command")
    line = "; ".join(s for s in settings if s)
    return f"{title}\n\n{line}" if line else title


def summary(results: dict[str, Any]) -> str:
    """All of a recipe's tables under its heading, Markdown."""
    parts = [heading(results)]
    if "mlm" in results:
        parts.append(mlm_table(results["mlm"]))
    if "downstream" in results:
        parts.append(downstream_table(results["downstream"]))
    commands = results.get("commands", [])
    total = sum(c["seconds"] for c in commands)
    parts.append(f"{plural(len(commands), 'command')}, {total / 60:.1f} minutes in all")
    return "\n\n".join(parts) + "\n"


__all__ = ["downstream_table", "guesser_row", "heading", "mlm_table", "summary"]
