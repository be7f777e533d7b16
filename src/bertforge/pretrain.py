"""``bertforge pretrain``: the pretraining loop, one flat function.

Per optimizer step: set the LR (a pure function of the step, or of elapsed time for a wall-clock
budget) -> draw this rank's share of the global batch -> accumulate micro-batches (loss
normalised by the GLOBAL number of masked tokens, so N ranks x B/N equal 1 process x B) -> clip ->
step unless the loss is non-finite -> log -> maybe evaluate / checkpoint / stop on a signal.

The run directory holds ``pretrain_config.yaml`` (the resolved config), ``metrics.jsonl``,
``checkpoint-*`` (model + optimizer + RNG + data position, the newest K), ``curves.png`` and the
final ``model/`` (config.json, model.safetensors, vocab.txt, tokenizer.json).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml
from torch import nn

from bertforge import distributed as D
from bertforge.checkpoint import atomic_directory, atomic_write_text
from bertforge.config import PretrainConfig
from bertforge.data.loader import PretrainingCollator, PretrainingSampler, validation_batches
from bertforge.data.shards import TOKENIZER_DIR, PretrainingDataset, read_meta
from bertforge.errors import BertforgeError
from bertforge.evaluate import comparison_table, evaluate_mlm
from bertforge.model import IGNORE_INDEX, BertForMaskedLM, BertForPreTraining
from bertforge.optim import build_optimizer, lr_at, lr_at_progress, set_lr
from bertforge.plots import plot_training_curves
from bertforge.runtime import (
    TRAIN_STATE_JSON,
    GracefulStop,
    MetricsLogger,
    ProgressBar,
    autocast,
    checkpoint_name,
    format_duration,
    latest_checkpoint,
    load_train_state,
    parse_duration,
    pick_device,
    pick_precision,
    rng_state,
    rotate_checkpoints,
    save_train_state,
    seed_everything,
    set_rng_state,
)
from bertforge.tokenizer import Tokenizer

CONFIG_FILE = "pretrain_config.yaml"
FINAL_DIR = "model"
PLOT_FILE = "curves.png"


def set_dropout(model: nn.Module, p: float) -> None:
    """Use dropout rate ``p`` everywhere in ``model`` (its config, saved for fine-tuning, keeps
    its own values)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = p
        if hasattr(module, "dropout_p"):  # attention dropout goes to SDPA as a float
            module.dropout_p = p


def find_resume(cfg: PretrainConfig) -> Path | None:
    """The checkpoint to continue from: ``--resume`` (a checkpoint or a run directory), else the
    newest checkpoint already in ``--output``, else None (a fresh run)."""
    if cfg.resume:
        path = Path(cfg.resume)
        if (path / TRAIN_STATE_JSON).is_file():
            return path
        latest = latest_checkpoint(path)
        if latest is None:
            raise BertforgeError(
                f"--resume {path}: no checkpoint-* with a train state there; "
                "give a checkpoint directory or a run directory holding one"
            )
        return latest
    return latest_checkpoint(cfg.output)


def config_dict(cfg: PretrainConfig) -> dict[str, Any]:
    """The config as plain YAML-able data (the shape ``--config`` reads back)."""
    return json.loads(json.dumps(asdict(cfg)))  # tuples -> lists


def _identity(cfg: PretrainConfig, meta: dict, n_train: int) -> dict[str, Any]:
    """What must not change between a run and its resumption for the data to continue exactly."""
    return json.loads(
        json.dumps(
            {
                "batch_size": cfg.train.batch_size,
                "seed": cfg.train.seed,
                "objective": cfg.train.objective,
                "masking": asdict(cfg.masking),
                "tokenizer": meta["tokenizer_fingerprint"],
                "train_examples": n_train,
            }
        )
    )


