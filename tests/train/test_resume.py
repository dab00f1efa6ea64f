"""``--resume`` semantics: changeable fields applied from the next step and logged, fixed ones refused with the
run untouched, the vocabulary bound to the run, no dead end before the first checkpoint, a torn metrics line,
time-based saving and a full disk."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import re
from pathlib import Path

import pytest
import torch

from tests.helpers import corpus_dir
from transformer_xl.errors import ConfigError, DataError
from transformer_xl.store.checkpoint import list_checkpoints, verify_checkpoint
from transformer_xl.store.lock import LOCK
from transformer_xl.train import Trainer
from transformer_xl.train.resume import _WHY, FIXED


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from transformer_xl.data import load_corpus

    root = tmp_path_factory.mktemp("corpus")
    return load_corpus(str(corpus_dir(root)), cache_dir=root / "cache")


def _snapshot(run: Path) -> dict[str, str]:
    """SHA-256 of every file of a run directory but its lock."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and p.name != LOCK}


def _records(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def _trained(tiny_run, corpus, **kw) -> Path:
    cfg = tiny_run(max_step=4, save_interval=2, **kw)
    Trainer(cfg, corpus=corpus).fit()
    return Path(cfg.out_dir)


def _resume_cfg(run: Path, **changes):
    """The run's config with ``changes``, as ``txl train --resume RUN --flag ...`` resolves it."""
    from transformer_xl.train.config import TrainConfig, read_config_file

    return TrainConfig.from_dict({**changes, "out_dir": str(run)},
                                 base=TrainConfig.from_dict(read_config_file(run / "config.json")))


def _resume(run: Path, corpus, **changes) -> dict:
    return Trainer(_resume_cfg(run, **changes), corpus=corpus, resume=run).fit()


def test_a_new_lr_applies_from_the_next_step_and_is_logged(tmp_path, corpus, tiny_run) -> None:
    run = _trained(tiny_run, corpus, scheduler="constant")
    plain = tmp_path / "plain"
    import shutil

    shutil.copytree(run, plain)
    _resume(plain, corpus, max_step=6)
    _resume(run, corpus, max_step=6, lr=0.1)
    new, old = _records(run, "train"), _records(plain, "train")
    assert [r["lr"] for r in new[4:]] == [0.1, 0.1] and [r["lr"] for r in old[4:]] == [3e-3, 3e-3]
    assert new[:4] == [{**r, "time": new[i]["time"], "tokens_per_s": new[i]["tokens_per_s"]}
                       for i, r in enumerate(old[:4])]
    assert new[5]["train_loss"] != old[5]["train_loss"]  # the update of step 5 ran with lr 0.1
    event = [r for r in _records(run, "event") if r["event"] == "resume"][-1]
    assert event["changes"] == {"lr": [3e-3, 0.1], "max_step": [4, 6]}
    assert json.loads((run / "config.json").read_text())["train"]["lr"] == 0.1


def test_a_cosine_schedule_is_retargeted_to_the_new_max_step(tmp_path, corpus, tiny_run) -> None:
    import math

    run = _trained(tiny_run, corpus, warmup_step=0)
    _resume(run, corpus, max_step=8, lr=0.01, eta_min=0.001)
    lrs = [r["lr"] for r in _records(run, "train")]
    # update n runs with the schedule's value at n - 1 (the official order)
    expected = [0.001 + (0.01 - 0.001) * (1 + math.cos(math.pi * (n - 1) / 8)) / 2 for n in (5, 6, 7, 8)]
    assert lrs[4:] == pytest.approx(expected, rel=1e-12)


def test_sgd_momentum_change_is_applied(tmp_path, corpus, tiny_run) -> None:
    run = _trained(tiny_run, corpus, optim="sgd", mom=0.0, lr=0.1)
    cfg = _resume_cfg(run, max_step=5, mom=0.9)
    with Trainer(cfg, corpus=corpus, resume=run) as tr:
        assert tr.optimizer.param_groups[0]["momentum"] == 0.9


_FIXED_CHANGES = {"dataset": "ptb", "model": "cpu-small", "batch_size": 8, "varlen": True, "optim": "sgd",
                  "scheduler": "inv_sqrt", "seed": 8, "half_loss": True,
                  "init_from": "some/model", "level": "char", "tokenizer": "tok.json", "valid_fraction": 0.1,
                  "test_fraction": 0.1,
                  "n_layer": 3, "tgt_len": 8, "mem_len": 12, "d_inner": 40, "precision": "fp16"}


@pytest.mark.parametrize("key", sorted(_FIXED_CHANGES))
def test_a_fixed_field_is_refused_and_the_run_left_as_it_was(tmp_path, corpus, tiny_run, key) -> None:
    run = _trained(tiny_run, corpus)
    before = _snapshot(run)
    cfg = _resume_cfg(run, **{key: _FIXED_CHANGES[key]})
    with pytest.raises(ConfigError, match=rf"cannot change {key} on --resume: .*{key}=") as err:
        Trainer(cfg, corpus=corpus, resume=run)
    assert "\n" not in str(err.value)
    assert _snapshot(run) == before
    summary = _resume(run, corpus, max_step=5)  # a later plain resume works
    assert summary["step"] == 5


def test_every_fixed_field_has_a_refusal_test() -> None:
    """Every field a resume refuses to change (each has its reason in the refusal) is tested above."""
    assert set(FIXED) <= set(_WHY)
    assert set(_WHY) <= set(_FIXED_CHANGES)


@pytest.mark.parametrize(("old", "new", "refused"), [
    ("fp32", "fp16", True), ("fp16", "bf16", True), ("bf16", "fp16", True), ("fp32", "bf16", False),
    ("bf16", "auto", False),
])
def test_a_precision_change_is_refused_when_fp16_is_on_either_side(tmp_path, corpus, tiny_run, old, new,
                                                                   refused) -> None:
    """fp16 keeps a loss scaler's state in the checkpoint: moving to or from it is refused; other precisions may
    change (the plan is checked directly, as if the run had been trained in ``old``)."""
    from transformer_xl.train.resume import plan_resume

    run = _trained(tiny_run, corpus)
    plan = plan_resume(run)
    plan.train["precision"] = old  # as if the run was trained with ``old``
    cfg = dataclasses.replace(_resume_cfg(run), precision=new)
    if refused:
        with pytest.raises(ConfigError, match=rf"cannot change precision on --resume: .*precision='{old}' "
                           r"\(it fixes fp16's loss-scaler state\)"):
            plan.check(cfg, plan.model, corpus.vocab.sha256())
    else:
        assert plan.check(cfg, plan.model, corpus.vocab.sha256()) == {"precision": [old, new]}


def test_a_corpus_whose_vocabulary_changed_is_refused(tmp_path, corpus, tiny_run) -> None:
    from transformer_xl.data import load_corpus

    run = _trained(tiny_run, corpus)
    data = corpus_dir(tmp_path / "edited")
    with open(data / "train.txt", "a", encoding="utf-8") as f:
        f.write("a brand new word appears\n")
    edited = load_corpus(str(data), cache_dir=tmp_path / "cache")
    before = _snapshot(run)
    new, old, cfg = edited.vocab.sha256()[:12], corpus.vocab.sha256()[:12], _resume_cfg(run, max_step=5)
    with pytest.raises(DataError, match=rf"^the vocabulary of dataset '{re.escape(cfg.dataset)}' differs from the one "
                       rf"{run} was trained with \(sha256 {new} vs {old}\): its text changed since the run started; "
                       r"restore it, or start a new run with another --out-dir$"):
        Trainer(cfg, corpus=edited, resume=run)
    assert _snapshot(run) == before


def test_checkpoints_record_the_config_and_the_vocabulary(tmp_path, corpus, tiny_run) -> None:
    from transformer_xl.store.checkpoint import read_checkpoint_meta

    run = _trained(tiny_run, corpus)
    _, state = read_checkpoint_meta(list_checkpoints(run / "checkpoints")[-1])
    assert state["vocab_sha256"] == corpus.vocab.sha256()
    assert state["train_config"]["lr"] == 3e-3 and state["train_config"]["max_step"] == 4


def test_a_run_killed_before_its_first_checkpoint_starts_again(tmp_path, corpus, tiny_run, capsys) -> None:
    cfg = tiny_run(max_step=3, save_interval=100, eval_interval=100)
    with Trainer(cfg, corpus=corpus) as tr:  # what a kill before the first save leaves: config, vocab, metrics
        tr._write_run_files()
        (Path(cfg.out_dir) / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n{"kind": "tra')
    with pytest.raises(ConfigError, match="already holds a run: continue it with `txl train --resume"):
        Trainer(cfg, corpus=corpus)
    summary = Trainer(cfg, corpus=corpus, resume=cfg.out_dir).fit()
    assert summary["step"] == 3
    assert "has no checkpoint yet: starting it again from step 0" in capsys.readouterr().err
    records = [json.loads(ln) for ln in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["event"] == "restart" and [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]


def test_a_torn_metrics_line_does_not_block_a_resume(tmp_path, corpus, tiny_run, capsys) -> None:
    run = _trained(tiny_run, corpus)
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"kind": "train", "step": 5, "train_lo')
    capsys.readouterr()
    assert _resume(run, corpus, max_step=6)["step"] == 6
    assert capsys.readouterr().err.count("torn last line") == 1
    assert [r["step"] for r in _records(run, "train")] == [1, 2, 3, 4, 5, 6]


def test_save_minutes_saves_by_time_beside_steps(tmp_path, corpus, tiny_run) -> None:
    cfg = tiny_run(max_step=5, save_interval=100, eval_interval=100, save_minutes=1e-9, keep_checkpoints=10)
    Trainer(cfg, corpus=corpus).fit()
    steps = [int(p.name[5:]) for p in list_checkpoints(Path(cfg.out_dir) / "checkpoints")]
    assert steps[:2] == [1, 2] and steps[-1] == 5  # every step is "30 minutes" after the last save here
    with pytest.raises(ConfigError, match="save_minutes must be > 0"):
        dataclasses.replace(cfg, save_minutes=0.0)


def test_a_full_disk_during_a_checkpoint_loses_nothing(tmp_path, corpus, tiny_run, monkeypatch) -> None:
    import transformer_xl.store.checkpoint as ckpt_mod

    cfg = tiny_run(max_step=6, save_interval=2)
    real = ckpt_mod.save_tensors

    def full_at_step_4(tensors, path, *a, **kw):
        if "step_00000004" in str(Path(path).parent) or ".step_00000004." in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(tensors, path, *a, **kw)

    monkeypatch.setattr(ckpt_mod, "save_tensors", full_at_step_4)
    with pytest.raises(OSError, match="No space left"):
        Trainer(cfg, corpus=corpus).fit()
    root = Path(cfg.out_dir) / "checkpoints"
    assert [p.name for p in list_checkpoints(root)] == ["step_00000002"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary left behind
    verify_checkpoint(root / "step_00000002")
    monkeypatch.setattr(ckpt_mod, "save_tensors", real)
    assert Trainer(cfg, corpus=corpus, resume=cfg.out_dir).fit()["step"] == 6  # the lock was released too


def test_a_corrupt_newest_checkpoint_names_the_older_one(tmp_path, corpus, tiny_run) -> None:
    from tests.helpers import damage_file
    from transformer_xl.errors import CheckpointError

    run = _trained(tiny_run, corpus)
    older, newest = list_checkpoints(run / "checkpoints")
    damage_file(newest / "model.safetensors", "bit-flip")
    with pytest.raises(CheckpointError, match=rf"SHA-256.*resume from an older checkpoint with --resume {older}$"):
        Trainer(_resume_cfg(run, max_step=5), corpus=corpus, resume=run)
    assert Trainer(_resume_cfg(run, max_step=5), corpus=corpus, resume=older).fit()["step"] == 5


@pytest.mark.parametrize("precision", ["bf16", "auto", "fp16"])
def test_resume_is_exact_under_a_given_precision(tmp_path, corpus, tiny_run, precision) -> None:
    """A bf16, fp16 (its loss scaler's state included) or auto-resolved run resumed from its step-2 checkpoint logs
    the same losses as the run itself and ends in the same state."""
    import shutil

    from transformer_xl.store.checkpoint import load_checkpoint

    run = _trained(tiny_run, corpus, precision=precision, log_interval=1)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / "step_00000004")
    _resume(copy, corpus)
    assert [r["train_loss"] for r in _records(copy, "train")] == [r["train_loss"] for r in _records(run, "train")]
    ends = [load_checkpoint(r / "checkpoints" / "step_00000004")[2] for r in (run, copy)]
    assert ends[0]["scaler"] == ends[1]["scaler"] and (ends[0]["scaler"] is None) == (precision != "fp16")
    if precision == "fp16":  # four clean steps since the scale was set: a scaler not resumed would count two
        assert ends[1]["scaler"]["_growth_tracker"] == 4 and ends[1]["scaler"]["scale"] == 2.0**16


def test_a_checkpoint_resumes_onto_another_device(tmp_path, corpus, tiny_run) -> None:
    """What a checkpoint read on the CPU holds goes to the resuming process's device: weights, optimizer moments and
    memories (the meta device stands in for a GPU: a tensor left behind would stay on the CPU)."""
    from transformer_xl.store.checkpoint import load_checkpoint
    from transformer_xl.train.state import restore_state

    run = _trained(tiny_run, corpus)
    _, weights, state = load_checkpoint(run / "checkpoints" / "step_00000004")
    assert state["mems"] and state["optimizer"]["state"]
    other = Trainer(dataclasses.replace(tiny_run(), out_dir=str(tmp_path / "other")), corpus=corpus)
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)  # the same Parameter objects (the optimizer's, tied)
    try:
        other.model.to("meta")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    other.device = "meta"
    restore_state(other, {**state, "model": weights})
    assert {p.device.type for p in other.model.parameters()} == {"meta"}
    assert {m.device.type for m in other.mems} == {"meta"}
    moments = [v for s in other.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert moments and {m.device.type for m in moments} == {"meta"}
    assert other.step == 4


@pytest.mark.parametrize(("first", "then"), [(4.0, 1.0), (1.0, 4.0)])
def test_auto_precision_is_kept_on_resume_whatever_a_new_measurement_says(tmp_path, corpus, tiny_run, monkeypatch,
                                                                          first, then) -> None:
    """``auto`` resolved once per run: a resume that would measure the other precision (another load on the
    machine) keeps the checkpoint's, and logs the losses of the run itself."""
    import shutil

    import torch

    from transformer_xl.train import precision

    def rates(ratio):
        return lambda device, dtype, **kw: ratio if dtype == torch.bfloat16 else 1.0

    monkeypatch.setattr(precision, "matmul_rate", rates(first))
    run = _trained(tiny_run, corpus, precision="auto", log_interval=1)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / "step_00000004")
    monkeypatch.setattr(precision, "matmul_rate", rates(then))
    trainer = Trainer(_resume_cfg(copy), corpus=corpus, resume=copy)
    assert trainer.precision.name == ("bf16" if first >= precision.CPU_BF16_MIN_SPEEDUP else "fp32")
    trainer.fit()
    assert [r["train_loss"] for r in _records(copy, "train")] == [r["train_loss"] for r in _records(run, "train")]


def test_resume_auto_starts_an_empty_directory_and_continues_its_own_run(tmp_path, corpus, tiny_run, capsys) -> None:
    cfg = tiny_run(max_step=4, save_interval=2)
    first = Trainer(cfg, corpus=corpus, resume="auto")  # the directory does not exist yet: a new run
    assert first.plan is None
    first.fit()
    assert "--resume auto" not in capsys.readouterr().err
    longer = dataclasses.replace(cfg, max_step=6)  # the same command line with a longer --max-step
    tr = Trainer(longer, corpus=corpus, resume="auto")
    assert tr.resumed_from == Path(cfg.out_dir) / "checkpoints" / "step_00000004" and tr.step == 4
    assert tr.fit()["step"] == 6
    assert f"--resume auto: continuing {cfg.out_dir} from step 4" in capsys.readouterr().err
    assert [r["step"] for r in _records(Path(cfg.out_dir), "train")] == list(range(1, 7))


def test_resume_auto_refuses_a_different_run_untouched(tmp_path, corpus, tiny_run) -> None:
    run = _trained(tiny_run, corpus)
    before = _snapshot(run)
    other = _resume_cfg(run, optim="sgd")
    with pytest.raises(ConfigError, match="cannot change optim on --resume"):
        Trainer(other, corpus=corpus, resume="auto")
    assert _snapshot(run) == before


def test_without_resume_a_torchrun_restart_is_told_to_add_resume_auto(tmp_path, corpus, tiny_run,
                                                                     monkeypatch) -> None:
    from transformer_xl.train.resume import restart_hint

    run = _trained(tiny_run, corpus)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert restart_hint() == ""
    with pytest.raises(ConfigError, match=r"holds a run: continue it with .*another --out-dir$"):
        Trainer(_resume_cfg(run), corpus=corpus)  # a user at a terminal: refused as ever
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    with pytest.raises(ConfigError, match=r"this is torchrun's restart 2: put --resume auto in the command"):
        Trainer(_resume_cfg(run), corpus=corpus)


@pytest.mark.parametrize(("count", "hint"), [(None, False), ("0", False), ("1", True), ("2", True), ("x", False)])
def test_the_restart_hint_is_given_from_the_first_torchrun_restart(monkeypatch, count, hint) -> None:
    from transformer_xl.train.resume import restart_hint

    if count is None:
        monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    else:
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", count)
    expected = (f" (this is torchrun's restart {count}: put --resume auto in the command so that a restart continues "
                "the run)") if hint else ""
    assert restart_hint() == expected


def test_a_directory_with_checkpoints_and_no_config_holds_a_run(tmp_path, corpus, tiny_run) -> None:
    """A run whose config.json was lost still holds its checkpoints: a new run into it is refused, untouched."""
    from transformer_xl.store.layout import RunDir
    from transformer_xl.train.resume import holds_run, resume_target

    run = _trained(tiny_run, corpus)
    (run / "config.json").unlink()
    assert holds_run(RunDir(run)) and resume_target("auto", run) == run
    before = _snapshot(run)
    with pytest.raises(ConfigError, match="already holds a run"):
        Trainer(tiny_run(max_step=4, save_interval=2), corpus=corpus)  # the same command without --resume
    assert _snapshot(run) == before


def test_resuming_an_empty_directory_is_refused_and_writes_nothing(tmp_path, corpus, tiny_run) -> None:
    from transformer_xl.errors import CheckpointError
    from transformer_xl.train.resume import plan_resume

    cfg = tiny_run(max_step=4)
    empty = Path(cfg.out_dir)
    empty.mkdir()
    with pytest.raises(CheckpointError, match=rf"^no checkpoint to resume from in {empty} \(expected "
                       rf"{empty}/checkpoints/step_\*/\)$"):
        plan_resume(empty)
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        Trainer(cfg, corpus=corpus, resume=empty)
    assert [p.name for p in empty.iterdir()] in ([], [LOCK])  # a lock file alone is no run


def test_resume_target(tmp_path) -> None:
    from transformer_xl.train.resume import resume_target

    assert resume_target(None, tmp_path / "r") is None
    assert resume_target("auto", tmp_path / "r") is None  # absent
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / LOCK).write_text("")
    assert resume_target("auto", tmp_path / "r") is None  # a lock file alone is no run
    (tmp_path / "r" / "config.json").write_text("{}")
    assert resume_target("auto", tmp_path / "r") == tmp_path / "r"
    assert resume_target("./auto", tmp_path / "r") == Path("auto")  # a run directory named auto
    assert resume_target(tmp_path / "x", tmp_path / "r") == tmp_path / "x"


def test_refusals_say_what_the_field_fixes_in_one_line(tmp_path, corpus, tiny_run) -> None:
    run = _trained(tiny_run, corpus)
    with pytest.raises(ConfigError, match=rf"^cannot change optim on --resume: {run} was trained with optim='adam' "
                       r"\(it fixes the optimizer state's form\); start a new run with another --out-dir$"):
        Trainer(_resume_cfg(run, optim="sgd"), corpus=corpus, resume=run)
    with pytest.raises(ConfigError, match=rf"^cannot change n_layer on --resume: {run} was trained with n_layer=2 "
                       r"\(the architecture and training lengths are fixed; evaluation lengths: --test-\*\)$"):
        Trainer(_resume_cfg(run, n_layer=3), corpus=corpus, resume=run)
    with pytest.raises(ConfigError, match=rf"^{run} already holds a run: continue it with `txl train --resume {run}`, "
                       r"or give another --out-dir$"):
        Trainer(tiny_run(max_step=4, save_interval=2), corpus=corpus)


def test_the_schedule_is_retargeted_when_any_schedule_field_changes(tmp_path) -> None:
    from transformer_xl.store.layout import RunDir
    from transformer_xl.train.resume import ResumePlan

    plan = ResumePlan(RunDir(tmp_path), None)
    for changes, retarget in (({}, False), ({"log_interval": [1, 2]}, False), ({"lr": [1, 2]}, True),
                              ({"lr": [1, 2], "log_interval": [1, 2]}, True)):
        plan.changes = changes
        assert plan.schedule_changed is retarget, changes


def test_a_corrupt_only_checkpoint_is_refused_without_an_older_one_to_name(tmp_path, corpus, tiny_run) -> None:
    from tests.helpers import damage_file
    from transformer_xl.errors import CheckpointError

    cfg = tiny_run(max_step=2, save_interval=2)
    Trainer(cfg, corpus=corpus).fit()
    [only] = list_checkpoints(Path(cfg.out_dir) / "checkpoints")
    damage_file(only / "model.safetensors", "bit-flip")
    with pytest.raises(CheckpointError, match="SHA-256") as err:
        Trainer(_resume_cfg(Path(cfg.out_dir), max_step=4), corpus=corpus, resume=cfg.out_dir)
    assert "older checkpoint" not in str(err.value)


def test_a_checkpoint_given_to_resume_from_is_resumed_within_its_run(tmp_path, corpus, tiny_run) -> None:
    """``--resume RUN/checkpoints/step_N``: that checkpoint (not the newest, not step 0), the run's settings and
    a refusal that names the run directory."""
    from transformer_xl.train.resume import plan_resume

    run = _trained(tiny_run, corpus)
    older, _ = list_checkpoints(run / "checkpoints")
    plan = plan_resume(older)
    assert plan.checkpoint == older and plan.run.root == run and plan.train["max_step"] == 4
    with pytest.raises(ConfigError, match=rf"^cannot change optim on --resume: {run} was trained with optim="):
        Trainer(_resume_cfg(run, optim="sgd"), corpus=corpus, resume=older)


def test_the_vocabulary_size_is_not_compared_as_an_architecture_field(tmp_path, corpus, tiny_run) -> None:
    """``n_token`` follows the vocabulary, which is compared by its SHA-256: a model dict with another ``n_token``
    is no architecture change."""
    from transformer_xl.train.resume import plan_resume

    run = _trained(tiny_run, corpus)
    plan = plan_resume(run)
    model = {**plan.model, "n_token": plan.model["n_token"] + 1}
    assert plan.check(_resume_cfg(run, max_step=6), model, corpus.vocab.sha256()) == {"max_step": [4, 6]}


def test_the_run_config_is_read_when_there_not_needed_when_lost_and_refused_when_torn(tmp_path, corpus,
                                                                                      tiny_run) -> None:
    """Before the first checkpoint the run's ``config.json`` is what a resume is checked against; with checkpoints
    each one records its own (one of an older txl does not: ``config.json`` stands in), so a lost ``config.json``
    is no obstacle; a torn one is a one-line refusal."""
    from transformer_xl.errors import CheckpointError
    from transformer_xl.store.manifest import write_manifest
    from transformer_xl.train.resume import plan_resume

    cfg = tiny_run(max_step=3, save_interval=100, eval_interval=100)
    with Trainer(cfg, corpus=corpus) as tr:  # killed before its first save: config, vocabulary, metrics
        tr._write_run_files()
    plan = plan_resume(cfg.out_dir)
    assert plan.checkpoint is None and plan.train["max_step"] == 3 and plan.vocab_sha256 == corpus.vocab.sha256()
    assert plan.model["n_layer"] == 2 and plan.model["d_model"] == 16  # the architecture it was started with
    (Path(cfg.out_dir) / "vocab.json").unlink()  # the vocabulary's SHA-256 is in config.json too
    assert plan_resume(cfg.out_dir).vocab_sha256 == corpus.vocab.sha256()
    import shutil

    shutil.rmtree(cfg.out_dir)
    run = _trained(tiny_run, corpus)
    older, newest = list_checkpoints(run / "checkpoints")
    state = json.loads((older / "train_state.json").read_text())  # as an older txl wrote it: the run's config.json
    del state["train_config"], state["vocab_sha256"]  # says what it was trained with
    (older / "train_state.json").write_text(json.dumps(state))
    write_manifest(older, [p.name for p in older.iterdir() if p.name != "MANIFEST.json"], step=2)
    (run / "vocab.json").unlink()
    plan = plan_resume(older)
    assert plan.train["max_step"] == 4 and plan.vocab_sha256 == corpus.vocab.sha256()
    (run / "config.json").write_text('{"train": {"max_st')
    with pytest.raises(CheckpointError, match=rf"^run config {run / 'config.json'} is not valid JSON: "):
        plan_resume(run)
    (run / "config.json").unlink()
    plan = plan_resume(run)
    assert plan.checkpoint == newest and plan.train["max_step"] == 4 and plan.vocab_sha256 == corpus.vocab.sha256()


def test_a_step_directory_without_its_manifest_is_never_resumed_from(tmp_path, corpus, tiny_run) -> None:
    """The newest step directory lacks its manifest (a save cut short): a resume of the run continues from the
    newest complete checkpoint; the incomplete one, named itself, is refused in one line; a run whose only step
    directory is incomplete starts again from step 0."""
    from transformer_xl.errors import CheckpointError
    from transformer_xl.train.resume import plan_resume

    run = _trained(tiny_run, corpus)
    older, newest = list_checkpoints(run / "checkpoints")
    (newest / "MANIFEST.json").unlink()
    assert list_checkpoints(run / "checkpoints") == [older]
    assert plan_resume(run).checkpoint == older
    with Trainer(_resume_cfg(run), corpus=corpus, resume=run) as tr:
        assert tr.resumed_from == older and tr.step == 2
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(newest))} is not a complete checkpoint \(no "
                                              rf"MANIFEST\.json\); resume from an older checkpoint with --resume "
                                              rf"{re.escape(str(older))}$"):
        plan_resume(newest)
    (older / "MANIFEST.json").unlink()
    assert plan_resume(run).checkpoint is None


