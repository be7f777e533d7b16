"""Training curves as a PNG from ``metrics.jsonl`` (matplotlib with the Agg backend, no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.io import atomic_file
from bertforge.progress import read_metrics


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def run_title(output: str | Path) -> str:
    """A run's name in a plot's title: its folder with the one above it (``runs/my/run`` is
    ``my/run``, a benchmark's ``.../STS-B/seed-0`` is ``STS-B/seed-0``), since the last part
    alone is often a generic name (``run``, ``seed-0``) that says nothing."""
    path = Path(output).resolve()
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def _series(records: list[dict], split: str, key: str) -> tuple[list[int], list[float]]:
    points = [
        (r["step"], r[key])
        for r in records
        if r.get("split") == split and isinstance(r.get(key), int | float)
    ]
    return [s for s, _ in points], [float(v) for _, v in points]


SPLIT_COLORS = ("tab:orange", "tab:red", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
"""Colours of the evaluated splits' loss lines (the training loss is blue)."""
FEW_POINTS = 30
"""Series with at most this many points are drawn with markers."""


def eval_style(points: int) -> dict[str, Any]:
    """How an evaluated split is drawn: a line through its points, or markers alone when it has
    two or fewer (an ``--extra_eval`` set is evaluated before and after training only: a line
    between the two would show a trajectory nobody measured)."""
    if points <= 2:
        return {"marker": "o", "markersize": 5, "linestyle": "none"}
    return {"marker": "o", "markersize": 3, "linewidth": 1.5}


POOLER_LOSSES = (
    ("bow_loss", "bag of words", "tab:olive"),
    ("similarity_loss", "pair similarity, 1 - Pearson r", "tab:cyan"),
)
"""Losses on the pooler drawn beside NSP's: (metrics key, label, colour)."""


RETRIEVAL_KEYS = ("mrr@10", "ndcg@10", "recall@1", "recall@10")
"""The retrieval scores an embedding run logs that the evaluation panel draws (recall@100 is
left out: on a validation set of a few hundred documents it is 1 from the start)."""


def score_axis(keys: list[str]) -> str:
    """The evaluation panel's axis label for the scores ``keys``: ``accuracy`` when every one is
    an accuracy, ``retrieval score`` for an embedding run's MRR/nDCG/recall, else ``score`` (F1,
    Spearman)."""
    if keys and all(k.endswith("accuracy") for k in keys):
        return "accuracy"
    if any(k in RETRIEVAL_KEYS for k in keys):
        return "retrieval score"
    return "score"


def plot_training_curves(metrics: str | Path, output: str | Path, title: str | None = None) -> Path:
    """Draw loss (train and every evaluated split), the evaluated accuracies and the learning
    rate against the optimizer step, and the NSP loss (or an rtd run's discriminator loss; with
    ``--train.bow_weight`` or ``--train.similarity_weight`` those losses beside it; a
    ModernBERT's similarity loss alone) on a panel of its own when the run has
    one (the loss panel then compares the training MLM loss with the validation MLM loss); write
    ``output`` (PNG) and return its path.

    Works for any ``metrics.jsonl`` written by :class:`bertforge.progress.MetricsLogger`: train
    records carry ``loss`` and ``lr``; evaluation records (any other ``split``) carry ``loss`` and
    optionally ``accuracy``/``top5_accuracy``/``nsp_accuracy``/``contrastive_accuracy``, a
    fine-tuned model's ``f1``/``spearman`` (a tagger's ``entity_f1``/``token_accuracy``, a
    reader's ``exact_match``, a classifier's ``macro_f1``/``mcc``), an embedding run's
    ``mrr@10``/``ndcg@10``/``recall@k`` (its step 0: the start model) or ``spearman``/``pearson``,
    a distilled student's ``agreement`` with its teacher or an embedding student's ``cosine``.
    """
    plt = _pyplot()

    records = read_metrics(metrics)
    splits = sorted({r.get("split") for r in records if r.get("split") not in (None, "train")})
    acc_keys = [
        k
        for k in (
            "accuracy",
            "top5_accuracy",
            "nsp_accuracy",
            "rtd_accuracy",
            "contrastive_accuracy",
            "token_accuracy",
            "f1",
            "entity_f1",
            "exact_match",
            "macro_f1",
            "mcc",
            "spearman",
            *RETRIEVAL_KEYS,
            "pearson",
            "cosine",
            "agreement",
        )
        if any(isinstance(r.get(k), int | float) for r in records if r.get("split") != "train")
    ]

    # like with like: validation loss is MLM only, so beside it goes the MLM part of the training
    # loss (pretraining logs mlm_loss and nsp_loss or rtd_loss apart); the other loss gets its
    # own panel
    train_key = "mlm_loss" if _series(records, "train", "mlm_loss")[0] else "loss"
    # similarity_loss last: a ModernBERT's (no NSP) has the panel to itself, BERT's sits beside NSP
    aux_keys = ("nsp_loss", "rtd_loss", "contrastive_loss", "similarity_loss")
    aux = [k for k in aux_keys if _series(records, "train", k)[0]]
    nsp_steps, nsp_loss = _series(records, "train", aux[0]) if aux else ([], [])
    panels = 4 if nsp_steps else 3
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.2))
    # the NSP panel (if any) sits beside the loss panel
    ax_loss, ax_acc, ax_lr = (axes[0], axes[2], axes[3]) if nsp_steps else axes
    steps, loss = _series(records, "train", train_key)
    few = len(steps) <= FEW_POINTS  # a short run: draw its points, a line alone is near-empty
    if steps:
        ax_loss.plot(
            steps,
            loss,
            color="tab:blue",
            alpha=0.8 if few else 0.35,
            linewidth=0.8,
            marker="o" if few else None,
            markersize=3,
            label="train",
        )
        window = max(1, len(loss) // 50)
        if window > 1:  # a moving average reads better than the raw, noisy loss
            windows = (loss[max(0, i - window + 1) : i + 1] for i in range(len(loss)))
            smooth = [sum(w) / len(w) for w in windows]
            ax_loss.plot(
                steps, smooth, color="tab:blue", linewidth=1.5, label=f"train (mean of {window})"
            )
    for split, color in zip(splits, SPLIT_COLORS, strict=False):
        s, v = _series(records, split, "loss")
        if s:
            ax_loss.plot(s, v, color=color, label=split, **eval_style(len(s)))
    loss_title = "masked-LM loss" if train_key == "mlm_loss" else "loss"
    ax_loss.set(xlabel="step", ylabel="loss (nats)", title=loss_title)
    ax_loss.legend(fontsize=8)
    if nsp_steps:
        ax_nsp = axes[1]
        # the pooler's other losses beside NSP (--train.bow_weight, --train.similarity_weight)
        extra = [
            (key, label, color, *_series(records, "train", key))
            for key, label, color in POOLER_LOSSES
        ]
        extra = [e for e in extra if e[3] and e[0] != aux[0]]
        ax_nsp.plot(
            nsp_steps,
            nsp_loss,
            color="tab:purple",
            linewidth=0.8,
            marker="o" if len(nsp_steps) <= FEW_POINTS else None,
            markersize=3,
            label="NSP (train)" if extra else "train",
        )
        for _, label, color, steps_, values in extra:
            ax_nsp.plot(
                steps_,
                values,
                color=color,
                linewidth=0.8,
                marker="o" if len(steps_) <= FEW_POINTS else None,
                markersize=3,
                label=f"{label} (train)",
            )
        aux_title = {
            "nsp_loss": "NSP loss",
            "rtd_loss": "replaced-token loss (discriminator)",
            "contrastive_loss": "same-document contrastive loss",
            "similarity_loss": "pair-similarity loss (1 - Pearson r)",
        }[aux[0]]
        if extra:
            aux_title = "the pooler's losses"
        ax_nsp.set(xlabel="step", ylabel="loss", title=aux_title)
        ax_nsp.legend(fontsize=8)

    before = False  # a score at step 0: the model before training (an embedding run's start)
    for split in splits:
        for key in acc_keys:
            s, v = _series(records, split, key)
            if s:
                ax_acc.plot(s, v, label=f"{split} {key}", **eval_style(len(s)))
                before = before or s[0] == 0
    xlabel = "step (0: before training)" if before else "step"
    ax_acc.set(xlabel=xlabel, ylabel=score_axis(acc_keys), title="evaluation")
    if ax_acc.lines:
        ax_acc.legend(fontsize=8)

    s, v = _series(records, "train", "lr")
    if s:
        ax_lr.plot(
            s, v, color="tab:green", marker="o" if len(s) <= FEW_POINTS else None, markersize=3
        )
    ax_lr.set(xlabel="step", ylabel="learning rate", title="learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, output)


# ---- fine-tuned task plots (added by the fine-tuning issue) -------------------------------------


def _save(fig, output: str | Path) -> Path:
    plt = _pyplot()

    try:
        with atomic_file(output) as tmp:  # a reader never sees a half-written PNG
            fig.savefig(tmp, format="png", dpi=110)
    finally:
        plt.close(fig)
    return Path(output)


def plot_confusion_matrix(
    cm, labels: list[str], output: str | Path, title: str | None = None
) -> Path:
    """A confusion matrix (rows: true label, columns: predicted) with counts and row shares."""
    plt = _pyplot()
    import numpy as np

    cm = np.asarray(cm)
    shares = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)  # each row sums to 1
    k = len(labels)
    fig, ax = plt.subplots(figsize=(1.2 * k + 3, 1.0 * k + 2.5))
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    for i in range(k):
        for j in range(k):
            ax.text(
                j,
                i,
                f"{cm[i, j]}\n{shares[i, j]:.1%}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if shares[i, j] > 0.5 else "black",
            )
    ax.set_xticks(range(k), labels, rotation=45 if k > 4 else 0, ha="right" if k > 4 else "center")
    ax.set_yticks(range(k), labels)
    ax.set(xlabel="predicted", ylabel="true", title=title or "confusion matrix")
    fig.colorbar(image, ax=ax, fraction=0.046, label="share of the true class")
    fig.tight_layout()
    return _save(fig, output)


def plot_regression_scatter(y_true, y_pred, output: str | Path, title: str | None = None) -> Path:
    """Predicted against true values, with the y = x line."""
    plt = _pyplot()
    import numpy as np

    y_true, y_pred = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    fig, ax = plt.subplots(figsize=(5.5, 5))
    jitter = np.random.default_rng(0).uniform(-0.15, 0.15, y_true.size)  # integer scores overlap
    ax.scatter(y_true + jitter, y_pred, s=6, alpha=0.35)
    lo, hi = float(min(y_true.min(), y_pred.min())), float(max(y_true.max(), y_pred.max()))
    ax.plot([lo, hi], [lo, hi], color="tab:red", linewidth=1, label="y = x")
    ax.set(xlabel="true", ylabel="predicted", title=title or "predicted vs true")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, output)


