"""How a pretraining run's weights start (``training/start.py``): one test per variant of a
fresh model in :data:`~bertforge.training.start.FRESH_STARTS` (each changes what it claims and
nothing else), the list itself, and freezing (frozen weights stay put through a step)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_fast_paths import padded_batch
from test_pretrain import TINY_TRAIN, tiny_cfg

from bertforge.data.dataset import PretrainingDataset
from bertforge.errors import BertforgeError
from bertforge.modeling.model import BertForPreTraining, cooccurrence_vectors, sinusoidal_positions
from bertforge.training.config import TrainConfig
from bertforge.training.objectives import objective_for
from bertforge.training.optim import build_optimizer
from bertforge.training.pretrain import pretrain, starts_random, train_step
from bertforge.training.setup import build_model, open_data
from bertforge.training.start import (
    FRESH_STARTS,
    WORD_INIT_CONTEXTS,
    cooccurrence_cache,
    count_seconds,
    freeze_parameters,
    init_word_vectors,
    own_start,
    read_cached_counts,
)
from bertforge.training.steps import set_dropout


@pytest.fixture(autouse=True)
def _restore_threads():
    """pretrain() sets one thread here (``TINY_TRAIN``); give the session its setting back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# ---- the list -------------------------------------------------------------------------------


def test_each_variant_is_asked_by_its_own_option_and_none_by_default():
    asks = {
        "--train.position_init sinusoidal": {"position_init": "sinusoidal"},
        "--train.segment_init_std": {"segment_init_std": 0.2},
        "--train.special_init_std": {"special_init_std": 0.2},
        "--train.attention_init identity": {"attention_init": "identity"},
        "--train.fresh_head warm": {"fresh_head": "warm"},
        "--train.word_init cooccurrence": {"word_init": "cooccurrence"},
    }
    assert [v.option for v in FRESH_STARTS] == list(asks)  # the order they are applied in
    plain = TrainConfig(max_steps=1)
    assert own_start(plain) == [] and own_start(replace(plain, fresh_head="random")) == []
    for option, values in asks.items():
        assert own_start(replace(plain, **values)) == [option]
    # only the corpus-sized start is charged to the time budget, and it says what to use instead
    charged = [v for v in FRESH_STARTS if v.charged]
    assert [(v.option, v.instead) for v in charged] == [
        ("--train.word_init cooccurrence", "--train.word_init normal")
    ]


# ---- one variant each ---------------------------------------------------------------------------


def default_and_changed_start(corpus: Path, output: Path, **change):
    """A fresh pretraining model built with ``change`` to ``--train.*`` and the default one, both
    from seed 0: (default config, changed config, data, default state dict, changed model)."""
    cfg = tiny_cfg(corpus, output, max_steps=2)
    changed = replace(cfg, train=replace(cfg.train, **change))
    data = open_data(cfg)
    torch.manual_seed(0)
    normal = build_model(cfg, data, None).state_dict()
    torch.manual_seed(0)
    return cfg, changed, data, normal, build_model(changed, data, None)


def test_segment_init_std_redraws_only_the_segment_table(pretraining_corpus, tmp_path):
    cfg, louder, data, normal, model = default_and_changed_start(
        pretraining_corpus["nsp"], tmp_path / "run", segment_init_std=0.2
    )
    table = model.bert.embeddings.token_type_embeddings.weight
    assert table.requires_grad and table.shape == (2, 32)
    table = table.detach()
    assert 0.15 < float(table.std()) < 0.25 and abs(float(table.mean())) < 0.06
    assert 0.01 < float(normal["bert.embeddings.token_type_embeddings.weight"].std()) < 0.03
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, normal[k])]
    assert changed == ["bert.embeddings.token_type_embeddings.weight"]
    assert starts_random(cfg) and not starts_random(louder)  # its own start: a column of its own
    with pytest.raises(BertforgeError, match="--train.segment_init_std 0.0 must be positive"):
        TrainConfig(**(TINY_TRAIN | {"max_steps": 2, "segment_init_std": 0.0}))


def test_special_init_std_redraws_only_the_special_tokens(pretraining_corpus, tmp_path):
    cfg, louder, data, normal, model = default_and_changed_start(
        pretraining_corpus["nsp"], tmp_path / "run", special_init_std=0.2
    )
    tok = data.tokenizer
    table = model.bert.embeddings.word_embeddings.weight.detach()
    before = normal["bert.embeddings.word_embeddings.weight"]
    special = [tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id]
    assert 0.12 < float(table[special].std()) < 0.28  # 4 rows x 32 values at 0.2
    assert float(before[special].std()) < 0.03 and not table[tok.pad_id].any()  # [PAD] stays 0
    others = [i for i in range(table.shape[0]) if i not in special]
    assert torch.equal(table[others], before[others])
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, normal[k])}
    tied = {"bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"}
    assert "bert.embeddings.word_embeddings.weight" in changed and changed <= tied
    assert starts_random(cfg) and not starts_random(louder)
    with pytest.raises(BertforgeError, match="--train.special_init_std -1.0 must be positive"):
        TrainConfig(**(TINY_TRAIN | {"max_steps": 2, "special_init_std": -1.0}))