def pretrain(cfg: PretrainConfig) -> dict[str, Any]:
    """Run (or resume) pretraining as configured; return the initial and final evaluations, the
    step reached and where the model and plot are. See the module docstring for the loop."""
    tc = cfg.train
    if tc.max_steps is None and tc.max_time is None:
        raise BertforgeError("set a budget: --train.max_steps N or --train.max_time 15m (or both)")
    budget = parse_duration(tc.max_time)
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    device = pick_device(tc.device)
    info = D.init_distributed(device)
    device = D.local_device(device, info)
    precision = pick_precision(tc.precision, device)
    out = Path(cfg.output)
    main_proc = info.is_main

    def say(text: str) -> None:
        if main_proc:
            print(text, file=sys.stderr, flush=True)

    # ---- data --------------------------------------------------------------------------------
    meta = read_meta(cfg.data)
    tokenizer = Tokenizer.from_file(Path(cfg.data) / TOKENIZER_DIR)
    train_ds = PretrainingDataset(cfg.data, "train", tokenizer)
    val_ds = PretrainingDataset(cfg.data, "validation", tokenizer)
    extra = {}
    for path in cfg.extra_eval or []:
        splits = read_meta(path)["splits"]
        split = "validation" if splits.get("validation", {}).get("instances") else "train"
        extra[Path(path).name] = PretrainingDataset(path, split, tokenizer)
    use_nsp = tc.objective == "mlm_nsp"
    if use_nsp and train_ds.mode != "nsp":
        raise BertforgeError(
            f"{cfg.data} was prepared in {train_ds.mode!r} mode, without NSP "
            "labels; use --train.objective mlm or prepare with --mode nsp"
        )
    model_config = cfg.model.to_bert_config(tokenizer.vocab_size)
    if meta["max_seq_length"] > model_config.max_position_embeddings:
        raise BertforgeError(
            f"data max_seq_length={meta['max_seq_length']} exceeds "
            f"--model.max_position_embeddings={model_config.max_position_embeddings}"
        )
    if tc.batch_size % info.world_size:
        raise BertforgeError(
            f"--train.batch_size {tc.batch_size} is not divisible by the "
            f"{info.world_size} processes; choose a multiple of {info.world_size}"
        )
    per_rank = tc.batch_size // info.world_size
    micro = min(tc.micro_batch_size or per_rank, per_rank)
    if per_rank % micro:
        raise BertforgeError(
            f"--train.micro_batch_size {micro} does not divide the per-process "
            f"batch {per_rank} (= batch_size / processes); choose a divisor"
        )
    accum = per_rank // micro
    sampler = PretrainingSampler(
        len(train_ds),
        tc.batch_size,
        rank=info.rank,
        world_size=info.world_size,
        seed=tc.seed,
        lengths=train_ds.lengths if cfg.masking.bucket_window else None,
        bucket_window=cfg.masking.bucket_window,
    )
    collator = PretrainingCollator(
        tokenizer,
        mlm_probability=cfg.masking.mlm_probability,
        replace_probs=cfg.masking.replace_probs,
        whole_word=cfg.masking.whole_word,
        max_predictions=cfg.masking.max_predictions,
        seed=tc.seed,
    )

    # ---- model, optimizer, state ----------------------------------------------------------------
    seed_everything(tc.seed)
    model_cls = BertForPreTraining if use_nsp else BertForMaskedLM
    resume_dir = find_resume(cfg)
    if resume_dir is None:
        model = model_cls(model_config)
    else:
        model = model_cls.from_pretrained(resume_dir)
        if model.config.to_dict() | {"architectures": None} != model_config.to_dict() | {
            "architectures": None
        }:
            raise BertforgeError(
                f"{resume_dir}: its model config differs from --model.*; resume "
                "with the original settings or start a new --output"
            )
    if tc.dropout is not None:
        set_dropout(model, tc.dropout)
    raw = model.to(device)  # the plain module: what is saved and evaluated
    optimizer = build_optimizer(raw, tc.lr, tc.weight_decay, tuple(tc.betas), tc.eps)
    torch.manual_seed(tc.seed + 1 + 7919 * info.rank)  # each rank its own dropout stream
    identity = _identity(cfg, meta, len(train_ds))
    state: dict[str, Any] = {
        "step": 0,
        "elapsed": 0.0,
        "tokens": 0,
        "skipped": 0,
        "data": sampler.state_dict(),
        "initial_eval": None,
        "run": identity,
    }
    if resume_dir is not None:
        state, blob = load_train_state(resume_dir, optimizer=optimizer, restore_rng=False)
        for key, value in identity.items():
            if state["run"].get(key) != value:
                raise BertforgeError(
                    f"{resume_dir}: {key} was {state['run'].get(key)!r}, now "
                    f"{value!r}; resume with the original setting or start a new --output"
                )
        per_rank_rng = blob.get("rng_per_rank") or [blob["rng"]]
        set_rng_state(per_rank_rng[info.rank] if info.rank < len(per_rank_rng) else blob["rng"])
        sampler.load_state_dict(state["data"])
        say(
            f"resuming from {resume_dir} at step {state['step']}"
            + (f" ({format_duration(state['elapsed'])} of the budget used)" if budget else "")
        )
    ddp = D.wrap_ddp(raw, device, info)
    forward = torch.compile(ddp) if tc.compile else ddp
    logger = MetricsLogger(
        out, enabled=main_proc, resume_step=state["step"] if resume_dir is not None else None
    )
    if main_proc:
        resolved = config_dict(cfg) | {"resume": None}  # rerunning this config auto-resumes
        atomic_write_text(out / CONFIG_FILE, yaml.safe_dump(resolved, sort_keys=False))

    eval_bs = tc.eval_batch_size or micro

    def evaluate_all(with_extra: bool = True) -> dict[str, dict[str, Any]]:
        """The validation split (+ the extra sets: before and after training only)."""
        sets = {"val": val_ds}
        if with_extra:
            sets |= {f"val:{name}": ds for name, ds in extra.items()}
        return {
            name: evaluate_mlm(
                raw,
                validation_batches(
                    ds,
                    collator,
                    eval_bs,
                    rank=info.rank,
                    world_size=info.world_size,
                    max_examples=tc.eval_examples,
                ),
                device,
                precision,
                reduce_across_ranks=True,
            )
            for name, ds in sets.items()
        }

    def log_eval(step: int, results: dict[str, dict[str, Any]]) -> None:
        for name, metrics in results.items():
            logger.log(step, name, **{k: v for k, v in metrics.items() if v is not None})

    def save_checkpoint() -> None:
        ranks_rng = [rng_state()]
        if info.enabled:
            ranks_rng = [None] * info.world_size
            dist.all_gather_object(ranks_rng, rng_state())
        if main_proc:
            with atomic_directory(out / checkpoint_name(state["step"])) as tmp:
                raw.save_pretrained(tmp, tokenizer=tokenizer)
                save_train_state(
                    tmp, state=state, optimizer=optimizer, extra_tensors={"rng_per_rank": ranks_rng}
                )
            rotate_checkpoints(out, tc.keep_checkpoints)
        D.barrier()

    def done() -> bool:
        return (tc.max_steps is not None and state["step"] >= tc.max_steps) or (
            budget is not None and state["elapsed"] >= budget
        )

    def learning_rate() -> float:
        if budget is None:
            warmup = round(tc.warmup_ratio * tc.max_steps)
            return lr_at(
                state["step"],
                max_lr=tc.lr,
                warmup=warmup,
                total=tc.max_steps,
                schedule=tc.schedule,
                min_lr_ratio=tc.min_lr_ratio,
            )
        progress = state["elapsed"] / budget
        if tc.max_steps is not None:
            progress = max(progress, state["step"] / tc.max_steps)
        return lr_at_progress(
            progress,
            max_lr=tc.lr,
            warmup=tc.warmup_ratio,
            schedule=tc.schedule,
            min_lr_ratio=tc.min_lr_ratio,
        )

    n_params = sum(p.numel() for p in raw.parameters())
    say(
        f"pretraining {model_cls.__name__} ({n_params / 1e6:.2f}M parameters, {precision}, "
        f"{device}, {info.world_size} process(es)) on {len(train_ds):,} sequences; batch "
        f"{tc.batch_size} = {info.world_size} x {accum} x {micro}; budget "
        + " and ".join(
            x
            for x in (tc.max_steps and f"{tc.max_steps} steps", budget and format_duration(budget))
            if x
        )
    )
    if state["initial_eval"] is None:  # the untrained network: the baseline of the final table
        state["initial_eval"] = evaluate_all()
        log_eval(0, state["initial_eval"])

    # ---- the loop -------------------------------------------------------------------------------
    bar = ProgressBar(
        budget or tc.max_steps,
        initial=state["elapsed"] if budget else state["step"],
        by_time=budget is not None,
        enabled=main_proc and tc.progress,
    )
    batches = iter(sampler)
    window = {"loss": 0.0, "mlm": 0.0, "nsp": 0.0, "n": 0, "tokens": 0.0, "seconds": 0.0}
    streak, stopped = 0, None
    with GracefulStop() as stop:
        while not done():
            t0 = time.perf_counter()
            lr = learning_rate()
            set_lr(optimizer, lr)
            indices = next(batches)
            epoch = sampler.epoch  # the epoch of the batch just drawn
            chunks = [indices[i * micro : (i + 1) * micro] for i in range(accum)]
            micro_batches = [collator([train_ds[i] for i in c], c, epoch) for c in chunks]
            counts = torch.tensor(
                [
                    [
                        float((b["labels"] != IGNORE_INDEX).sum()),
                        float((b["next_sentence_label"] >= 0).sum()),
                    ]
                    for b in micro_batches
                ],
                dtype=torch.float64,
            ).sum(0)
            n_masked, n_nsp = D.all_reduce_sum(counts).tolist()  # over the whole global batch
            sums = torch.zeros(4, dtype=torch.float64)  # mlm CE sum, nsp CE sum, tokens, stop
            for k, batch in enumerate(micro_batches):
                batch = {key: v.to(device, non_blocking=True) for key, v in batch.items()}
                last = k == accum - 1
                sync = contextlib.nullcontext() if last or not info.enabled else ddp.no_sync()
                with sync:
                    kwargs = (
                        {"next_sentence_label": batch["next_sentence_label"]} if use_nsp else {}
                    )
                    with autocast(device, precision):
                        output = forward(
                            batch["input_ids"],
                            attention_mask=batch["attention_mask"],
                            token_type_ids=batch["token_type_ids"],
                            labels=batch["labels"],
                            **kwargs,
                        )
                    # per-micro-batch means -> share of the global mean; DDP then averages ranks
                    n_local = float((batch["labels"] != IGNORE_INDEX).sum())
                    mlm = output.mlm_loss if use_nsp else output.loss
                    loss = mlm * (n_local * info.world_size / n_masked)
                    sums[0] += mlm.detach().double().cpu() * n_local
                    if use_nsp and output.nsp_loss is not None:
                        n_local_nsp = float((batch["next_sentence_label"] >= 0).sum())
                        loss = loss + output.nsp_loss * (n_local_nsp * info.world_size / n_nsp)
                        sums[1] += output.nsp_loss.detach().double().cpu() * n_local_nsp
                    loss.backward()
                sums[2] += float(batch["attention_mask"].sum())
            max_norm = tc.max_grad_norm if tc.max_grad_norm > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(raw.parameters(), max_norm))
            sums[3] = float(stop.requested)
            totals = D.all_reduce_sum(sums)
            mlm_loss = float(totals[0]) / n_masked
            nsp_loss = float(totals[1]) / n_nsp if use_nsp and n_nsp else None
            step_loss = mlm_loss + (nsp_loss or 0.0)
            if math.isfinite(step_loss) and math.isfinite(grad_norm):
                optimizer.step()
                streak = 0
            else:  # skip: a bf16 overflow or a bad batch must not poison the weights
                state["skipped"] += 1
                streak += 1
                say(f"step {state['step'] + 1}: non-finite loss/gradient, step skipped")
                if streak >= tc.max_nonfinite:
                    raise BertforgeError(
                        f"the loss was non-finite for {streak} steps in a row (step "
                        f"{state['step'] + 1}); lower --train.lr, raise --train.warmup_ratio or "
                        "use --train.precision fp32"
                    )
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["tokens"] += int(totals[2])
            state["data"] = sampler.state_dict()
            seconds = time.perf_counter() - t0
            state["elapsed"] += seconds

            if math.isfinite(step_loss):
                window["loss"] += step_loss
                window["mlm"] += mlm_loss
                window["nsp"] += nsp_loss or 0.0
                window["n"] += 1
            window["tokens"] += float(totals[2])
            window["seconds"] += seconds
            tok_s = window["tokens"] / max(window["seconds"], 1e-9)
            bar.update(
                state["elapsed"] if budget else state["step"],
                step=state["step"],
                loss=step_loss,
                lr=lr,
                tokens_per_s=tok_s,
            )
            if state["step"] % tc.log_every == 0 or done():
                n = max(window["n"], 1)
                record = {
                    "loss": window["loss"] / n,
                    "mlm_loss": window["mlm"] / n,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens_per_s": tok_s,
                    "tokens": state["tokens"],
                    "elapsed": state["elapsed"],
                    "epoch": epoch,
                    "skipped": state["skipped"],
                }
                if use_nsp:
                    record["nsp_loss"] = window["nsp"] / n
                logger.log(state["step"], "train", **record)
                window = dict.fromkeys(window, 0.0)
                window["n"] = 0
            if tc.eval_every and state["step"] % tc.eval_every == 0 and not done():
                results = evaluate_all(with_extra=False)
                log_eval(state["step"], results)
                bar.write(
                    f"step {state['step']}: val loss {results['val']['loss']:.3f} "
                    f"accuracy {results['val']['accuracy']:.2%}"
                )
            if totals[3] > 0:
                stopped = stop.signal_name or "signal"
                break
            if tc.save_every and state["step"] % tc.save_every == 0 and not done():
                save_checkpoint()
    bar.close()
    save_checkpoint()
    if stopped:
        logger.close()
        say(
            f"stopped at step {state['step']} on {stopped}; checkpoint saved in "
            f"{out / checkpoint_name(state['step'])}. Resume with:\n"
            f"  bertforge pretrain --config {out / CONFIG_FILE}"
        )
        return {"stopped": True, "step": state["step"], "initial": state["initial_eval"]}

    final = evaluate_all()
    log_eval(state["step"], final)
    logger.close()
    result = {
        "stopped": False,
        "step": state["step"],
        "elapsed": state["elapsed"],
        "tokens": state["tokens"],
        "skipped": state["skipped"],
        "initial": state["initial_eval"],
        "final": final,
        "model_dir": str(out / FINAL_DIR),
        "plot": str(out / PLOT_FILE),
    }
    if main_proc:
        with atomic_directory(out / FINAL_DIR) as tmp:
            raw.save_pretrained(tmp, tokenizer=tokenizer)
        plot_training_curves(out, out / PLOT_FILE, title=f"bertforge pretrain: {out.name}")
        atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
        for name in final:
            title = f"{name} ({'validation split' if name == 'val' else 'extra evaluation set'})"
            say(
                "\n"
                + comparison_table(
                    {
                        "random init": state["initial_eval"][name],
                        f"trained ({state['step']} steps)": final[name],
                    },
                    title,
                )
            )
        say(
            f"\nmodel: {out / FINAL_DIR}\nplot:  {out / PLOT_FILE}\nmetrics: {out / 'metrics.jsonl'}"
        )
    D.barrier()
    return result


def build_parser() -> Any:
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(
        prog="bertforge pretrain",
        description="Pretrain a BERT encoder (MLM + NSP or MLM only) on prepared data. Options "
        "come from --config YAML files and dotted overrides (--train.lr 1e-4).",
    )
    parser.add_argument(
        "--config", action=ActionConfigFile, help="YAML preset(s), e.g. configs/mini.yaml"
    )
    parser.add_class_arguments(PretrainConfig, as_positional=False)
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    namespace = parser.instantiate(parser.parse_args(argv))
    cfg = PretrainConfig(**{f.name: namespace[f.name] for f in fields(PretrainConfig)})
    try:
        pretrain(cfg)
    finally:
        D.cleanup()
    return 0


__all__ = [
    "CONFIG_FILE",
    "FINAL_DIR",
    "PLOT_FILE",
    "config_dict",
    "find_resume",
    "main",
    "pretrain",
    "set_dropout",
]
