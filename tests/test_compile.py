"""Compiled training (docs/gpu.md): the default (on for CUDA pretraining, on for long CUDA
fine-tuning runs, off elsewhere), the masked rows padded to a count that stays put, and the
compiled model's loss and gradients against the eager model's on a padded batch.

The compiled comparisons use dynamo with the ``aot_eager`` backend (the graph dynamo captures,
differentiated by AOTAutograd, run by eager kernels): what this file checks is what compiling
changes in bertforge's own code (the padding kept, the loss over rows with -100 targets), in
seconds rather than Inductor's minute of code generation on a small CPU. The GPU suite
(tests/gpu) runs the real thing with Inductor."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_fast_paths import assert_grads_close, grads, padded_batch

from bertforge.data.loader import STATIC_ROWS_MULTIPLE, masked_rows, static_masked_rows
from bertforge.modeling.model import BertForPreTraining
from bertforge.runtime import explain_compile
from bertforge.training.config import TrainConfig
from bertforge.training.steps import set_dropout


def test_compile_is_on_by_default_for_cuda_only_and_a_setting_wins():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert explain_compile(None, cuda) == (
        True,
        "compiled (the default on CUDA; compile time not charged)",
    )
    assert explain_compile(None, cpu) == (False, "compile off (the default on cpu)")
    assert explain_compile(True, cpu) == (True, "compile on (as set)")
    assert explain_compile(False, cuda) == (False, "compile off (as set)")
    # fine-tuning: a short run does not compile unless asked
    assert explain_compile(None, cuda, steps=400, min_steps=5000)[0] is False
    assert "under 5,000 steps" in explain_compile(None, cuda, steps=400, min_steps=5000)[1]
    assert explain_compile(None, cuda, steps=6000, min_steps=5000)[0] is True
    assert explain_compile(True, cuda, steps=10, min_steps=5000)[0] is True


@pytest.mark.parametrize("rate", [0.15, 0.25])
def test_static_masked_rows_keep_one_count_per_shape_and_add_only_unlabelled_rows(rate):
    B, T = 6, 40
    bound = math.ceil(B * math.ceil(rate * T) / STATIC_ROWS_MULTIPLE) * STATIC_ROWS_MULTIPLE
    counts = set()
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        labels = torch.full((B, T), -100)
        chosen = torch.rand(B, T, generator=g) < rate * (0.5 + seed / 8)  # 0.5x .. 1.0x rate
        labels[chosen] = torch.randint(5, 100, (int(chosen.sum()),), generator=g)
        rows = static_masked_rows(labels, rate)
        real = masked_rows(labels)
        counts.add(rows.numel())
        assert torch.equal(rows[: real.numel()], real)  # the labelled rows first, in order
        assert (labels.flatten()[rows[real.numel() :]] == -100).all()  # then unlabelled ones
    assert counts == {bound}


def test_static_masked_rows_round_up_a_batch_that_overshoots_the_bound():
    labels = torch.full((2, 10), -100)
    labels[:, 1:9] = 7  # 16 labelled, over the 2 * ceil(0.15 * 10) = 4 of the bound
    rows = static_masked_rows(labels, 0.15)
    assert rows.numel() == STATIC_ROWS_MULTIPLE  # 16 rounded up; the 4 free positions repeat
    assert torch.equal(rows[:16], masked_rows(labels))
    assert (labels.flatten()[rows[16:]] == -100).all()


def test_compiled_pretraining_model_equals_eager_on_a_padded_batch_with_static_rows(
    tiny_config,
):
    """Compiled, the padding is kept (attention masks it) and the loss ignores the added rows:
    the same MLM + NSP loss and gradients as the eager model's unpadded sparse path."""
    import torch._dynamo

    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).train()
    set_dropout(model, 0.0)
    batch = padded_batch(tiny_config.vocab_size)
    eager = model(**batch, masked_rows=masked_rows(batch["labels"]))
    eager.loss.backward()
    want = grads(model)
    model.zero_grad(set_to_none=True)

    rows = static_masked_rows(batch["labels"], 0.15)
    assert rows.numel() > masked_rows(batch["labels"]).numel()  # rows were added
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend="aot_eager")(**batch, masked_rows=rows)
        compiled.loss.backward()
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(compiled.mlm_loss, eager.mlm_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled.nsp_loss, eager.nsp_loss, rtol=1e-5, atol=1e-6)
    assert_grads_close(grads(model), want, atol=1e-5)


def test_gpu_batches_pad_to_a_multiple_never_past_the_longest_allowed():
    """On a GPU a batch's length is rounded up to 32 (a handful of shapes repeat instead of
    one per length), never past the limit; the CPU keeps the batch's own longest."""
    from bertforge.data.encoding import collate, iterate_batches, pad_multiple

    assert pad_multiple(torch.device("cpu")) == 1
    assert pad_multiple(torch.device("meta")) == 32
    examples = [(np.arange(2, 9, dtype=np.int32), 4), (np.arange(2, 5, dtype=np.int32), 3)]
    plain = collate(examples, 0)
    rounded = collate(examples, 0, multiple=32, limit=128)
    capped = collate(examples, 0, multiple=32, limit=20)
    assert plain["input_ids"].shape == (2, 7)
    assert rounded["input_ids"].shape == (2, 32) and capped["input_ids"].shape == (2, 20)
    for batch in (rounded, capped):  # the same tokens, mask and segments, then padding
        T = batch["input_ids"].shape[1]
        for key in plain:
            assert torch.equal(batch[key][:, :7], plain[key]), key
            assert not batch[key][:, 7:T].any(), key
    # inference: never past the longest example of the whole set
    ((_, batch),) = iterate_batches(examples, [np.array([1])], 0, multiple=32)
    assert batch["input_ids"].shape == (1, 7)


def test_compile_mode_reaches_torch_compile_and_an_eager_run_refuses_it(
    pretraining_corpus, tmp_path, monkeypatch, capsys
):
    """``--train.compile_mode`` is handed to ``torch.compile`` (recorded at the loop's set-up,
    before any step: what Inductor makes of a mode is the GPU suite's business) and said in the
    start line; asked of a run that stays eager it is refused before anything is written."""
    from test_pretrain import tiny_cfg

    from bertforge.errors import BertforgeError
    from bertforge.training.pretrain import pretrain, setup

    with pytest.raises(BertforgeError, match="add --train.compile true or drop"):
        pretrain(tiny_cfg(pretraining_corpus["nsp"], tmp_path / "eager", max_steps=2,
                          compile_mode="reduce-overhead"))  # fmt: skip
    assert not (tmp_path / "eager").exists()

    calls = []
    monkeypatch.setattr(torch, "compile", lambda module, **kw: calls.append(kw) or "compiled")
    cfg = tiny_cfg(pretraining_corpus["nsp"], tmp_path / "run", max_steps=2, compile=True,
                   compile_mode="max-autotune-no-cudagraphs")  # fmt: skip
    run, _ = setup(cfg)
    assert run.compiled and run.forward == "compiled"
    assert calls == [{"mode": "max-autotune-no-cudagraphs"}]
    assert "compile on (as set), mode max-autotune-no-cudagraphs" in capsys.readouterr().err
    with pytest.raises(BertforgeError, match="--train.compile_mode"):
        TrainConfig(compile_mode="fastest")