def bar_value(value: float) -> str:
    """A bar's label: one decimal below 10 (2.8 is not "3", 0.3 not "0"), whole numbers above."""
    return f"{value:.1f}" if abs(value) < 10 else f"{value:.0f}"


def grouped_bars_figure(
    groups: dict[str, dict[str, float]],
    categories: list[str],
    title: str | None = None,
    ylabel: str = "",
    hatched: tuple[str, ...] = (),
) -> Any:
    """The figure of :func:`plot_grouped_bars` (drawn, not saved): its legend sits below the
    category labels, however many lines they take."""
    plt = _pyplot()

    n = max(1, len(groups))
    width = 0.8 / n
    # constrained layout puts an "outside" legend under everything the axes draw, tick labels
    # of three lines included (a fixed offset under the axes hid them behind the legend)
    fig, ax = plt.subplots(
        figsize=(max(6.0, 1.2 * len(categories) * (0.6 + 0.15 * n)), 4.8), layout="constrained"
    )
    for i, (series, values) in enumerate(groups.items()):
        xs = [j + (i - (n - 1) / 2) * width for j, c in enumerate(categories) if c in values]
        ys = [values[c] for c in categories if c in values]
        style = {"hatch": "///", "alpha": 0.6} if series in hatched else {}
        bars = ax.bar(xs, ys, width=width * 0.95, label=series, **style)
        ax.bar_label(bars, fmt=bar_value, fontsize=6, padding=1)
    ax.set_xticks(range(len(categories)), categories)
    ax.set(ylabel=ylabel, title=title or "")
    ax.axhline(0, color="black", linewidth=0.6)
    fig.legend(fontsize=7, ncol=min(4, n), loc="outside lower center")
    return fig


