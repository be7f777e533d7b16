"""Training runtime: durations, precision choice, RNG state, train-state files, rotation,
metrics log and the signal handler."""

from __future__ import annotations

import contextlib
import os
import random
import signal

import numpy as np
import pytest
import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.progress import MetricsLogger, parse_duration, read_metrics
from bertforge.runtime import (
    autocast,
    cpu_flags,
    cpu_has_fast_bf16,
    cpu_model,
    pick_device,
    pick_precision,
    seed_everything,
)
from bertforge.training.checkpoints import (
    GracefulStop,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_train_state,
    rotate_checkpoints,
    save_train_state,
)
from bertforge.training.optim import build_optimizer


def test_parse_duration():
    assert parse_duration("15m") == 900
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90s") == 90
    assert parse_duration("2.5h") == 9000
    assert parse_duration("120") == 120
    assert parse_duration(None) is None
    for unset in ("0", "0s", 0, "none", "None", "null", "off", ""):  # issue 43: no budget
        assert parse_duration(unset) is None, unset
    for bad in ("15 minutes", "m15", "-5m", "-1"):
        with pytest.raises(BertforgeError, match="duration"):
            parse_duration(bad)


def test_cpu_flags_read_the_first_flags_line_only():
    info = "processor : 0\nmodel name : X\nflags : fpu avx2 fma\n\nprocessor : 1\nflags : sse2\n"
    assert cpu_flags(info) == {"fpu", "avx2", "fma"}
    assert cpu_flags("processor : 0\nFeatures : fp asimd bf16\n") == frozenset()  # ARM
    assert cpu_flags("") == frozenset()
    assert not cpu_has_fast_bf16("Features : fp asimd bf16")
    assert not cpu_has_fast_bf16("model name : avx512_bf16 lookalike\nflags : fpu avx2")


def test_kernel_cache_key_tells_cpus_with_one_model_name_apart():
    """A VM shows ``AMD EPYC`` for an AVX2-only Zen 3 and an AVX-512 Zen 4: a kernel library
    built with -march=native on one must not be loaded on the other from a shared cache."""
    from bertforge.modeling.kernels import cpu_signature

    zen3 = "processor : 0\nmodel name : AMD EPYC\nflags : fpu avx2 fma\n"
    zen4 = "processor : 0\nmodel name : AMD EPYC\nflags : fpu avx2 fma avx512f avx512_bf16\n"
    assert cpu_model(zen3) == cpu_model(zen4) == "AMD EPYC"
    assert cpu_signature(zen3) != cpu_signature(zen4)
    assert cpu_signature(zen3) == cpu_signature(zen3.replace("fpu avx2 fma", "fma fpu avx2"))
    assert cpu_model("processor : 0\nFeatures : fp asimd\n")  # no model name: platform's answer


def test_precision_choice_follows_cpu_flags():
    assert cpu_has_fast_bf16("flags : fpu avx512f avx512_bf16 amx_tile")
    assert cpu_has_fast_bf16("flags : fpu amx_bf16")
    assert not cpu_has_fast_bf16("flags : fpu avx2 avx512f")
    cpu = torch.device("cpu")
    assert pick_precision("fp32", cpu) == "fp32"
    assert pick_precision("bf16", cpu) == "bf16"
    assert pick_precision("auto", cpu) == ("bf16" if cpu_has_fast_bf16() else "fp32")
    with pytest.raises(BertforgeError, match="--precision"):
        pick_precision("fp16x", cpu)
    assert pick_device("cpu") == cpu
    with autocast(cpu, "bf16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(cpu, "fp32"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_device_errors_name_the_option_as_the_command_spells_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BertforgeError) as err:
        pick_device("cuda", option="--train.device")
    assert str(err.value) == (
        "--train.device cuda: CUDA is not available here; use --train.device cpu or auto"
    )
    with pytest.raises(BertforgeError, match=r"^--device 'gpu0' is not a device"):
        pick_device("gpu0")


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(np.random.randn()), float(torch.rand(1))


def test_train_state_round_trip_restores_optimizer_and_every_rng(tmp_path):
    seed_everything(3)
    model = nn.Linear(4, 3)
    opt = build_optimizer(model, lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    np.random.randn()  # leave a cached gaussian in NumPy's state
    save_train_state(
        tmp_path / "ck", state={"step": 7, "data": {"epoch": 1, "index": 40}}, optimizer=opt
    )
    expected = _draws()

    seed_everything(99)
    fresh = build_optimizer(nn.Linear(4, 3), lr=0.5)
    state, _ = load_train_state(tmp_path / "ck", optimizer=fresh)
    assert state == {"step": 7, "data": {"epoch": 1, "index": 40}}
    assert _draws() == expected
    saved = opt.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], saved)
    assert fresh.param_groups[0]["lr"] == 0.01
    with pytest.raises(BertforgeError, match="not a training checkpoint"):
        load_train_state(tmp_path)