def test_a_warm_fresh_head_starts_a_fresh_model_at_the_frequency_guesser(
    pretraining_corpus, tmp_path
):
    cfg, warm, data, normal, model = default_and_changed_start(
        pretraining_corpus["nsp"], tmp_path / "run", fresh_head="warm"
    )
    head = model.cls.predictions
    # the bias: log frequencies of the training split's tokens (add-0.5, mean 0)
    counts = data.train.token_counts(model.config.vocab_size, data.tokenizer.special_ids, None)
    log_p = torch.log(
        (torch.from_numpy(counts).double() + 0.5) / (counts.sum() + 0.5 * len(counts))
    )
    torch.testing.assert_close(head.bias.detach(), (log_p - log_p.mean()).float())
    assert float(head.bias.detach().std()) > 0.5  # frequent and rare words well apart
    torch.testing.assert_close(head.transform.dense.weight.detach(), torch.eye(32))
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, normal[k])}
    # only the head moves (the decoder's bias is the head's bias, tied as in transformers; the
    # dense bias starts at zero in BERT's initialisation too)
    bias = {"cls.predictions.bias", "cls.predictions.decoder.bias"}
    assert changed == bias | {"cls.predictions.transform.dense.weight"}
    assert starts_random(cfg) and not starts_random(warm)
    # the default (None) is BERT's start for a fresh model, the explicit "random" too
    torch.manual_seed(0)
    plain = build_model(replace(cfg, train=replace(cfg.train, fresh_head="random")), data, None)
    assert all(torch.equal(v, normal[k]) for k, v in plain.state_dict().items())
    with pytest.raises(
        BertforgeError, match="--train.fresh_head 'hot': choose one of warm, random"
    ):
        TrainConfig(**(TINY_TRAIN | {"max_steps": 2, "fresh_head": "hot"}))


def test_sinusoidal_positions_depend_on_distance_only_at_berts_scale():
    table = sinusoidal_positions(64, 32, std=0.02).double()
    assert table.shape == (64, 32)
    half = torch.full((16,), 0.02 * 2**0.5, dtype=torch.float64)
    torch.testing.assert_close(table[0], torch.cat([torch.zeros(16, dtype=torch.float64), half]))
    # sin(a)sin(b) + cos(a)cos(b) = cos(a - b): the similarity of two positions is their distance's
    gram = table @ table.T
    torch.testing.assert_close(gram[:-5, :-5], gram[5:, 5:], atol=1e-9, rtol=0)
    assert gram[10, 11] > gram[10, 20] > 0  # neighbours start alike
    assert 0.015 < table.std() < 0.025  # the scale of BERT's normal(0, 0.02) start


def test_position_init_sinusoidal_starts_a_fresh_model_there(pretraining_corpus, tmp_path):
    cfg = tiny_cfg(pretraining_corpus["nsp"], tmp_path / "run", max_steps=2)
    sinusoidal = replace(cfg, train=replace(cfg.train, position_init="sinusoidal"))
    data = open_data(sinusoidal)
    table = build_model(sinusoidal, data, None).bert.embeddings.position_embeddings.weight
    assert table.requires_grad
    torch.testing.assert_close(table.detach(), sinusoidal_positions(64, 32, 0.02))
    normal = build_model(cfg, data, None).bert.embeddings.position_embeddings.weight
    assert not torch.allclose(normal, table)
    louder = replace(sinusoidal, train=replace(sinusoidal.train, position_init_std=0.2))
    table = build_model(louder, data, None).bert.embeddings.position_embeddings.weight
    torch.testing.assert_close(table.detach(), sinusoidal_positions(64, 32, 0.2))
    wider = replace(sinusoidal, model=replace(sinusoidal.model, initializer_range=0.05))
    table = build_model(wider, open_data(wider), None).bert.embeddings.position_embeddings.weight
    torch.testing.assert_close(table.detach(), sinusoidal_positions(64, 32, 0.05))
    with pytest.raises(BertforgeError, match="--train.position_init"):
        TrainConfig(**(TINY_TRAIN | {"max_steps": 2, "position_init": "rope"}))
    with pytest.raises(BertforgeError, match="--train.position_init_std"):
        TrainConfig(**(TINY_TRAIN | {"max_steps": 2, "position_init_std": 0.0}))


