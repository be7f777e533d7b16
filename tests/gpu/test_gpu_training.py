"""Pretraining on the GPU: the steps equal the CPU's in fp32, bf16 learns, resume is bit-exact,
torchrun with one process (nccl) runs, and compiling (the default on CUDA) keeps its compile
time out of the budget and the losses of the eager step. Tiny models; see ``conftest.py`` for the device and the data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertforge.progress import read_metrics
from bertforge.training.config import ModelSection, PretrainConfig, TrainConfig
from bertforge.training.pretrain import pretrain

TINY_MODEL = ModelSection(
    preset="tiny",
    num_hidden_layers=2,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)
FAST = dict(
    batch_size=16,
    lr=3e-3,
    precision="fp32",
    eval_examples=32,
    eval_every=0,
    save_every=0,
    log_every=1,
    progress=False,
    warmup_ratio=0.1,
    compile=False,  # eager unless a test says otherwise (compiling is the default on CUDA)
)
PAIRS = ("mlm_nsp", "mlm_contrastive")


def cfg(corpus: dict[str, Path], out: Path, device: str, **train) -> PretrainConfig:
    objective = train.get("objective", "mlm_nsp")
    data = corpus["nsp" if objective in PAIRS else "packed"]
    return PretrainConfig(
        data=str(data),
        output=str(out),
        model=TINY_MODEL,
        train=TrainConfig(**(FAST | {"device": device} | train)),
    )


def train_losses(run: Path, key: str = "loss") -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(run) if r["split"] == "train"}


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model" / "model.safetensors"))


@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm", "mlm_contrastive"])
def test_fp32_pretraining_steps_equal_the_cpus(gpu_corpus, tmp_path, device, objective):
    """Five fp32 steps without dropout (the devices draw different masks) from the same start:
    the same losses and weights on the device as on the CPU, within float32 rounding."""
    common = dict(objective=objective, max_steps=5, dropout=0.0)
    pretrain(cfg(gpu_corpus, tmp_path / "dev", device, **common))
    pretrain(cfg(gpu_corpus, tmp_path / "cpu", "cpu", **common))
    a, b = train_losses(tmp_path / "dev"), train_losses(tmp_path / "cpu")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5]
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-4, abs=1e-4), step
    wa, wb = weights(tmp_path / "dev"), weights(tmp_path / "cpu")
    assert wa.keys() == wb.keys()
    for key in wa:
        assert_adam_close(wa[key], wb[key], FAST["lr"] * 5, key)


def assert_adam_close(a: torch.Tensor, b: torch.Tensor, max_update: float, key: str) -> None:
    """Weights after a few AdamW steps, equal within float32 rounding, except where Adam
    magnified it: a gradient near zero (a weight the batch barely reaches) is divided by its
    own tiny norm, so a rounding-sized difference can move that weight by up to the learning
    rate per step. Such weights may differ by at most ``max_update`` (lr x steps), and only a
    few of them: at most 1% of the tensor, or 4 weights of a tensor too small for 1% to be one
    (an H200 run moved 3 of the tiny model's 32 pooler biases by up to 5.3e-4 under the
    contrastive loss, with the losses equal to 1e-4)."""
    diff = (a - b).abs()
    off = diff > 2e-4 + 1e-3 * b.abs()
    if not off.any():
        return
    share = off.float().mean().item()
    worst = diff.max().item()
    few = int(off.sum()) <= max(0.01 * off.numel(), 4)
    assert few and worst <= max_update, (
        f"{key}: {int(off.sum())} of {off.numel()} weights ({share:.2%}) differ beyond float32 "
        f"rounding, the largest by {worst:.2e} (Adam's bound {max_update:.2e})"
    )


def test_replaced_token_detection_trains_on_the_device(gpu_corpus, tmp_path, device):
    """ELECTRA's generator samples on the device (its own random numbers): it runs and learns."""
    result = pretrain(cfg(gpu_corpus, tmp_path / "rtd", device, objective="rtd", max_steps=20))
    assert result["final"]["val"]["loss"] < result["initial"]["val"]["loss"]


def test_bf16_pretraining_learns(gpu_corpus, tmp_path, device):
    """bf16 autocast (fused AdamW, SDPA, sparse head): the loss goes down and nothing is skipped."""
    precision = "bf16" if torch.device(device).type == "cuda" else "fp32"
    run = tmp_path / "bf16"
    result = pretrain(
        cfg(gpu_corpus, run, device, objective="mlm", max_steps=40, precision=precision)
    )
    assert result["final"]["val"]["loss"] < result["initial"]["val"]["loss"] - 0.3
    assert result["skipped"] == 0
    records = [r for r in read_metrics(run) if r["split"] == "train"]
    assert all(r["tokens_per_s"] > 0 for r in records)


