"""Training: batch_chunk == full batch, the non-finite guard, checkpoints, config errors, CLI and plots."""

from __future__ import annotations

import json
import math
from typing import ClassVar

import pytest
import torch

from train_helpers import corpus_dir, tiny_cfg
from txl.checkpoint import join_tensors, list_checkpoints, load_checkpoint, split_tensors, verify_checkpoint
from txl.errors import CheckpointError, ConfigError
from txl.evaluate import evaluate
from txl.schedule import LRMultiplier, Schedule
from txl.train import TrainConfig, Trainer, TrainingDiverged
from txl.train_config import read_config_file


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from txl.data import load_corpus

    root = tmp_path_factory.mktemp("corpus")
    return load_corpus(str(corpus_dir(root)), cache_dir=root / "cache")


def _params(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_batch_chunk_gives_the_full_batch_update(tmp_path, corpus) -> None:
    """Chunks keep their own memory rows and scale by 1/batch_chunk: same loss, grads and weights."""
    results = []
    for chunk in (1, 2, 4):
        cfg = tiny_cfg(tmp_path / f"c{chunk}", batch_chunk=chunk, max_step=3, dropout=0.0)
        tr = Trainer(cfg, corpus=corpus)
        losses = []
        for batch in tr.train_iter:
            losses.append(tr.train_step(batch.input_ids, batch.targets)["loss"])
            if tr.step == 3:
                break
        results.append((losses, _params(tr), [m.clone() for m in tr.mems]))
    for losses, params, mems in results[1:]:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(results[0][0]), rtol=1e-6, atol=1e-6)
        for k, v in params.items():
            torch.testing.assert_close(v, results[0][1][k], rtol=1e-5, atol=1e-6, msg=k)
        for a, b in zip(mems, results[0][2]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class _NaNAt(Trainer):
    bad_calls: ClassVar[set[int]] = set()

    def loss_hook(self, loss):
        self._calls = getattr(self, "_calls", 0) + 1
        return loss * math.nan if self._calls in self.bad_calls else loss


def test_nonfinite_steps_are_skipped_never_applied(tmp_path, corpus) -> None:
    cfg = tiny_cfg(tmp_path / "run", max_step=5, save_interval=1, max_nonfinite=3)
    _NaNAt.bad_calls = {3, 4}
    tr = _NaNAt(cfg, corpus=corpus)
    before = None
    seen = []
    for batch in tr.train_iter:
        if getattr(tr, "_calls", 0) == 2:
            before = _params(tr)
        out = tr.train_step(batch.input_ids, batch.targets)
        seen.append((out["applied"], tr.step))
        if getattr(tr, "_calls", 0) == 4:
            for k, v in _params(tr).items():
                assert torch.equal(v, before[k]), f"{k} changed by a non-finite step"
        if tr.step == 5:
            break
    assert [a for a, _ in seen] == [True, True, False, False, True, True, True]
    assert tr.nonfinite_total == 2 and tr.nonfinite_run == 0 and tr.step == 5


def test_too_many_nonfinite_stop_with_last_good_checkpoint_intact(tmp_path, corpus) -> None:
    cfg = tiny_cfg(tmp_path / "run", max_step=50, save_interval=2, max_nonfinite=3)
    _NaNAt.bad_calls = set(range(6, 100))
    tr = _NaNAt(cfg, corpus=corpus)
    with pytest.raises(TrainingDiverged, match=r"3 consecutive non-finite.*step_00000004"):
        tr.fit()
    ckpts = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert ckpts[-1].name == "step_00000004"
    verify_checkpoint(ckpts[-1])
    _, weights, state = load_checkpoint(ckpts[-1])
    assert state["step"] == 4 and all(torch.isfinite(w).all() for w in weights.values())
    assert all(torch.isfinite(m).all() for m in state["mems"])


def test_checkpoint_round_trip_and_corruption_detected(tmp_path, corpus) -> None:
    cfg = tiny_cfg(tmp_path / "run", max_step=4, save_interval=2, dropout=0.1)
    tr = Trainer(cfg, corpus=corpus)
    tr.fit()
    ckpt = list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    assert not list((tmp_path / "run" / "checkpoints").glob(".*"))  # no temporary leftovers
    again = Trainer(cfg, corpus=corpus, resume=tmp_path / "run")
    assert again.step == 4 and again.train_iter.state_dict() == tr.train_iter.state_dict()
    for k, v in tr.model.state_dict().items():
        assert torch.equal(v, again.model.state_dict()[k])
    for a, b in zip(tr.mems, again.mems):
        assert torch.equal(a, b)
    assert again.optimizer.state_dict()["state"][0]["exp_avg"].equal(tr.optimizer.state_dict()["state"][0]["exp_avg"])
    data = bytearray((ckpt / "train_state.safetensors").read_bytes())
    data[-1] ^= 1
    (ckpt / "train_state.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        Trainer(cfg, corpus=corpus, resume=tmp_path / "run")


def test_split_join_tensors_round_trip() -> None:
    state = {"a": torch.arange(3.0), "b": [torch.tensor(2.0), {"c": 1, 5: torch.ones(2, 2)}], "d": None}
    meta, tensors = split_tensors(state)
    json.dumps(meta)
    back = join_tensors(json.loads(json.dumps(meta)), tensors)
    assert back["b"][0].shape == () and back["b"][1][5].equal(torch.ones(2, 2)) and back["b"][1]["c"] == 1


def test_schedules_match_the_official_formulas() -> None:
    cos = LRMultiplier("cosine", warmup_step=10, max_step=100, eta_ratio=0.1)
    assert cos(0) == 1.0 and cos(5) == 0.5  # update 1 runs at the base lr (official order), then warmup
    assert cos(50) == pytest.approx(0.1 + 0.9 * 0.5) and cos(100) == pytest.approx(0.1)
    inv = LRMultiplier("inv_sqrt", warmup_step=4, max_step=100)
    assert inv(0) == 0.0 and inv(2) == 2 / 8 and inv(16) == 0.25
    assert LRMultiplier("inv_sqrt", 0, 100)(0) == 1.0
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = Schedule(opt, TrainConfig(scheduler="dev_perf", lr=1.0, warmup_step=2, decay_rate=0.5, patience=0))
    opt.step()
    sched.step()
    assert sched.lr == 0.5
    opt.step()
    sched.step()
    assert sched.lr == 1.0
    sched.on_eval(3.0)
    sched.on_eval(3.5)
    assert sched.lr == 0.5
    state = json.loads(json.dumps(sched.state_dict()))
    other = Schedule(torch.optim.SGD([p], lr=1.0), TrainConfig(scheduler="dev_perf", lr=1.0, warmup_step=2))
    other.load_state_dict(state)
    assert other.updates == 2 and other.plateau.best == 3.0


def test_evaluate_restores_lengths(corpus) -> None:
    from txl import TransformerXLLM
    from txl.presets import tiny

    model = TransformerXLLM(tiny(len(corpus.vocab)))
    before = model.config
    out = evaluate(model, corpus.splits["valid"], batch_size=2, tgt_len=5, mem_len=7, same_length=True, clamp_len=3)
    assert model.config == before and out.tokens > 0 and math.isclose(out.ppl, math.exp(out.loss))


# ------------------------------------------------------------------ config errors (before any work)
@pytest.mark.parametrize(("values", "match"), [
    ({"lr": -1}, "lr must be > 0"),
    ({"batch_size": 6, "batch_chunk": 4}, "not divisible by batch_chunk"),
    ({"mem_lenn": 3}, "did you mean 'mem_len'"),
    ({"max_stpe": 3}, "did you mean 'max_step'"),
    ({"optim": "adamw"}, "optim must be one of"),
    ({"scheduler": "cosin"}, "did you mean 'cosine'"),
    ({"batch_size": "8"}, "batch_size must be int"),
    ({"eval_tgt_len": 0}, "eval_tgt_len must be >= 1"),
])
def test_bad_config_values_fail_with_one_line(values, match) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        TrainConfig.from_dict(values)
    assert "\n" not in str(info.value)


def test_bad_model_values_fail_before_the_data_loads(tmp_path) -> None:
    cfg = TrainConfig(dataset=str(tmp_path / "does-not-exist"), model="tiny", model_overrides={"mem_len": -2})
    with pytest.raises(ConfigError, match="mem_len must be an integer >= 0"):
        Trainer(cfg)
    with pytest.raises(ConfigError, match=r"unknown model preset 'tinny'.*did you mean 'tiny'"):
        Trainer(TrainConfig(dataset=str(tmp_path / "does-not-exist"), model="tinny"))


def test_config_file_toml_and_run_config(tmp_path) -> None:
    (tmp_path / "run.toml").write_text('preset = "wt2-cpu"\nlr = 3e-4\nn_layer = 2\n[model_overrides]\nd_inner = 96\n')
    from txl.presets import train_preset

    flat = read_config_file(tmp_path / "run.toml")
    cfg = TrainConfig.from_dict(flat, base=train_preset(flat["preset"]))
    assert cfg.lr == 3e-4 and cfg.max_step == 600
    assert cfg.model_overrides == {"pre_lnorm": True, "n_layer": 2, "d_inner": 96}
    assert TrainConfig.from_json(cfg.to_json()) == cfg
    (tmp_path / "config.json").write_text(json.dumps({"train": cfg.to_dict(), "model": {"n_token": 9, "n_layer": 2}}))
    assert TrainConfig.from_dict(read_config_file(tmp_path / "config.json")).model_overrides["n_layer"] == 2


def test_cli_train_errors_are_one_line(tmp_path, capsys) -> None:
    from txl._cli import main

    assert main(["train", "--preset", "wt103-bsae", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "did you mean 'wt103-base'" in err and "\n" not in err
    assert main(["train", "--preset", "tiny", "--batch-size", "6", "--batch-chunk", "4"]) == 2
    assert "not divisible" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert main(["train", "--preset", "enwik8-base", "--n-layer", "2", "--set", "cutoffs=[]", "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["batch_size"] == 22 and cfg["model_overrides"] == {"n_layer": 2, "cutoffs": []}


def test_fit_writes_the_run_directory_and_plot(tmp_path, corpus) -> None:
    pytest.importorskip("matplotlib")
    from txl import TransformerXLLM
    from txl.plot import plot_run

    cfg = tiny_cfg(tmp_path / "run", max_step=6, save_interval=3, eval_interval=3, final_eval=True)
    summary = Trainer(cfg, corpus=corpus).fit()
    run = tmp_path / "run"
    assert {"config.json", "metrics.jsonl", "vocab.json", "results.json", "best", "final", "checkpoints"} <= {
        p.name for p in run.iterdir()}
    resolved = json.loads((run / "config.json").read_text())
    assert resolved["train"]["max_step"] == 6 and resolved["model"]["n_token"] == len(corpus.vocab)
    kinds = [json.loads(ln)["kind"] for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("train") == 6 and kinds.count("valid") == 2 and kinds[-1] == "final"
    assert summary["final"]["test"]["tokens"] > 0
    TransformerXLLM.from_pretrained(run / "best")
    TransformerXLLM.from_pretrained(list_checkpoints(run / "checkpoints")[-1])
    png = plot_run(run, tmp_path / "curves.png")
    assert png.stat().st_size > 10_000


def test_bf16_autocast_trains_on_cpu(tmp_path, corpus) -> None:
    tr = Trainer(tiny_cfg(tmp_path / "run", precision="bf16", max_step=2), corpus=corpus)
    for batch in tr.train_iter:
        out = tr.train_step(batch.input_ids, batch.targets)
        assert out["applied"] and math.isfinite(out["loss"])
        if tr.step == 2:
            break
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())  # master weights stay fp32


def test_a_fresh_run_refuses_an_existing_run_directory(tmp_path, corpus) -> None:
    Trainer(tiny_cfg(tmp_path / "run", max_step=2), corpus=corpus).fit()
    with pytest.raises(ConfigError, match=r"already holds a run.*--resume"):
        Trainer(tiny_cfg(tmp_path / "run", max_step=2), corpus=corpus)


@pytest.mark.slow
def test_torch_compile_matches_eager(tmp_path, corpus) -> None:
    losses = []
    for compiled in (False, True):
        tr = Trainer(tiny_cfg(tmp_path / f"c{compiled}", compile=compiled, max_step=2), corpus=corpus)
        for batch in tr.train_iter:
            losses.append(tr.train_step(batch.input_ids, batch.targets)["loss"])
            if tr.step == 2:
                break
    torch.testing.assert_close(torch.tensor(losses[2:]), torch.tensor(losses[:2]), rtol=1e-4, atol=1e-4)
