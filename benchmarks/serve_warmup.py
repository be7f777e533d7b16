"""Time to ready of ``bertforge serve``: seconds from the process's start to the first 200 of
``/health`` (polled every 0.25 s), with N models (default two copies of the installed
all-MiniLM-L6-v2, one name each), beside the warm-up log's own figures: its passes and tokens
(per inference thread), its own seconds, and when its lines appeared (models loaded, the first
requests' shapes warm). Each server is stopped with SIGTERM, as a deployment stops it, and must
exit 0.

``--ref GIT_REF`` times the same against another commit, checked out into a temporary git
worktree (removed at the end) and run by the same interpreter: the two sides alternate, the
order swapped every pair, ``--runs`` pairs; the table gives each side's median, min and max and
the ratio of the medians (with the per-pair ratios' range). Before timing, each side's modules
are compiled and its C kernels built, so no run pays a first start's one-off costs. Writes
results.json (and each start's server log under logs/) to ``--output``.

    flock /tmp/bertforge-heavy.lock python benchmarks/serve_warmup.py --ref 0725b12 --runs 5
    python benchmarks/serve_warmup.py --model clf=runs/clf --model ner=runs/ner --runs 3
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _common import ROOT, log, machine_description, machine_markdown, markdown_table, minilm_dir

POLL_SECONDS = 0.25
"""How often /health is asked (and the log read): the times are this coarse."""


@dataclass
class Start:
    """One start of ``bertforge serve``, seconds from the process's start."""

    ready: float
    """To the first 200 of /health."""
    loaded: float | None
    """To the log's ``warming up ...`` line: the models are loaded (None in a version without
    that line)."""
    first_warm: float | None
    """To the log's ``warmed the first requests' shapes`` line (None without it)."""
    warm_seconds: float | None
    """The warm-up's own time, from its ``warmed N models in S s`` line."""
    passes: int | None
    """Passes of the warm-up on each inference thread, from the same line."""
    tokens: int | None
    """Tokens of the warm-up on each inference thread, from its ``warming up`` line."""
    exit_code: int
    """After SIGTERM: 0 when it stopped cleanly."""


# ---- the warm-up's log ------------------------------------------------------------------------
LOADED = "warming up "
FIRST_WARM = "warmed the first requests' shapes"


def warm_figures(text: str) -> dict[str, float | int | None]:
    """The warm-up's own figures in a server's log: ``warm_seconds`` and ``passes`` (``warmed 2
    models in 19.3 s (183 passes ...``), ``tokens`` (``... 1,234 tokens of the shapes ...``);
    None for what this version does not print."""
    done = re.search(r"warmed \d+ models? in ([\d.]+) s \((\d+) passes", text)
    tokens = re.search(r"([\d,]+) tokens of the shapes", text)
    return {
        "warm_seconds": float(done.group(1)) if done else None,
        "passes": int(done.group(2)) if done else None,
        "tokens": int(tokens.group(1).replace(",", "")) if tokens else None,
    }


# ---- one start ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(port: int) -> int | None:
    """/health's status, None while nothing answers on ``port``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def serve_command(models: dict[str, str], port: int, server_args: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "bertforge.cli", "serve", "--port", str(port)]
    for name, directory in models.items():
        argv += ["--model", f"{name}={directory}"]
    return [*argv, *server_args]


def side_env(src: Path) -> dict[str, str]:
    """The environment that runs the bertforge of ``src`` (ahead of the installed one)."""
    return {**os.environ, "PYTHONPATH": str(src)}


def start_once(
    src: Path, models: dict[str, str], server_args: list[str], log_path: Path, timeout: float
) -> Start:
    """Start the server of ``src``, wait for /health's 200, stop it with SIGTERM."""
    port = free_port()
    marks: dict[str, float] = {}
    with open(log_path, "wb") as sink:
        begin = time.perf_counter()
        process = subprocess.Popen(
            serve_command(models, port, server_args),
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=side_env(src),
            cwd=src.parent,  # `-m` puts the working directory first: never another checkout
            preexec_fn=die_with_parent,
        )
        try:
            while True:
                now = time.perf_counter() - begin
                text = log_path.read_text(errors="replace")
                for mark, line in (("loaded", LOADED), ("first_warm", FIRST_WARM)):
                    if mark not in marks and line in text:
                        marks[mark] = now
                if health(port) == 200:
                    ready = time.perf_counter() - begin
                    break
                if process.poll() is not None:
                    raise SystemExit(
                        f"bertforge serve exited with {process.returncode} before /health said "
                        f"200; its log: {log_path}"
                    )
                if now > timeout:
                    raise SystemExit(
                        f"/health did not answer 200 within {timeout:g} s; raise --timeout "
                        f"(its log: {log_path})"
                    )
                time.sleep(POLL_SECONDS)
        finally:
            exit_code = stop(process)
    figures = warm_figures(log_path.read_text(errors="replace"))
    return Start(
        ready, marks.get("loaded"), marks.get("first_warm"), exit_code=exit_code, **figures
    )