def test_resume_is_bit_exact_on_the_device(gpu_corpus, tmp_path, device, deterministic):
    """Dropout on (the device's RNG is saved and restored) and the prefetching loader (each
    step carries its position): resuming at step 3 gives exactly the losses and weights of the
    uninterrupted run. Deterministic kernels: atomics would differ run to run otherwise."""
    # MLM on packed sequences: no op here lacks a deterministic CUDA kernel
    common = dict(objective="mlm", max_steps=6, save_every=3)
    full_cfg = cfg(gpu_corpus, tmp_path / "full", device, **common)
    pretrain(replace(full_cfg, train=replace(full_cfg.train, keep_checkpoints=0)))
    resumed = replace(
        full_cfg,
        output=str(tmp_path / "resumed"),
        resume=str(tmp_path / "full" / "checkpoint-00000003"),
    )
    pretrain(resumed)
    a, b = train_losses(tmp_path / "full"), train_losses(tmp_path / "resumed")
    assert sorted(b) == [4, 5, 6]
    assert [a[s] for s in b] == [b[s] for s in b]  # exactly equal floats
    wa, wb = weights(tmp_path / "full"), weights(tmp_path / "resumed")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _argv(corpus: dict[str, Path], device: str, out: Path) -> list[str]:
    argv = ["--data", str(corpus["packed"]), "--output", str(out)]
    for key, value in asdict(TINY_MODEL).items():
        argv += [f"--model.{key}", str(value)]
    train = FAST | {"device": device, "objective": "mlm", "max_steps": 4, "dropout": 0.0}
    for key, value in train.items():
        argv += [f"--train.{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return argv


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")


def test_torchrun_with_one_process_equals_the_plain_command(gpu_corpus, tmp_path, device):
    """``torchrun --nproc_per_node 1`` (the README's launch with one GPU) runs the same steps
    as ``bertforge pretrain``; and a process group of nccl for the device with gloo for the
    CPU counters (what ``bertforge.distributed`` starts for two or more GPUs) sums the step's
    device-side loss sums and the CPU counts."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not installed next to this python")
    run = [str(torchrun), "--standalone", "--nproc_per_node", "1", "-m", "bertforge.cli"]
    done = subprocess.run(
        [*run, "pretrain", *_argv(gpu_corpus, device, tmp_path / "ddp")],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    plain = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertforge.cli",
            "pretrain",
            *_argv(gpu_corpus, device, tmp_path / "one"),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    a, b = train_losses(tmp_path / "ddp"), train_losses(tmp_path / "one")
    assert a == pytest.approx(b, rel=1e-5)  # the same process, up to atomics' rounding

    backend = "cpu:gloo,cuda:nccl" if torch.device(device).type == "cuda" else "gloo"
    script = tmp_path / "group.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from bertforge import distributed as D\n"
        f"dist.init_process_group({backend!r})\n"
        f"device = torch.device({device!r})\n"
        "on = torch.arange(7, dtype=torch.float64, device=device)\n"
        "cpu = torch.ones(3, dtype=torch.float64)\n"
        "dist.all_reduce(on)\n"  # nccl on CUDA (D.all_reduce_sum skips a group of one)
        "dist.all_reduce(cpu)\n"  # gloo
        "assert on.device.type == device.type and on.tolist() == list(range(7)), on\n"
        "assert cpu.tolist() == [1.0, 1.0, 1.0]\n"
        "assert D.all_reduce_sum(on).tolist() == on.tolist()\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
        "print('process group ok')\n"
    )
    group = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "1", str(script)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert group.returncode == 0 and "process group ok" in group.stdout, group.stderr[-3000:]


def test_compile_time_is_reported_and_kept_out_of_the_budget(gpu_corpus, tmp_path, device):
    """``--train.compile true``: the run reports its compile seconds, and the time budget's
    clock (``elapsed``) counts training only (compiling alone takes longer than these steps)."""
    if torch.device(device).type != "cuda":
        pytest.skip("compiling on the CPU takes minutes on a small machine")
    run = tmp_path / "compiled"
    result = pretrain(cfg(gpu_corpus, run, device, objective="mlm", max_steps=6, compile=True))
    state = json.loads((run / "checkpoint-00000006" / "train_state.json").read_text())
    assert state["compile_seconds"] > 0
    assert result["elapsed"] < state["compile_seconds"]
    records = [r for r in read_metrics(run) if r["split"] == "train"]
    assert records[-1]["compile_seconds"] == pytest.approx(state["compile_seconds"])


@pytest.mark.parametrize("objective", ["mlm_nsp", "mlm"])
def test_compiled_by_default_on_cuda_and_the_losses_of_eager(
    gpu_corpus, tmp_path, device, objective
):
    """``--train.compile`` unset compiles on CUDA (padded NSP pairs and packed sequences, the
    masked rows padded to one count): five fp32 steps without dropout give the eager run's
    losses within the rounding of Inductor's fused kernels."""
    if torch.device(device).type != "cuda":
        pytest.skip("compiling on the CPU takes minutes on a small machine")
    common = dict(objective=objective, max_steps=5, dropout=0.0)
    pretrain(cfg(gpu_corpus, tmp_path / "compiled", device, **common, compile=None))
    pretrain(cfg(gpu_corpus, tmp_path / "eager", device, **common))
    records = [r for r in read_metrics(tmp_path / "compiled") if r["split"] == "train"]
    assert records[-1]["compile_seconds"] > 0  # it did compile
    a, b = train_losses(tmp_path / "compiled"), train_losses(tmp_path / "eager")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5]
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=2e-3, abs=2e-3), step


def test_the_loop_profiles_itself_on_the_device(gpu_corpus, tmp_path, device):
    """``--train.profile``: on CUDA the trace holds the device's kernels, so the summary says how
    busy the GPU was in the loop, and the lagged loop's optimizer phase is there."""
    from bertforge.training.profiling import SKIP_STEPS, SUMMARY_FILE

    run = tmp_path / "profiled"
    pretrain(
        cfg(
            gpu_corpus,
            run,
            device,
            objective="mlm",
            max_steps=SKIP_STEPS + 8,
            profile=4,
            log_every=100,
        )  # fmt: skip
    )
    text = (run / SUMMARY_FILE).read_text()
    assert "profiled 4 steps" in text and "  launch " in text, text[:800]
    if torch.device(device).type == "cuda":
        assert "device busy" in text and "  optimizer " in text, text[:800]
