"""benchmarks/finetune_glue_reference.py and finetune_qa_reference.py (issue 39: GLUE dev and
XQuAD-en beside transformers' Trainer): the Trainer side reads the same inputs as ours (token ids,
QA windows and their answer labels) and its run_qa post-processing picks the answers our decoder
picks from the same logits. Real shared files, the real MiniLM tokenizer; nothing is trained."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_run_glue_pairs_are_our_token_ids(shared_data, minilm_dir):
    transformers = pytest.importorskip("transformers")
    from finetune_glue_reference import read_tsv

    from bertforge.data.encoding import encode_examples
    from bertforge.tokenizer.wordpiece import Tokenizer

    header, rows = read_tsv(shared_data / "glue" / "RTE" / "dev.tsv")
    first, second = [r[0] for r in rows[:80]], [r[1] for r in rows[:80]]
    theirs = transformers.BertTokenizerFast.from_pretrained(minilm_dir)(
        first, second, truncation=True, max_length=128
    )
    ours = encode_examples(Tokenizer.from_file(minilm_dir), first, second, max_length=128)
    assert header[:2] == ["sentence1", "sentence2"]
    assert sum(len(ids) == 128 for ids, _ in ours) >= 5  # some pairs were shortened
    for i, (ids, len_a) in enumerate(ours):
        assert ids.tolist() == theirs["input_ids"][i]
        assert theirs["token_type_ids"][i].index(1) == len_a


def test_run_qa_windows_labels_and_answers_are_ours(shared_data, minilm_dir):
    transformers = pytest.importorskip("transformers")
    from finetune_qa_reference import hf_features, postprocess

    from bertforge.data.qa import decode_spans, encode_windows, read_qa
    from bertforge.tokenizer.wordpiece import Tokenizer

    examples, _ = read_qa(shared_data / "qa" / "squad_dev_train.json.gz")
    # the longest contexts first: several windows each, answers in late windows too
    examples = sorted(examples, key=lambda e: -len(e.context))[:40]
    args = argparse.Namespace(max_length=192, doc_stride=64)
    hf_tok = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    train = hf_features(hf_tok, examples, args, train=True)
    test = hf_features(hf_tok, examples, args, train=False)
    ours = encode_windows(
        Tokenizer.from_file(minilm_dir), examples, max_length=192, doc_stride=64, labels=True
    )
    assert len(ours) == len(train) == len(test) > len(examples) + 40
    for w, (ids, _) in enumerate(ours.encoded):
        assert ids.tolist() == train[w]["input_ids"]
        assert tuple(ours.targets[w]) == (train[w]["start_positions"], train[w]["end_positions"])
    assert sum(row["start_positions"] > 0 for row in train) >= 40  # each answer is somewhere

    rng = np.random.default_rng(0)
    starts = [rng.normal(size=len(ids)).astype(np.float32) for ids, _ in ours.encoded]
    ends = [rng.normal(size=len(ids)).astype(np.float32) for ids, _ in ours.encoded]
    width = max(len(s) for s in starts)  # Trainer pads the batches' logits with -100
    padded = [np.pad(s, (0, width - len(s)), constant_values=-100) for s in (*starts, *ends)]
    theirs = postprocess(examples, test, padded[: len(starts)], padded[len(starts) :])
    spans = decode_spans(ours, examples, starts, ends, n_best=20, max_answer_length=30)
    assert [theirs[e.id] for e in examples] == [s.text for s in spans]
    assert sum(bool(s.text) for s in spans) == len(examples)


def test_the_seed_reaches_bertforges_side(tmp_path, monkeypatch):
    # it ran seed 0 whatever --seed said: now the benchmark is asked for seed + 1 seeds (the
    # earlier ones are reused from disk) and the asked seed's scores are the side's
    import json

    import finetune_glue_reference as ref

    seen = []

    def fake_run(command, check):
        seen.append(command)
        seeds = int(command[command.index("--seeds") + 1])
        out = Path(command[command.index("--output") + 1]) / "results" / "model"
        out.mkdir(parents=True, exist_ok=True)
        runs = [
            {"seed": s, "scores": {"accuracy": 0.5 + s / 10}, "steps": 7, "train_seconds": s}
            for s in range(seeds)
        ]
        median = {"scores": {"accuracy": 0.0}, "score": 0.0}  # not the seed's: never reported
        (out / "RTE.json").write_text(json.dumps({**median, "seeds": runs}))

    monkeypatch.setattr(ref.subprocess, "run", fake_run)
    args = argparse.Namespace(
        epochs=1, lr=1e-4, batch_size=8, max_length=32, precision="fp32", num_threads=1,
        dropout=None, seed=2,
    )  # fmt: skip
    side = ref.run_ours(args, tmp_path, "RTE")
    assert seen[0][seen[0].index("--seeds") + 1] == "3"
    assert side["scores"] == {"accuracy": 0.7} and side["score"] == pytest.approx(0.7)
    assert side["train_seconds"] == 2 and side["steps"] == 7


def test_the_reference_trainer_predicts_in_order_with_batches_grouped_by_length(tmp_path):
    # transformers 5 applies group_by_length to predict too: its predictions came back shuffled
    # against the QA windows, and a model that answers scored at the first-words baseline
    transformers = pytest.importorskip("transformers")
    import torch
    from _common import reference_trainer

    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, num_labels=3,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    gen = np.random.default_rng(0)
    lengths = gen.permutation(np.arange(4, 44))  # 40 rows, every length once, shuffled
    rows = [{"input_ids": gen.integers(1, 50, n).tolist(), "label": 0} for n in lengths]
    args = argparse.Namespace(batch_size=4, lr=1e-4, seed=0, group_by_length=True)
    collator = transformers.DataCollatorWithPadding(
        transformers.PreTrainedTokenizerFast(
            tokenizer_object=_word_level_tokenizer(), pad_token="[PAD]"
        )
    )
    trainer = reference_trainer(transformers, model, rows, collator, tmp_path, args, 1, max_steps=1)
    predicted = trainer.predict(rows).predictions
    with torch.no_grad():
        alone = [model(torch.tensor([r["input_ids"]])).logits[0].numpy() for r in rows]
    np.testing.assert_allclose(predicted, np.stack(alone), atol=1e-5)


def _word_level_tokenizer():
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]"))


@pytest.mark.parametrize("schedule", ["parallel", "alternate"])
def test_the_sides_run_at_once_or_one_after_the_other(tmp_path, schedule):
    """Every reference script's ``--schedule``: two real side processes, each writing when it
    started and ended; ``alternate`` starts the second only after the first has ended (in the
    order given), ``parallel`` has both running at the same time. A schedule of another name is
    refused before anything starts."""
    from _common import launch_side, run_sides

    body = (
        "import json, sys, time; t0 = time.time(); time.sleep(0.5); "
        "json.dump({'start': t0, 'end': time.time()}, open(sys.argv[1], 'w'))"
    )

    def launch(side: str):
        return launch_side([sys.executable, "-c", body, str(tmp_path / f"{side}.json")], 1)

    results = run_sides(schedule, ("second", "first"), launch, lambda s: tmp_path / f"{s}.json")
    assert list(results) == ["second", "first"]
    first, then = results["second"], results["first"]
    assert all(r["wall_seconds"] >= 0.5 and r["peak_rss_mb"] > 1 for r in results.values())
    if schedule == "alternate":
        assert then["start"] >= first["end"]
    else:
        assert then["start"] < first["end"] and first["start"] < then["end"]
    with pytest.raises(ValueError, match="schedule 'both'"):
        run_sides("both", ("a",), launch, lambda s: tmp_path / f"{s}.json")
