"""The one owner of directory layouts: file names, run directories, model directories, and resolving a model,
checkpoint or run directory to the model directory behind it."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from transformer_xl.errors import CheckpointError
from transformer_xl.store.layout import (
    CONFIG,
    MANIFEST,
    VOCAB,
    WEIGHTS,
    RunDir,
    find_vocab,
    is_checkpoint_dir,
    is_model_dir,
    load_model_dir,
    load_weights,
    read_model_config,
    resolve_model,
    resolve_model_dir,
    save_model_dir,
    weights_digest,
)


def _write(directory, seed: int = 0):
    state = {"w": torch.randn(3, 2, generator=torch.Generator().manual_seed(seed))}
    state["tied"] = state["w"]  # a tied name: stored once, restored as the same tensor
    return save_model_dir(directory, state, json.dumps({"n_token": 3}), vocab_json='{"symbols": []}')


def test_model_dir_round_trip_with_tied_names_and_vocab(tmp_path) -> None:
    d = _write(tmp_path / "m")
    assert sorted(p.name for p in d.iterdir()) == sorted([CONFIG, WEIGHTS, VOCAB, MANIFEST]) and is_model_dir(d)
    assert sorted(json.loads((d / MANIFEST).read_text())["files"]) == sorted([CONFIG, WEIGHTS, VOCAB])
    config, state = load_model_dir(d)
    assert config == {"n_token": 3} and state["tied"] is state["w"]


def test_a_model_dir_with_a_manifest_is_not_a_checkpoint(tmp_path) -> None:
    d = _write(tmp_path / "best")
    assert not is_checkpoint_dir(d)
    step = _write(tmp_path / "checkpoints" / "step_00000002")
    (step / MANIFEST).unlink()
    assert is_checkpoint_dir(step)  # by its name, even incomplete (loading it then asks for its manifest)
    (d / "train_state.json").write_text("{}")
    assert is_checkpoint_dir(d) and not is_checkpoint_dir(tmp_path / "checkpoints" / "step_00000003")


def _damage(path, how: str) -> None:
    """Truncate a file by 4 bytes, or flip a low mantissa bit of its last float32 (the value stays finite)."""
    blob = bytearray(path.read_bytes())
    if how == "truncate":
        del blob[-4:]
    else:
        blob[-2] ^= 0x01
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("damage", ["bit-flip", "truncate"])
def test_a_changed_model_dir_is_refused_unless_not_verified(tmp_path, damage) -> None:
    d = _write(tmp_path / "m")
    _damage(d / WEIGHTS, damage)
    with pytest.raises(CheckpointError, match=f"{WEIGHTS} does not match its SHA-256 in {MANIFEST}") as exc:
        load_model_dir(d)
    assert "\n" not in str(exc.value) and (damage == "bit-flip") == ("bytes where" not in str(exc.value))
    with pytest.raises(CheckpointError, match=f"{WEIGHTS} does not match its SHA-256"):
        read_model_config(d)  # checked by default
    if damage == "bit-flip":  # without the check the changed (finite) value loads
        w = load_model_dir(d, verify=False)[1]["w"]
        original = torch.randn(3, 2, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(w).all() and (w != original).sum() == 1
    (d / CONFIG).write_text('{"n_token": 4}')
    with pytest.raises(CheckpointError, match=f"{CONFIG} does not match"):
        load_model_dir(d)


def test_non_finite_weights_are_refused_with_or_without_a_manifest(tmp_path) -> None:
    state = {"ok": torch.ones(2), "ids": torch.arange(3), "layer.w": torch.tensor([1.0, float("nan")])}
    d = save_model_dir(tmp_path / "m", state, json.dumps({"n_token": 3}))
    for verify in (True, False):
        with pytest.raises(CheckpointError, match=rf"^{d / WEIGHTS}: tensor 'layer.w' holds non-finite values "
                           r"\(1 NaN, 0 inf\)"):
            load_model_dir(d, verify=verify)
    assert load_weights(_write(tmp_path / "ok"))["w"].device.type == "cpu"  # on the CPU unless told
    (d / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=r"'layer\.w'"):
        load_model_dir(d)


def test_resolve_model_checkpoint_and_run_dirs(tmp_path) -> None:
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.config.write_text("{}")  # a run directory holds a config.json and no weights: it is no model itself
    assert not is_model_dir(run.root)
    _write(run.checkpoints / "step_00000002")
    _write(run.checkpoints / "step_00000010")
    assert resolve_model_dir(run.root) == run.checkpoints / "step_00000010"  # the newest checkpoint
    _write(run.final)
    assert resolve_model_dir(run.root) == run.final
    _write(run.best)
    assert resolve_model_dir(run.root) == run.best  # best before final before checkpoints
    assert resolve_model_dir(run.best) == run.best
    with pytest.raises(CheckpointError, match="no such"):
        resolve_model_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no model"):
        resolve_model_dir(tmp_path / "empty")


def test_resolve_model_says_which_model_of_a_run_it_picked(tmp_path) -> None:
    run = RunDir(tmp_path / "run")
    _write(run.checkpoints / "step_00000010")
    assert resolve_model(run.root) == (run.checkpoints / "step_00000010", "the newest checkpoint; no best/ or final/")
    _write(run.final)
    (run.final / "train_info.json").write_text('{"step": 12}')
    assert resolve_model(run.root) == (run.final, "the last model of training, step 12; no best/")
    _write(run.best)
    assert resolve_model(run.root) == (run.best, "the best validation model")  # no train_info.json: no step
    for unreadable in ("{torn", "[3]", '{"step": "7"}', '{"step": true}'):
        (run.best / "train_info.json").write_text(unreadable)
        assert resolve_model(run.root) == (run.best, "the best validation model")
    (run.best / "train_info.json").write_text('{"step": 8, "valid_loss": 3.5}')
    assert resolve_model(run.root) == (run.best, "the best validation model, step 8")
    for given in (run.best, run.final, run.checkpoints / "step_00000010"):  # given as such: nothing to tell
        assert resolve_model(given) == (given, None)


def test_run_dir_names_and_checkpoint_parent(tmp_path) -> None:
    run = RunDir(tmp_path)
    assert (run.config.name, run.vocab.name, run.metrics.name, run.results.name) == (
        "config.json", "vocab.json", "metrics.jsonl", "results.json")
    assert RunDir.of_checkpoint(run.checkpoints / "step_00000004") == tmp_path


def test_find_vocab_beside_the_model_or_in_its_run(tmp_path) -> None:
    run = RunDir(tmp_path / "run")
    _write(run.best)
    (run.best / VOCAB).unlink()
    with pytest.raises(CheckpointError, match=rf"^no vocabulary for {run.best}: neither {run.best / VOCAB} nor "
                       rf"{run.vocab} exists; pass --vocab PATH \(a txl vocab JSON\)$"):
        find_vocab(run.best)
    run.vocab.write_text("{}")
    assert find_vocab(run.best) == run.vocab
    _write(run.checkpoints / "step_00000001")
    (run.checkpoints / "step_00000001" / VOCAB).unlink()
    assert find_vocab(run.checkpoints / "step_00000001") == run.vocab
    assert find_vocab(run.best, tmp_path / "given.json") == tmp_path / "given.json"


def test_missing_or_broken_model_dirs_fail_clearly(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_model_dir(tmp_path / "nope")
    d = _write(tmp_path / "m")
    (d / MANIFEST).unlink()
    (d / CONFIG).rename(tmp_path / "config.json")
    with pytest.raises(CheckpointError, match=rf"^{d / CONFIG} not found \(a txl model directory holds config.json "
                       r"and model.safetensors\)$"):
        load_model_dir(d)
    d = _write(tmp_path / "m")
    (d / CONFIG).write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="must be an object"):
        load_model_dir(d, verify=False)
    (d / MANIFEST).unlink()  # a directory of an older txl, or made by hand, loads unchecked
    with pytest.raises(CheckpointError, match="must be an object"):
        load_model_dir(d)


def test_weights_digest_is_the_weights_file_sha256(tmp_path) -> None:
    a, c = _write(tmp_path / "a"), _write(tmp_path / "c", seed=1)
    assert weights_digest(a) == hashlib.sha256((a / WEIGHTS).read_bytes()).hexdigest()[:16]
    assert weights_digest(a) != weights_digest(c)


def test_a_model_config_is_read_past_the_keys_that_name_it_for_transformers(tmp_path) -> None:
    from transformer_xl import ConfigError, TXLConfig
    from transformer_xl.store.layout import MODEL_TYPE, model_fields, read_model_config

    cfg = TXLConfig(n_token=10, n_layer=1, n_head=1, d_model=4, d_head=4, d_inner=8)
    written = json.loads(cfg.to_json())
    assert written["model_type"] == MODEL_TYPE == "transfo-xl"  # what AutoConfig recognises
    assert TXLConfig.from_dict(written) == cfg == TXLConfig.from_json(cfg.to_json())
    with_arch = {**written, "architectures": ["TransfoXLForCausalLM"]}
    assert model_fields(with_arch) == cfg.to_dict()
    (tmp_path / "config.json").write_text(json.dumps(with_arch))
    assert read_model_config(tmp_path) == cfg.to_dict()
    assert model_fields(cfg.to_dict()) == cfg.to_dict()  # written before model_type was: as it is
    with pytest.raises(ConfigError, match="model_type 'gpt2', not 'transfo-xl'"):
        model_fields({**written, "model_type": "gpt2"})
    with pytest.raises(ConfigError, match="'architectures' must be a list of names"):
        model_fields({**written, "architectures": "TransfoXLForCausalLM"})
    (tmp_path / "config.json").write_text(json.dumps({**written, "model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="model_type 'gpt2', not 'transfo-xl'"):  # a file: CheckpointError
        read_model_config(tmp_path)
