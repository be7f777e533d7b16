"""A process that imports bertforge (and torch) once, then forks one child process per command
it is sent: each child runs ``bertforge ARGV`` exactly as the CLI does (``cli.main``), with its
own environment, its output in a file, and dies or exits on its own. The fault tests start,
pause and SIGKILL dozens of such runs; forking them from here skips the seconds each fresh
interpreter spends importing torch, which would otherwise dominate the suite's time.

Protocol (one JSON object per line on stdin, one answer per line on stdout)::

    {"op": "run", "argv": [...], "env": {...}, "log": "/path/out.txt"}  -> {"pid": 123}
    {"op": "poll", "pid": 123}   -> {"status": null} while it runs, else {"status": exit code}
    {"op": "wait", "pid": 123}   -> {"status": exit code}  (-9 for SIGKILL)

The parent never runs a torch operation, so no thread pool exists to be broken by ``fork``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402,F401  (imported once, here, for every child)
import torch  # noqa: E402,F401
import torch._dynamo  # noqa: E402,F401  (AdamW imports it on first use: seconds)

with contextlib.suppress(ImportError):  # the metrics logger's optional TensorBoard writer
    import torch.utils.tensorboard  # noqa: F401

import bertforge.cli  # noqa: E402
import bertforge.cli.finetune  # noqa: E402,F401
import bertforge.cli.prepare  # noqa: E402,F401
import bertforge.cli.pretrain  # noqa: E402,F401


def _child(request: dict) -> int:
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.update(request.get("env", {}))
    sys.argv = ["bertforge", *request["argv"]]
    try:
        code = bertforge.cli.main(request["argv"])
    except BaseException:  # a traceback is a failure the tests look for in the log
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def main() -> None:
    exited: dict[int, int] = {}
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "run":
            pid = os.fork()
            if pid == 0:
                os._exit(_child(request))
            answer: dict = {"pid": pid}
        else:
            pid = request["pid"]
            if pid not in exited:
                flags = os.WNOHANG if request["op"] == "poll" else 0
                done, status = os.waitpid(pid, flags)
                if done:
                    exited[pid] = os.waitstatus_to_exitcode(status)
            answer = {"status": exited.get(pid)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