def die_with_parent() -> None:
    """In the server's process before it starts: SIGKILL it when this script dies, even by
    SIGKILL or a test's timeout, so that no server outlives its benchmark (Linux prctl)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def stop(process: subprocess.Popen) -> int:
    """SIGTERM (the server drains and exits 0), SIGKILL after 60 s; the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def prime(src: Path) -> None:
    """Compile ``src``'s modules and build its C kernels (cached per sources and CPU), so the
    timed starts pay neither; a failure here shows in the timed start."""
    code = (
        f"import compileall; compileall.compile_dir({str(src / 'bertforge')!r}, quiet=1)\n"
        "from bertforge.modeling import kernels; kernels.vector_width()"
    )
    subprocess.run([sys.executable, "-c", code], env=side_env(src), cwd=src.parent, check=False)


# ---- sides: this checkout and --ref ------------------------------------------------------------
def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def describe_checkout() -> str:
    """This checkout's short commit, ``+ changes`` when its tracked files differ from it."""
    changed = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + (" + changes" if changed else "")


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def side_summary(starts: list[Start]) -> dict[str, object]:
    """Median, min and max of each timed field over ``starts`` (those the version prints)."""
    out: dict[str, object] = {}
    for name in ("ready", "loaded", "first_warm", "warm_seconds"):
        values = [v for s in starts if (v := getattr(s, name)) is not None]
        out[name] = spread(values) if values else None
    out["passes"] = starts[0].passes
    out["tokens"] = starts[0].tokens
    out["clean_exits"] = sum(s.exit_code == 0 for s in starts)
    return out


def seconds(summary: dict[str, float] | None, digits: int = 1) -> str:
    if summary is None:
        return "-"
    cell = f"{summary['median']:.{digits}f}"
    if summary["min"] != summary["max"]:
        cell += f" ({summary['min']:.{digits}f}-{summary['max']:.{digits}f})"
    return cell


def results_table(sides: dict[str, dict]) -> str:
    """One row a side: seconds to loaded, first requests warm and /health 200 (median, min-max),
    the warm-up's own figures, and the ratio of its median to this checkout's."""
    this = sides["this checkout"]["summary"]["ready"]["median"]
    rows = []
    for label, side in sides.items():
        s = side["summary"]
        ratio = s["ready"]["median"] / this
        pairs = side.get("pair_ratios")
        rows.append(
            [
                label,
                side["commit"],
                f"**{seconds(s['ready'])}**",
                seconds(s["loaded"]),
                seconds(s["first_warm"]),
                seconds(s["warm_seconds"]),
                "-" if s["passes"] is None else f"{s['passes']:,}",
                "-" if s["tokens"] is None else f"{s['tokens']:,}",
                f"{ratio:.2f}x"
                + (
                    f" (pairs {min(pairs):.2f}-{max(pairs):.2f})"
                    if pairs and len(pairs) > 1
                    else ""
                ),
                f"{s['clean_exits']}/{len(side['starts'])}",
            ]
        )
    header = [
        "side",
        "commit",
        "to /health 200, s",
        "to models loaded, s",
        "to first requests warm, s",
        "warm-up (its log), s",
        "warm-up passes",
        "warm-up tokens",
        "/ this checkout",
        "SIGTERM -> exit 0",
    ]
    return markdown_table(header, rows)


