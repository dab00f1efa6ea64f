"""Training: batch_chunk == full batch, the non-finite guard, checkpoints, config errors, CLI and plots."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

from tests.assets.golden import GOLDEN_RUN, golden_run, previous_draws
from tests.helpers import corpus_dir
from tests.helpers import tiny_train_config as tiny_cfg
from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.store.checkpoint import list_checkpoints, load_checkpoint, verify_checkpoint
from transformer_xl.train import TrainConfig, Trainer, TrainingDiverged


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from transformer_xl.data import load_corpus

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


def test_nonfinite_steps_are_skipped_never_applied(tmp_path, corpus, tiny_run) -> None:
    cfg = tiny_run(max_step=5, save_interval=1, max_nonfinite=3)
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


def test_too_many_nonfinite_stop_with_last_good_checkpoint_intact(tmp_path, corpus, tiny_run) -> None:
    cfg = tiny_run(max_step=50, save_interval=2, max_nonfinite=3)
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


def test_checkpoint_round_trip_and_corruption_detected(tmp_path, corpus, tiny_run) -> None:
    cfg = tiny_run(max_step=4, save_interval=2, dropout=0.1)
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
    again.close()  # a Trainer holds its run directory's lock until fit() ends or close()
    data = bytearray((ckpt / "train_state.safetensors").read_bytes())
    data[-1] ^= 1
    (ckpt / "train_state.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        Trainer(cfg, corpus=corpus, resume=tmp_path / "run")


def test_bad_model_values_fail_before_the_data_loads(tmp_path) -> None:
    cfg = TrainConfig(dataset=str(tmp_path / "does-not-exist"), model="tiny", model_overrides={"mem_len": -2})
    with pytest.raises(ConfigError, match="mem_len must be an integer >= 0"):
        Trainer(cfg)
    with pytest.raises(ConfigError, match=r"unknown model preset 'tinny'.*did you mean 'tiny'"):
        Trainer(TrainConfig(dataset=str(tmp_path / "does-not-exist"), model="tinny"))


def test_fit_writes_the_run_directory_and_plot(tmp_path, corpus, tiny_run) -> None:
    pytest.importorskip("matplotlib")
    from transformer_xl import TransformerXLLM
    from transformer_xl.train.plot import plot_run

    cfg = tiny_run(max_step=6, save_interval=3, eval_interval=3, final_eval=True)
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
    assert {"train_info.json", "model.safetensors", "config.json"} <= set(
        json.loads((run / "best" / "MANIFEST.json").read_text())["files"])
    TransformerXLLM.from_pretrained(list_checkpoints(run / "checkpoints")[-1])
    png = plot_run(run, tmp_path / "curves.png")
    assert png.stat().st_size > 10_000


def test_bf16_autocast_trains_on_cpu(tmp_path, corpus, tiny_run) -> None:
    tr = Trainer(tiny_run(precision="bf16", max_step=2), corpus=corpus)
    for batch in tr.train_iter:
        out = tr.train_step(batch.input_ids, batch.targets)
        assert out["applied"] and math.isfinite(out["loss"])
        if tr.step == 2:
            break
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())  # master weights stay fp32


def test_a_fresh_run_refuses_an_existing_run_directory(tmp_path, corpus, tiny_run) -> None:
    Trainer(tiny_run(max_step=2), corpus=corpus).fit()
    with pytest.raises(ConfigError, match=r"already holds a run.*--resume"):
        Trainer(tiny_run(max_step=2), corpus=corpus)


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


@pytest.mark.parametrize("golden_file", ["golden_tiny_run.json", "golden_tiny_run_0.1.json"])
def test_golden_loss_curve(tmp_path, golden_file: str) -> None:
    """A tiny fixed run (dropout, adaptive softmax, batch chunks, warmup + cosine) reproduces the losses kept in
    ``tests/assets/golden_tiny_run.json``, and, with the dropout draws of the code before ``keep_mask``
    (``previous_draws``), those that txl 0.1.0 wrote before the 0.2 redesign (see that module).
    The tolerance absorbs other CPUs' float rounding, not a change of the computation."""
    golden = json.loads((Path(__file__).parents[1] / "assets" / golden_file).read_text())
    assert golden["config"] == GOLDEN_RUN
    with previous_draws() if "0.1" in golden_file else contextlib.nullcontext():
        got = golden_run(tmp_path)
    assert len(got["train_loss"]) == GOLDEN_RUN["max_step"] and len(got["valid_loss"]) == 2
    np.testing.assert_allclose(got["lr"], golden["lr"], rtol=1e-12)
    np.testing.assert_allclose(got["train_loss"], golden["train_loss"], rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(got["valid_loss"], golden["valid_loss"], rtol=2e-4, atol=2e-4)


def test_half_loss_trains_only_on_the_second_half(tmp_path, corpus) -> None:
    """``half_loss`` (paper Table 6, "Half"): the targets of a segment's first half get no gradient at all."""
    seen: list[torch.Tensor] = []
    trainer = Trainer(tiny_cfg(tmp_path / "h", half_loss=True, max_step=1, tgt_len=8, mem_len=8), corpus=corpus)
    forward = trainer.model.forward

    def spying(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.nll.register_hook(lambda g: seen.append(g.clone()))
        return out

    trainer.model.forward = spying
    batch = next(iter(trainer.train_iter))
    trainer.train_step(batch.input_ids, batch.targets)
    g = seen[0]  # [B, T]
    assert g.shape[1] == 8 and torch.all(g[:, :4] == 0) and torch.all(g[:, 4:] != 0)


def test_a_config_that_cannot_fit_is_refused_before_allocation(tmp_path, corpus, tiny_run) -> None:
    cfg = tiny_run(tgt_len=100_000_000, eval_tgt_len=6)
    with pytest.raises(ConfigError, match=r"training needs about .* GB .*\(--force tries anyway\)") as err:
        Trainer(cfg, corpus=corpus)
    assert "\n" not in str(err.value) and not Path(cfg.out_dir).exists()  # a refused fresh run leaves no trace
    with Trainer(tiny_run(), corpus=corpus) as tr:  # the refused run released the directory's lock
        assert tr.step == 0


def test_compile_unavailable_trains_eager_with_one_line(tmp_path, corpus, tiny_run, monkeypatch, capsys) -> None:
    from transformer_xl.train import compiling

    monkeypatch.setattr(compiling, "compile_unavailable", lambda device: "inductor needs a C++ compiler")
    tr = Trainer(tiny_run(compile=True, max_step=1), corpus=corpus)
    assert tr.forward_model is tr.model
    assert "--compile unavailable (inductor needs a C++ compiler); training eager" in capsys.readouterr().err
    tr.close()


class _OverflowAt(Trainer):
    """fp16 steps whose gradients overflow: the loss times 1e30 stays finite in fp32, its gradient does not in the
    fp16 products it flows back through (fp16's largest value is 65504)."""

    bad_calls: ClassVar[set[int]] = set()

    def loss_hook(self, loss):
        self._calls = getattr(self, "_calls", 0) + 1
        return loss * 1e30 if self._calls in self.bad_calls else loss


def test_fp16_overflow_steps_are_skipped_and_the_loss_scale_follows(tmp_path, corpus, tiny_run) -> None:
    """fp16 with its GradScaler, on the CPU as on CUDA: an overflowing step changes no weight, no optimizer moment,
    no schedule and no step count, is not counted as a non-finite step (the loss was finite), and halves the scale;
    ``growth_interval`` clean steps double it again."""
    tr = _OverflowAt(tiny_run(max_step=8, precision="fp16"), corpus=corpus)
    _OverflowAt.bad_calls = {2}
    assert tr.scaler is not None and tr.scaler.get_scale() == 2.0**16
    tr.scaler.set_growth_interval(2)
    batches = iter(tr.train_iter)

    def step() -> dict:
        batch = next(batches)
        return tr.train_step(batch.input_ids, batch.targets)

    assert step()["applied"] and tr.step == 1 and tr.scaler.state_dict()["_growth_tracker"] == 1
    params, moments = _params(tr), {k: v["exp_avg"].clone() for k, v in tr.optimizer.state.items()}
    lr = tr.optimizer.param_groups[0]["lr"]
    out = step()  # the overflow
    assert not out["applied"] and math.isfinite(out["loss"]) and not math.isfinite(out["grad_norm"])
    assert tr.step == 1 and tr.nonfinite_total == 0 and tr.optimizer.param_groups[0]["lr"] == lr
    assert all(torch.equal(v, params[k]) for k, v in _params(tr).items())
    assert all(torch.equal(v["exp_avg"], moments[k]) for k, v in tr.optimizer.state.items())
    assert tr.scaler.get_scale() == 2.0**15 and tr.scaler.state_dict()["_growth_tracker"] == 0
    assert step()["applied"] and tr.step == 2 and tr.scaler.get_scale() == 2.0**15
    assert step()["applied"] and tr.step == 3 and tr.scaler.get_scale() == 2.0**16  # two clean steps: doubled
    assert not any(torch.equal(v, params[k]) for k, v in _params(tr).items() if v.is_floating_point())


def test_each_start_records_the_device_precision_and_tf32(tmp_path, corpus, tiny_run) -> None:
    """metrics.jsonl says, at each start, what the figures were computed on: the device and its name, torch, the
    precision and whether fp32 products ran as TF32 (a setting of the process, not of the run's config)."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        cfg = tiny_run(max_step=2)
        Trainer(cfg, corpus=corpus).fit()
    finally:
        torch.set_float32_matmul_precision(before)
    records = [json.loads(ln) for ln in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    env = [r for r in records if r.get("event") == "environment"]
    assert len(env) == 1 and env[0]["step"] == 0
    assert env[0]["device"] == "cpu" and env[0]["precision"] == "fp32" and env[0]["torch"] == torch.__version__
    assert env[0]["cuda_matmul_tf32"] is True and env[0]["float32_matmul_precision"] == "high"