def test_word_init_cooccurrence_starts_a_fresh_model_there(pretraining_corpus, tmp_path, capsys):
    data_dir = pretraining_corpus["nsp"]
    cfg = tiny_cfg(data_dir, tmp_path / "run", max_steps=2, word_init="cooccurrence")
    result = pretrain(cfg)
    err = capsys.readouterr().err
    assert "word embeddings start from co-occurrence vectors" in err
    charged = float(re.search(r"\(([0-9.]+) s, charged to the budget\)", err).group(1))
    # the start: rebuild it the way setup does and compare with a fresh normal model
    data = open_data(cfg)
    special, vocab = data.tokenizer.special_ids, data.model_config.vocab_size
    frequency = data.train.token_counts(vocab, special)
    assert vocab < WORD_INIT_CONTEXTS  # every word is a context here
    contexts = torch.arange(vocab).numpy()[frequency > 0]  # all words the text has
    counts = data.train.cooccurrence_counts(vocab, contexts, cfg.train.word_init_window, special)
    vectors, seen = cooccurrence_vectors(counts, 32, cfg.train.word_init_std, seed=cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, data, None)
    normal = model.bert.embeddings.word_embeddings.weight.detach().clone()
    init_word_vectors(model, cfg, data)
    table = model.bert.embeddings.word_embeddings.weight.detach()
    torch.testing.assert_close(table[seen], vectors[seen])
    torch.testing.assert_close(table[~seen], normal[~seen])  # specials and unseen words
    assert seen.sum() > 0.8 * (frequency > 0).sum() and not seen[special].any()
    assert model.cls.predictions.decoder.weight.data_ptr() == table.data_ptr()  # still tied
    # the run's elapsed time includes the start-up work, and its model loads as a standard BERT
    state = json.loads((tmp_path / "run" / "results.json").read_text())
    assert result["step"] == 2 and state["elapsed"] >= charged - 0.05  # printed to 0.1 s
    transformers = pytest.importorskip("transformers")

    hf = transformers.BertForMaskedLM.from_pretrained(tmp_path / "run" / "model")
    assert hf.config.vocab_size == vocab
    swallowed = tiny_cfg(data_dir, tmp_path / "r2", max_time="0.000001s", word_init="cooccurrence")
    with pytest.raises(BertforgeError, match="took .* the whole --train.max_time"):
        pretrain(swallowed)  # a start that uses up the budget says so instead of 0 steps
    for bad, match in (
        ({"word_init": "glove"}, "--train.word_init"),
        ({"word_init_std": 0.0}, "--train.word_init_std"),
        ({"word_init_window": 0}, "--train.word_init_window"),
    ):
        with pytest.raises(BertforgeError, match=match):
            TrainConfig(**(TINY_TRAIN | {"max_steps": 2} | bad))


def test_cooccurrence_counts_are_kept_with_the_data_and_read_by_a_later_run(
    pretraining_corpus, tmp_path, capsys
):
    """The counts outlive the run: a second run in a fresh output folder reads them from the
    prepared data folder instead of counting again, and starts from the same word vectors."""
    data_dir = tmp_path / "data"
    shutil.copytree(pretraining_corpus["nsp"], data_dir, ignore=shutil.ignore_patterns("cooc*"))
    models = []
    for run in ("first", "second"):
        cfg = tiny_cfg(data_dir, tmp_path / run, max_steps=1, word_init="cooccurrence")
        torch.manual_seed(cfg.train.seed)
        data = open_data(cfg)
        model = build_model(cfg, data, None)
        said = init_word_vectors(model, cfg, data)
        models.append(model.bert.embeddings.word_embeddings.weight.detach().clone())
        cache = cooccurrence_cache(data_dir, cfg.train.word_init_window)
        assert cache.is_file()
        assert said.endswith(f"kept in {cache}" if run == "first" else f"read from {cache}"), said
    torch.testing.assert_close(models[0], models[1], rtol=0, atol=0)
    # other counts are not these: another window's file, or other contexts, are counted again
    assert not cooccurrence_cache(data_dir, 3).exists()
    window = cfg.train.word_init_window
    assert read_cached_counts(cache, data.train, np.arange(1, 50), window) is None
    assert read_cached_counts(cache, data.train, np.arange(1, 50), window + 1) is None