def plot_grouped_bars(
    groups: dict[str, dict[str, float]],
    categories: list[str],
    output: str | Path,
    title: str | None = None,
    ylabel: str = "",
    hatched: tuple[str, ...] = (),
) -> Path:
    """Grouped bars: one group per category (x axis), one bar per entry of ``groups``
    (``{series: {category: value}}``; a missing value leaves a gap), each labelled with its
    value; the series in ``hatched`` are drawn hatched (numbers of another kind, e.g.
    published ones); the legend under the category labels."""
    return _save(grouped_bars_figure(groups, categories, title, ylabel, hatched), output)


LABEL_BOX = {"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
"""Behind a value written on a chart: it stays readable where a line crosses it."""
REFERENCE_STYLES = (
    {"color": "tab:gray", "linestyle": "--"},
    {"color": "tab:purple", "linestyle": ":"},
    {"color": "tab:brown", "linestyle": "-."},
)
"""How the reference lines of :func:`plot_score_curves` are drawn, in order."""
SERIES_COLORS = ("tab:blue", "tab:green", "tab:orange", "tab:cyan")
"""The colours of :func:`plot_score_curves`' series, in order (red marks the start)."""


def plot_score_curves(
    panels: dict[str, dict[str, list[tuple[float, float]]]],
    output: str | Path,
    *,
    starts: dict[str, tuple[str, dict[str, float]]],
    references: dict[str, dict[str, float]],
    title: str,
    subtitle: str,
    xlabel: str,
    ylabel: str,
) -> Path:
    """Small panels side by side, one per entry of ``panels`` (``{panel: {series: [(x, y),
    ...]}}``): each series a line of its own colour (:data:`SERIES_COLORS`, labelled by its key)
    with each value written beside it (above the highest point at each x, below the others);
    a series' start (``starts``: ``{series: (label, {panel: y})}``, at x = 0; a series without
    one has none) marked apart, a red square when there is one start, else a square of its
    series' colour, and joined to its series' first point by a dotted segment; each of
    ``references`` (``{label: {panel: y}}``) a horizontal line across the panel, its value at
    the right end. One legend under the panels, so it covers no line."""
    plt = _pyplot()

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
    xs_all = sorted(
        {x for series in panels.values() for pts in series.values() for x, _ in pts} | {0.0}
    )
    for ax, (panel, series) in zip(axes[0], panels.items(), strict=True):
        top: dict[float, float] = {}  # at each x, the highest point: its value goes above it
        for points in series.values():
            for x, y in points:
                top[x] = max(top.get(x, y), y)
        colors = {label: SERIES_COLORS[k % len(SERIES_COLORS)] for k, label in enumerate(series)}
        for label, points in series.items():
            points = sorted(points)
            if not points:
                continue
            color = colors[label]
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, color=color, marker="o", markersize=5, linewidth=1.8, label=label)
            for x, y in points:  # the others' values below their points, clear of the top's
                offset = 7 if y >= top[x] else -14
                ax.annotate(f"{y:.1f}", (x, y), textcoords="offset points", xytext=(0, offset),
                            ha="center", fontsize=8, color=color, bbox=LABEL_BOX)  # fmt: skip
            y0 = starts.get(label, ("", {}))[1].get(panel)
            if y0 is not None:  # what pretraining added between its twin and its first point
                ax.plot([0.0, points[0][0]], [y0, points[0][1]], color=color, linestyle=":",
                        linewidth=1.2)  # fmt: skip
        here = sorted(
            [(values[panel], label, name) for label, (name, values) in starts.items()
             if panel in values],
            reverse=True,
        )  # fmt: skip
        for k, (y0, label, name) in enumerate(here):
            color = "tab:red" if len(starts) == 1 else colors.get(label, "tab:red")
            ax.plot([0.0], [y0], color=color, marker="s", markersize=7, linestyle="none",
                    label=name)  # fmt: skip
            # the lowest start's value below it, the others' above: two twins do not overlap
            offset = -13 if k == len(here) - 1 else 7
            ax.annotate(f"{y0:.1f}", (0.0, y0), textcoords="offset points", xytext=(0, offset),
                        ha="center", fontsize=8, color=color, bbox=LABEL_BOX)  # fmt: skip
        lines = sorted(
            [(values[panel], label, style)
             for (label, values), style in zip(references.items(), REFERENCE_STYLES, strict=False)
             if panel in values],
            key=lambda line: line[0],
        )  # fmt: skip
        for y, label, style in lines:
            ax.axhline(y, linewidth=1.3, label=label, **style)
        ax.margins(y=0.15)
        low, high = ax.get_ylim()
        lift, previous = 0.0, None
        for y, _, style in lines:  # each value at the line's right end
            close = previous is not None and y - previous < 0.04 * (high - low)
            lift = lift + 9 if close else 0.0  # two lines a hair apart: one value above the other
            previous = y
            ax.annotate(f"{y:.1f}", (1.0, y), xycoords=("axes fraction", "data"),
                        textcoords="offset points", xytext=(3, lift), va="center", fontsize=8,
                        color=style["color"])  # fmt: skip
        ax.set_xticks(xs_all, [f"{x:g}" for x in xs_all])
        ax.set(title=panel, xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.25)
    seen: dict[str, Any] = {}  # every panel's entries once (a panel may lack a reference)
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(4, len(seen)),
               fontsize=8, frameon=False)  # fmt: skip
    fig.suptitle(f"{title}\n{subtitle}", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return _save(fig, output)


__all__ = [
    "bar_value",
    "grouped_bars_figure",
    "plot_confusion_matrix",
    "plot_grouped_bars",
    "plot_regression_scatter",
    "plot_score_curves",
    "plot_training_curves",
    "run_title",
]
