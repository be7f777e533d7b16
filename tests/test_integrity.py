"""Integrity manifests: every model, checkpoint and prepared data directory bertforge writes
records the size and SHA-256 of its files; loading refuses a file that differs, naming it, what
differs and the newest checkpoint that verifies; ``bertforge verify`` checks any of them.
Directories of other tools (no manifest) load as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.reliability import (
    finetune_argv,
    flip_bytes,
    make_artefacts,
    pretrain_argv,
    record,
    same_weights,
)

from bertforge import cli
from bertforge.data.shards import PretrainingDataset
from bertforge.errors import BertforgeError
from bertforge.io import check_manifest, read_manifest, write_manifest
from bertforge.modeling.config import BertConfig
from bertforge.modeling.model import BertForMaskedLM
from bertforge.tokenizer.wordpiece import Tokenizer
from bertforge.training.checkpoints import list_checkpoints


@pytest.fixture(scope="module")
def art(task_files, tmp_path_factory) -> dict[str, Path]:
    return make_artefacts(tmp_path_factory.mktemp("integrity"), task_files)


def _one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_altered_checkpoint_is_refused_and_verify_names_the_last_good_one(art, tmp_path, capsys):
    """64 bytes flipped near the end of a checkpoint's model.safetensors: resuming is refused in
    one line naming the file and the newest checkpoint that verifies; bertforge verify says the
    same; resuming from that one as offered ends on the same weights as the untouched run."""
    run = tmp_path / "run"
    argv = pretrain_argv(art["data"], run, 8, 2)
    assert cli.main(argv) == 0
    reference = tmp_path / "reference.safetensors"
    shutil.copy(run / "model" / "model.safetensors", reference)
    checkpoints = list_checkpoints(run)
    assert [c.name[-2:] for c in checkpoints] == ["04", "06", "08"]
    newest, good = checkpoints[-1], checkpoints[-2]
    flip_bytes(newest / "model.safetensors")
    capsys.readouterr()

    assert cli.main(argv) == 2
    line = _one_error_line(capsys)
    print(line)
    assert f"{newest}/model.safetensors: SHA-256 " in line
    assert "differs from the" in line and "(same size: the bytes were altered)" in line
    assert (
        f"the newest checkpoint that verifies is {good}: resume from it with --resume {good}"
        in line
    )

    assert cli.main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    print(out)
    assert f"DAMAGED    checkpoint {newest}" in out and f"OK         checkpoint {good}" in out
    assert f"{newest}/model.safetensors: SHA-256" in out
    assert f"newest checkpoint that verifies: {good} (resume from it: --resume {good})" in out

    # loading the damaged checkpoint as a model is refused the same way
    with pytest.raises(
        BertforgeError, match="model.safetensors: SHA-256 .* the bytes were altered"
    ):
        BertForMaskedLM.from_pretrained(newest)

    assert cli.main([*argv, "--resume", str(good)]) == 0
    assert same_weights(run / "model" / "model.safetensors", reference)
    assert cli.main(["verify", str(run)]) == 0  # the damaged checkpoint was rewritten whole
    record("altered checkpoint", injected=1, refused=1, lost=0)


def test_finetune_refuses_an_altered_checkpoint_and_says_how_to_resume(art, tmp_path, capsys):
    out = tmp_path / "ft"
    argv = finetune_argv(art, out, 4, 2, "--keep_final_checkpoint")
    assert cli.main(argv) == 0
    good, newest = list_checkpoints(out)[-2:]
    (newest / "train_state.json").write_text('{"step": 999}')  # a different size
    capsys.readouterr()
    assert cli.main(argv) == 2
    line = _one_error_line(capsys)
    assert f"{newest}/train_state.json: " in line and "bytes, the manifest recorded" in line
    assert f"the newest checkpoint that verifies is {good}: move {newest} aside" in line
    record("altered checkpoint", injected=1, refused=1, lost=0)


def test_manifest_lists_every_file_and_catches_each_change(art, tmp_path):
    model = shutil.copytree(art["mlm"], tmp_path / "m")
    files = read_manifest(model)
    assert sorted(files) == sorted(
        ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    )
    assert files["vocab.txt"]["size"] == (model / "vocab.txt").stat().st_size
    assert check_manifest(model) == []
    checks = 0
    for name, change, expected in [
        (
            "config.json",
            lambda p: p.write_text(p.read_text() + " "),
            "bytes, the manifest recorded",
        ),
        ("vocab.txt", lambda p: p.unlink(), "missing (the manifest lists"),
        ("model.safetensors", flip_bytes, "the bytes were altered"),
    ]:
        damaged = shutil.copytree(model, tmp_path / f"d-{checks}")
        change(damaged / name)
        problems = check_manifest(damaged)
        assert len(problems) == 1 and problems[0].startswith(f"{damaged / name}: "), problems
        assert expected in problems[0]
        checks += 1
    # the sizes-only check misses a same-size alteration (that is what hashes are for)
    assert check_manifest(tmp_path / "d-2", hashes=False) == []
    # an altered vocabulary would silently change every id: the tokenizer refuses it
    vocab = model / "vocab.txt"
    vocab.write_text(vocab.read_text().replace("movie", "mavie"))
    with pytest.raises(BertforgeError, match=r"m/vocab.txt: SHA-256 .* the bytes were altered"):
        Tokenizer.from_file(model / "vocab.txt")
    record("altered model file", injected=checks + 1, refused=checks + 1, lost=0)


def test_directories_without_a_manifest_load_as_before(art, tmp_path):
    foreign = shutil.copytree(art["mlm"], tmp_path / "hf")
    (foreign / "manifest.json").unlink()
    flip_bytes(foreign / "model.safetensors")  # nothing records what it was: it loads
    BertForMaskedLM.from_pretrained(foreign)
    (foreign / "manifest.json").write_text('{"name": "another tool\'s manifest"}')
    assert read_manifest(foreign) is None
    BertForMaskedLM.from_pretrained(foreign)
    (foreign / "manifest.json").write_text("{not json")
    with pytest.raises(BertforgeError, match="manifest.json: damaged integrity manifest"):
        BertForMaskedLM.from_pretrained(foreign)


def test_prepared_data_sizes_checked_at_open_hashes_by_verify(art, tmp_path, capsys):
    data = shutil.copytree(art["data"], tmp_path / "data")
    assert "train-00000.ids" in read_manifest(data) and "tokenizer/vocab.txt" in read_manifest(data)
    shard = data / "train-00000.ids"
    raw = bytearray(shard.read_bytes())
    raw[10] = (raw[10] + 1) % 100  # same size, still valid ids: only the hash can tell
    shard.write_bytes(bytes(raw))
    PretrainingDataset(data)  # opening stays cheap: sizes only
    assert cli.main(["verify", str(data)]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED    data       {data}" in out and f"{shard}: SHA-256" in out
    shard.write_bytes(bytes(raw[:-2]))
    with pytest.raises(
        BertforgeError, match=r"train-00000.ids: [\d,]+ bytes, the manifest recorded"
    ):
        PretrainingDataset(data)
    record("altered prepared data", injected=2, refused=2, lost=0)


def test_verify_command_on_each_kind_of_directory(art, tmp_path, capsys):
    assert cli.main(["verify", str(art["mlm"]), str(art["data"])]) == 0
    out = capsys.readouterr().out
    assert f"OK         model      {art['mlm']}  (5 files" in out
    assert f"OK         data       {art['data']}" in out
    foreign = shutil.copytree(art["mlm"], tmp_path / "hf")
    (foreign / "manifest.json").unlink()
    assert cli.main(["verify", "--sizes_only", str(foreign)]) == 0
    assert "UNVERIFIED model" in capsys.readouterr().out
    assert cli.main(["verify", str(tmp_path)]) == 2
    line = _one_error_line(capsys)
    assert "not a model, checkpoint, run, downstream output or prepared data directory" in line
    text = tmp_path / "notes.txt"
    text.write_text("not a directory")
    assert cli.main(["verify", str(text)]) == 2
    assert _one_error_line(capsys) == (
        f"error: {text}: a file, not a directory; give a model, checkpoint, run, downstream "
        "output or prepared data directory"
    )


def test_write_manifest_is_written_last_and_skips_hidden_files(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"\0" * 10)
    (tmp_path / ".a.txt.123.tmp").write_text("temporary")
    write_manifest(tmp_path)
    record_ = json.loads((tmp_path / "manifest.json").read_text())
    assert sorted(record_["files"]) == ["a.txt", "sub/b.bin"]
    assert record_["files"]["sub/b.bin"] == {
        "size": 10,
        "sha256": "01d448afd928065458cf670b60f5a594d735af0172c8d67f22a81680132681ca",
    }


def test_a_config_asking_for_more_than_the_memory_gets_a_message(art, tmp_path, capsys):
    """10^12 parameters: refused from the sizes alone, before anything is allocated."""
    big = shutil.copytree(art["mlm"], tmp_path / "big")
    (big / "manifest.json").unlink()
    config = json.loads((big / "config.json").read_text())
    config.update(hidden_size=1 << 18, num_attention_heads=1 << 12, intermediate_size=1 << 20)
    (big / "config.json").write_text(json.dumps(config))
    assert cli.main(["fill-mask", "--model", str(big), "a [MASK] film ."]) == 2
    line = _one_error_line(capsys)
    assert "config.json: BertConfig describes" in line and "GiB of fp32 weights" in line
    assert int(line.split("describes ")[1].split(" ")[0].replace(",", "")) > 10**12
    assert "more than this machine's" in line and "check vocab_size, hidden_size" in line
    with pytest.raises(BertforgeError, match="parameters"):
        BertConfig(vocab_size=10**9, hidden_size=1024, num_attention_heads=16)
    record("config beyond memory", injected=2, refused=2, lost=0)
