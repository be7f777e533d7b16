"""What a training run shows and records while it runs: wall-clock durations (``--max_time``
budgets, ETAs), the progress bar on stderr and the ``metrics.jsonl`` log that plots and resumed
runs read. Shared by ``pretrain`` and ``finetune``.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.io import ReadMeter, atomic_write_text, make_directory

# ---- durations ------------------------------------------------------------------------------

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float | int | None) -> float | None:
    """``"15m"``, ``"1h30m"``, ``"90s"``, ``"2.5h"`` or a number of seconds -> seconds; None
    for no budget: None, ``""``, 0 (in any unit), ``"none"``, ``"null"`` or ``"off"``."""
    if text is None or str(text).strip().lower() in ("", "none", "null", "off"):
        return None
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        s = str(text).strip().lower().replace(" ", "")
        if s.startswith("-") and s[1:2].isdigit():
            raise BertforgeError(f"duration {text!r} must be positive (0 or none: no time limit)")
        parts = re.findall(r"(\d+(?:\.\d+)?)([smhd]?)", s)
        if not parts or "".join(n + u for n, u in parts) != s:
            raise BertforgeError(
                f"duration {text!r} is not understood; write e.g. 15m, 1h30m, 90s or 2.5h"
            )
        seconds = sum(float(n) * _UNITS[u or "s"] for n, u in parts)
    if seconds == 0:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        raise BertforgeError(f"duration {text!r} must be positive (0 or none: no time limit)")
    return seconds


def parse_budget(text: str | float | int | None, option: str) -> float | None:
    """:func:`parse_duration` of a time budget the user gives (``--max_time``,
    ``--train.max_time``, ``--budget``, ``--task_budget``), where a bare number other than 0 is
    refused: ``3`` reads as three seconds to the parser and as three minutes or hours to a
    person, so it must carry its unit. Raises naming ``option``."""
    bare = isinstance(text, int | float) or bool(
        re.fullmatch(r"\s*\d+(\.\d+)?\s*", str(text or ""))
    )
    try:
        seconds = parse_duration(text)
    except BertforgeError as err:
        raise BertforgeError(f"{option}: {err}") from None
    if bare and seconds is not None:
        value = str(text).strip()
        raise BertforgeError(
            f"{option} {value}: a bare number; give its unit: {value}s, {value}m or {value}h "
            "(0 or none: no limit)"
        )
    return seconds


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 step``, ``2 steps``, ``1,000 windows``: a count and its noun, plural unless one
    (``many`` where the plural is not noun + s)."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"


class ReadProgress:
    """When a command reading its input through a :class:`bertforge.io.ReadMeter` owes a log
    file a progress line: once the share read has crossed the next multiple of ``step`` and the
    command has run ``after`` seconds (a short run says nothing)."""

    def __init__(self, meter: ReadMeter, start: float, step: float, after: float) -> None:
        self.meter, self.start, self.step, self.after = meter, start, step, after
        self.said = 0.0  # the share last said in a line

    def due(self) -> tuple[float, float, float] | None:
        """``(step crossed, share read, seconds run)`` when a line is due, else None (one lseek)."""
        done = self.meter.fraction()
        if done < self.said + self.step:
            return None
        seconds = time.perf_counter() - self.start
        if seconds < self.after:  # a step of seconds says nothing
            return None
        self.said = math.floor(done / self.step + 1e-9) * self.step  # 5%, 10%...
        return self.said, done, seconds


def time_left(done: float, seconds: float) -> str:
    """``, about 12m23s left``: the time left extrapolated from the share ``done`` read in
    ``seconds``; empty when nothing or everything is read."""
    left = seconds * (1 - done) / done if done > 0 else float("nan")
    return f", about {format_duration(left)} left" if math.isfinite(left) and done < 1 else ""


def count_progress(label: str, unit: str) -> Callable[[int, int], None]:
    """A ``report(done, total)`` that prints (to stderr, as the logs do) ``label: 8,192 of 132,611 texts, 1m05s, about
    16m58s left`` (the clock starts when this is called): for a long pass with no bar."""
    start = time.perf_counter()

    def report(done: int, total: int) -> None:
        seconds = time.perf_counter() - start
        left = time_left(done / total, seconds) if total else ""
        line = f"{label}: {done:,} of {total:,} {unit}, {format_duration(seconds)}{left}"
        print(line, file=sys.stderr, flush=True)

    return report


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))  # a clock step back must not print "-1h59m59s"
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


# ---- metrics --------------------------------------------------------------------------------

METRICS_FILE = "metrics.jsonl"


class MetricsLogger:
    """Append one JSON object per record to ``<out>/metrics.jsonl`` (and TensorBoard if installed).

    Each record is ``{"step": int, "split": "train"|"val"|..., "time": seconds, **metrics}``.
    ``resume_step`` drops records written after that step by an interrupted run, so a resumed run
    continues the file without duplicates. Only the main process should log (``enabled``).
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        enabled: bool = True,
        resume_step: int | None = None,
        tensorboard: bool = True,
    ) -> None:
        self.path = Path(out_dir) / METRICS_FILE
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return

        make_directory(self.path.parent)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = self.path.open("a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.path.parent / "tensorboard"))
            except ImportError:  # tensorboard is optional
                self._tb = None

    def log(self, step: int, split: str, **metrics: float | int | str) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), "split": split, "time": round(time.time(), 3), **metrics}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, int | float) and math.isfinite(value):
                    self._tb.add_scalar(f"{split}/{key}", value, step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``metrics.jsonl`` file (or of the one in a directory); a torn last line is
    ignored."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


# ---- progress bar ---------------------------------------------------------------------------


def item_bar(total: int, desc: str, *, enabled: bool = True, unit: str = " texts") -> Any:
    """A tqdm bar on stderr over the items (texts, sequences) of an inference or evaluation
    command. Drawn only when ``enabled`` and stderr is a terminal: a log file or CI gets none."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=not (enabled and sys.stderr.isatty()),
        mininterval=0.5,
        dynamic_ncols=True,
    )


class ProgressBar:
    """A tqdm bar over steps (or over seconds for a wall-clock budget) showing step, loss, lr,
    tokens/s; tqdm supplies the ETA. When stderr is not a terminal (a log file, CI), it prints a
    plain status line every ``log_interval`` seconds instead. Disabled when ``enabled`` is False
    (non-main ranks)."""

    def __init__(
        self,
        total: float,
        *,
        initial: float = 0,
        by_time: bool = False,
        enabled: bool = True,
        desc: str = "train",
        log_interval: float = 30.0,
    ) -> None:
        from tqdm.auto import tqdm

        self.by_time, self.enabled, self.total = by_time, enabled, total
        self.plain = enabled and not sys.stderr.isatty()
        self.log_interval, self._last_print = log_interval, time.monotonic()
        self._start, self._start_done = time.monotonic(), initial
        fmt = "{desc} {percentage:3.0f}%|{bar:20}| {elapsed}<{remaining} {postfix}"
        self._bar = tqdm(
            total=round(total, 1) if by_time else int(total),
            initial=initial,
            desc=desc,
            disable=not enabled or self.plain,
            bar_format=fmt,
            dynamic_ncols=True,
            file=sys.stderr,
            mininterval=0.5,
        )

    def update(
        self,
        *,
        step: int,
        elapsed: float,
        loss: float,
        lr: float,
        tokens_per_s: float,
        mlm_loss: float | None = None,
    ) -> None:
        """Move to ``step`` (or to ``elapsed`` seconds when the bar counts time). ``mlm_loss``,
        when the loss sums more terms (NSP, bag of words), is shown beside it: the validation
        loss a run prints is the MLM loss alone."""
        done = elapsed if self.by_time else step
        mlm = f" (MLM {mlm_loss:.4f})" if mlm_loss is not None and mlm_loss != loss else ""
        status = f"step {step} loss {loss:.4f}{mlm} lr {lr:.2e} {tokens_per_s:,.0f} tok/s"
        if self.plain:
            now = time.monotonic()
            if now - self._last_print >= self.log_interval or done >= self.total:
                self._last_print = now
                rate = (done - self._start_done) / max(now - self._start, 1e-9)
                eta = max(self.total - done, 0) / rate if rate > 0 else float("nan")
                eta_text = format_duration(eta) if math.isfinite(eta) else "?"
                print(
                    f"[{100 * min(done / self.total, 1):5.1f}%] {status} ETA {eta_text}",
                    file=sys.stderr,
                    flush=True,
                )
            return
        self._bar.set_postfix_str(status, refresh=False)
        target = round(done, 1) if self.by_time else step
        self._bar.update(target - self._bar.n)  # redraws at most every mininterval

    def write(self, text: str) -> None:
        if self.plain:
            print(text, file=sys.stderr, flush=True)
        elif self.enabled:
            self._bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self._bar.close()


__all__ = [
    "item_bar",
    "METRICS_FILE",
    "MetricsLogger",
    "ProgressBar",
    "format_duration",
    "plural",
    "parse_budget",
    "parse_duration",
    "read_metrics",
]