def test_rotation_keeps_the_newest_complete_checkpoints(tmp_path):
    for step in (5, 10, 100, 20):
        save_train_state(tmp_path / checkpoint_name(step), state={"step": step})
    (tmp_path / checkpoint_name(500)).mkdir()  # incomplete: no train state, never "latest"
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        checkpoint_name(s) for s in (5, 10, 20, 100)
    ]
    deleted = rotate_checkpoints(tmp_path, keep=2)
    assert [p.name for p in deleted] == [checkpoint_name(5), checkpoint_name(10)]
    assert latest_checkpoint(tmp_path).name == checkpoint_name(100)
    assert not (tmp_path / checkpoint_name(5)).exists()


def test_metrics_log_resume_drops_records_after_the_checkpoint(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 6):
        log.log(step, "train", loss=1.0 / step)
    log.close()
    log = MetricsLogger(tmp_path, resume_step=3, tensorboard=False)
    log.log(4, "train", loss=0.3)
    log.close()
    records = read_metrics(tmp_path)
    assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.3)]


def test_graceful_stop_turns_a_signal_into_a_request_and_restores_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with GracefulStop() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):  # a second signal stops at once
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_keep_freed_memory_takes_on_glibc_and_can_be_left_off():
    """In a process of its own (the setting is process-wide): glibc's mallopt accepts both
    thresholds; ``BERTFORGE_MALLOC=default`` leaves malloc alone."""
    import os
    import platform
    import subprocess
    import sys

    code = "from bertforge.runtime import keep_freed_memory; print(keep_freed_memory())"
    for setting, expected in (("", platform.libc_ver()[0] == "glibc"), ("default", False)):
        env = {**os.environ, "BERTFORGE_MALLOC": setting}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(expected)


def test_training_commands_keep_freed_memory_and_others_do_not(monkeypatch, capsys):
    from bertforge import cli, runtime

    calls = []
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: calls.append("malloc") or True)
    for name in ("pretrain", "tokenizer"):
        with contextlib.suppress(SystemExit):
            cli.main([name, "--help"])
    capsys.readouterr()
    assert calls == ["malloc"]  # pretrain only
    assert set(cli.COMMANDS) >= cli.TRAINING_COMMANDS


def test_compile_seconds_counts_the_time_torch_compile_takes():
    """What the loops keep out of a time budget: grows by the compile of a new function (and
    not by running it again)."""
    from bertforge.runtime import compile_seconds

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2 + x.cos()

    before = compile_seconds()
    compiled = torch.compile(f, backend="eager")
    x = torch.randn(8)
    torch.testing.assert_close(compiled(x), f(x))
    after = compile_seconds()
    assert after > before
    compiled(x)
    assert compile_seconds() == after


def test_a_script_configures_its_process_as_the_command_would(monkeypatch):
    """``cli.configure_process``, which ``main`` runs before a command and a benchmark script
    calls in a process of its own: malloc for the training commands, oneDNN's kernel caches
    bounded (fewer for pretraining), nothing for the others."""
    from bertforge import cli, runtime

    calls = []
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: calls.append("malloc") or True)
    monkeypatch.setattr(runtime, "bound_kernel_caches", lambda cap: calls.append(cap))
    for name in ("finetune", "pretrain", "serve", "tokenizer"):
        cli.configure_process(name)
    assert calls == [
        "malloc", runtime.ONEDNN_CACHE_CAPACITY,
        "malloc", runtime.PRETRAIN_CACHE_CAPACITY,
        runtime.ONEDNN_CACHE_CAPACITY,
    ]  # fmt: skip