def test_a_count_the_budget_cannot_hold_is_refused_after_a_timed_sample(
    pretraining_corpus, tmp_path, monkeypatch
):
    """A budget shorter than the foreseen count refuses after counting a sample, not after the
    whole count (which took 271 s of a 3-minute budget on the general corpus)."""
    import bertforge.training.start as start

    data_dir = tmp_path / "data"
    shutil.copytree(pretraining_corpus["nsp"], data_dir, ignore=shutil.ignore_patterns("cooc*"))
    monkeypatch.setattr(start, "COUNT_PROBE_TOKENS", 500)  # the corpus is ~60k tokens
    counted: list[int | None] = []
    count = PretrainingDataset.cooccurrence_counts

    def counting(self, *args, **kwargs):
        counted.append(args[4] if len(args) > 4 else kwargs.get("max_tokens"))
        return count(self, *args, **kwargs)

    monkeypatch.setattr(PretrainingDataset, "cooccurrence_counts", counting)
    cfg = tiny_cfg(data_dir, tmp_path / "run", max_time="0.01s", word_init="cooccurrence")
    data = open_data(cfg)
    with pytest.raises(BertforgeError, match=r"would take about .* to count [0-9,]+ tokens, more "
                       r"than the whole --train.max_time 0.01s; .* --train.word_init normal"):  # fmt: skip
        init_word_vectors(build_model(cfg, data, None), cfg, data)
    assert counted == [500]  # the sample only
    assert not cooccurrence_cache(data_dir, cfg.train.word_init_window).exists()
    assert count_seconds(50_000_000, 10) == pytest.approx(255.0)  # the general corpus: 4m15s


def test_identity_attention_starts_every_token_at_the_mean_of_its_sequence(
    pretraining_corpus, tmp_path
):
    cfg, ident, data, normal, model = default_and_changed_start(
        pretraining_corpus["nsp"], tmp_path / "run", attention_init="identity"
    )
    eye = torch.eye(32)
    changed = sorted(k for k, v in model.state_dict().items() if not torch.equal(v, normal[k]))
    layers = range(model.config.num_hidden_layers)
    names = [
        f"bert.encoder.layer.{i}.attention.{m}.weight"
        for i in layers
        for m in ("self.value", "output.dense")
    ]
    assert changed == sorted(names)
    for name in names:  # BERT's random draw plus the identity
        assert torch.equal(model.state_dict()[name], normal[name] + eye)
    # the premise: a fresh model's attention is nearly uniform, so [CLS] starts at the mean
    ids = torch.randint(5, model.config.vocab_size, (2, 24))
    with torch.no_grad():
        probs = model.bert(ids, output_attentions=True).attentions[0]  # (2, heads, 24, 24)
    assert float(probs.max()) < 1.5 / 24 and float(probs.min()) > 0.5 / 24
    assert not starts_random(ident)
    with pytest.raises(BertforgeError, match="--train.attention_init"):
        TrainConfig(**(TINY_TRAIN | {"max_steps": 2, "attention_init": "eye"}))


# ---- freezing -----------------------------------------------------------------------------------


def test_frozen_weights_stay_put_through_a_step(tiny_config):
    """``--train.freeze embeddings,layers:1``: a training step (the objective's losses,
    backward, AdamW) moves every other weight and none of the frozen ones; the tied decoder is
    the frozen word table, the head's own bias still trains."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).train()
    set_dropout(model, 0.0)
    assert freeze_parameters(model, "embeddings,layers:1") == ["embeddings", "encoder.layer.0"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    train = TrainConfig(max_steps=1)  # objective mlm_nsp
    run = SimpleNamespace(  # what train_step reads of a run
        cfg=SimpleNamespace(train=train),
        info=SimpleNamespace(world_size=1, enabled=False),
        device=torch.device("cpu"),
        precision="fp32",
        forward=model,
        compiled=False,  # eager: the masked rows as the labels give them
        raw=model,
        ddp=model,
        objective=objective_for(train),
    )
    optimizer = build_optimizer(model, 1e-2)
    train_step(run, [padded_batch(tiny_config.vocab_size)], stop_requested=False)
    optimizer.step()
    after = model.state_dict()
    frozen = {k for k in after if k.startswith(("bert.embeddings.", "bert.encoder.layer.0."))}
    frozen.add("cls.predictions.decoder.weight")  # the word table itself
    assert len(frozen) == 5 + 16 + 1  # 5 embedding tensors, 16 of a layer, the decoder
    for key, value in after.items():
        assert torch.equal(value, before[key]) == (key in frozen), key
    assert not torch.equal(after["cls.predictions.bias"], before["cls.predictions.bias"])
    with pytest.raises(BertforgeError, match="--train.freeze layers:3: the model has 2 layers"):
        freeze_parameters(BertForPreTraining(tiny_config), "layers:3")