def parse_models(values: list[str] | None) -> dict[str, str]:
    """``NAME=DIR`` or ``DIR`` (named by its folder) per --model, a folder made absolute;
    default two copies of the installed all-MiniLM-L6-v2."""
    if not values:
        minilm = str(minilm_dir())
        return {"minilm-a": minilm, "minilm-b": minilm}
    models: dict[str, str] = {}
    for value in values:
        name, _, directory = value.partition("=") if "=" in value else ("", "", value)
        name = name or Path(directory).name
        if Path(directory).exists():  # the servers run in their checkout's folder
            directory = str(Path(directory).resolve())
        if name in models:
            raise SystemExit(f"--model {value}: the name {name!r} is taken; write NAME=DIR")
        models[name] = directory
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", action="append",
        help="NAME=DIR (or DIR), repeated for several models; default two copies of the installed "
        "all-MiniLM-L6-v2",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, default=3, help="starts per side (pairs with --ref)")
    parser.add_argument("--ref", help="a git commit to time against, in a temporary worktree")
    parser.add_argument("--output", default="runs/serve-warmup")
    parser.add_argument(
        "--server_args", default="",
        help="options of bertforge serve for every start, one string: '--workers 2 --num_threads 1'",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a start may take")
    args = parser.parse_args()
    if args.runs < 1:
        raise SystemExit(f"--runs {args.runs}: give 1 or more")
    models = parse_models(args.model)
    server_args = shlex.split(args.server_args)
    out = Path(args.output)
    (out / "logs").mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="bertforge-ref-") as tmp:
        srcs = {"this checkout": ROOT / "src"}
        commits = {"this checkout": describe_checkout()}
        worktree = Path(tmp) / "ref"
        if args.ref:
            commits["--ref"] = git("rev-parse", "--short", f"{args.ref}^{{commit}}")
            git("worktree", "add", "--detach", str(worktree), args.ref)
            srcs["--ref"] = worktree / "src"
        try:
            for label, src in srcs.items():
                log(f"priming {label} ({commits[label]}): compiling, building the C kernels")
                prime(src)
            starts: dict[str, list[Start]] = {label: [] for label in srcs}
            names = list(srcs)
            for run in range(args.runs):
                for label in names if run % 2 == 0 else names[::-1]:
                    path = out / "logs" / f"{'ref' if label == '--ref' else 'this'}-{run + 1}.log"
                    start = start_once(srcs[label], models, server_args, path, args.timeout)
                    starts[label].append(start)
                    log(
                        f"run {run + 1}/{args.runs} {label}: /health 200 after {start.ready:.2f} s "
                        f"(warm-up {start.warm_seconds} s by its log; exit {start.exit_code})"
                    )
        finally:
            if args.ref and worktree.exists():
                git("worktree", "remove", "--force", str(worktree))

    sides: dict[str, dict] = {}
    for label, runs in starts.items():
        sides[label] = {
            "commit": commits[label],
            "starts": [asdict(s) for s in runs],
            "summary": side_summary(runs),
        }
    if args.ref:
        this, ref = starts["this checkout"], starts["--ref"]
        sides["--ref"]["pair_ratios"] = [r.ready / t.ready for r, t in zip(ref, this, strict=True)]
    table = results_table(sides)
    heading = (
        f"bertforge serve, time to ready: {', '.join(f'{n}={d}' for n, d in models.items())}"
        + (f"; serve {args.server_args}" if server_args else "")
        + f"; {args.runs} start{'s' if args.runs > 1 else ''} a side"
        + (", alternating, the order swapped every pair" if args.ref else "")
        + f"; /health polled every {POLL_SECONDS} s"
    )
    print(f"{heading}\n\n{machine_markdown()}\n\n{table}")
    result = {
        "heading": heading,
        "machine": machine_description(),
        "models": models,
        "server_args": server_args,
        "runs": args.runs,
        "ref": args.ref,
        "sides": sides,
        "table": table,
    }
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