def test_a_new_run_starts_only_in_a_new_or_empty_directory(tmp_path, corpus, tiny_run, capsys) -> None:
    """A fresh run into a directory holding anything (the user's files, a model directory's files) is refused in one
    line before it writes anything, its lock file included; the CLI says it on one line, no traceback."""
    from transformer_xl.cli import main

    cfg = tiny_run(max_step=2)
    out = Path(cfg.out_dir)
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "best").mkdir()
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(out))} is not empty \(best, notes\.txt\): a new run "
                                          r"starts in a new or empty --out-dir, so that it writes over nothing of "
                                          r"yours; give another --out-dir$"):
        Trainer(cfg, corpus=corpus)
    assert sorted(p.name for p in out.iterdir()) == ["best", "notes.txt"]
    with pytest.raises(ConfigError, match="is not empty"):
        Trainer(cfg, corpus=corpus, resume="auto")  # no run there to continue: a new run, refused alike
    assert main(["train", "--preset", "tiny", "--dataset", str(corpus_dir(tmp_path / "data")), "--max-step", "1",
                 "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl train: error: ") and err.count("\n") == 1 and "is not empty" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["best", "notes.txt"]
    (out / "notes.txt").unlink()
    (out / "best").rmdir()
    (out / "checkpoints").mkdir()  # empty, as a killed writer's cleared temporaries leave it
    with Trainer(cfg, corpus=corpus) as tr:
        assert tr.plan is None
