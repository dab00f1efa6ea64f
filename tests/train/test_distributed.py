"""Multi-process training: ``torchrun --nproc_per_node 2`` (gloo, CPU) equals one process on the same global batch."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import subprocess_env
from tests.helpers import tiny_train_config as tiny_cfg

pytestmark = pytest.mark.integration


def _run(cmd: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *cmd], env=subprocess_env(tmp_path), capture_output=True, text=True,
                          timeout=180)


def _losses(run: Path) -> list[float]:
    return [r["train_loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
@pytest.mark.slow
def test_two_gloo_processes_equal_one_process(tmp_path, word_corpus) -> None:
    data = word_corpus
    # adaptive softmax (DDP with find_unused_parameters), memories, batch_chunk inside each process
    cfg = tiny_cfg(tmp_path / "x", dataset=str(data), max_step=4, batch_size=8, batch_chunk=2, cutoffs=[10, 25],
                   div_val=2, tie_projs=[False, True, True])
    for name in ("one", "two"):
        (tmp_path / f"{name}.json").write_text(dataclasses.replace(cfg, out_dir=str(tmp_path / name)).to_json())
    single = _run(["-m", "transformer_xl", "train", "--config", str(tmp_path / "one.json")], tmp_path)
    assert single.returncode == 0, single.stderr
    multi = _run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "transformer_xl",
                  "train", "--config", str(tmp_path / "two.json")], tmp_path)
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "config.json").read_text())["world_size"] == 2
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "two")), torch.tensor(_losses(tmp_path / "one")),
                               rtol=1e-6, atol=1e-6)
    step = "checkpoints/step_00000004"
    a, b = (load_file(str(tmp_path / n / step / "model.safetensors")) for n in ("one", "two"))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
    # the checkpoint holds the memories of the whole global batch, gathered in rank order
    sa, sb = (load_file(str(tmp_path / n / step / "train_state.safetensors")) for n in ("one", "two"))
    for k in (k for k in sa if k.startswith(".mems")):
        torch.testing.assert_close(sb[k], sa[k], rtol=1e-5, atol=1e-5, msg=k)


def test_unused_parameter_rule() -> None:
    from transformer_xl.model.config import TXLConfig
    from transformer_xl.train.distributed import has_step_local_parameters

    base = dict(n_token=60, n_layer=1, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=4, mem_len=4)
    assert not has_step_local_parameters(TXLConfig(**base))
    assert not has_step_local_parameters(TXLConfig(**base, cutoffs=[20, 40]))  # tail clusters: slices of one layer
    assert not has_step_local_parameters(TXLConfig(**base, sample_softmax=8))
    assert has_step_local_parameters(TXLConfig(**base, cutoffs=[20, 40], div_val=2))
    assert has_step_local_parameters(TXLConfig(**base, cutoffs=[20, 40], d_embed=32))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
@pytest.mark.parametrize("model", [dict(cutoffs=[10, 25]), dict(sample_softmax=8), dict(cutoffs=[10, 25], div_val=2)])
@pytest.mark.slow
def test_two_processes_print_no_ddp_warning(tmp_path, word_corpus, model) -> None:
    # rule False: DDP without the unused-parameter search must not fail (it would at the next step if a parameter
    # got no gradient); rule True: the search is on, and the only warning allowed is DDP's "found no unused
    # parameter" one for steps where every cluster happened to be used
    cfg = tiny_cfg(tmp_path / "run", dataset=str(word_corpus), max_step=6, batch_size=8)
    cfg = dataclasses.replace(cfg, model_overrides={**cfg.model_overrides, **model})
    (tmp_path / "c.json").write_text(cfg.to_json())
    multi = _run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "transformer_xl",
                  "train", "--config", str(tmp_path / "c.json")], tmp_path)
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert "broadcast_buffers" not in multi.stderr and "FutureWarning" not in multi.stderr, multi.stderr
    if "div_val" not in model:
        assert "find_unused_parameters" not in multi.stderr, multi.stderr


def test_a_failed_collective_becomes_one_line_naming_the_silent_rank(monkeypatch) -> None:
    from transformer_xl.train.distributed import Dist, RankLost

    d = Dist("cpu", timeout=5)
    with pytest.raises(RuntimeError, match="gloo"), d.guard(lambda: "step 3"):  # no group of its own: unchanged
        raise RuntimeError("[gloo/pair.cc:1] Connection closed by peer")
    d.owns_group, d.world_size = True, 2  # as under torchrun, rank 1 having written no report
    monkeypatch.setattr(d, "_silent_ranks", lambda where: [1])
    with pytest.raises(RankLost) as info, d.guard(lambda: "step 3"):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms "
                           "for recv operation to complete")
    assert str(info.value) == ("rank 0 of 2 at step 3: rank 1 did not answer (died or stalled); a collective failed "
                               "(Timed out waiting 5000ms for recv operation to complete); dist_timeout is 5 s")
    with pytest.raises(ValueError), d.guard(lambda: "step 3"):  # not a collective's error: unchanged
        raise ValueError("shape mismatch")
    with pytest.raises(RuntimeError, match="shape"), d.guard(lambda: "step 3"):
        raise RuntimeError("shape mismatch")
    d.owns_group = False


def test_an_unreachable_store_is_one_line(monkeypatch) -> None:
    """A worker whose rendezvous store does not answer ends with one RankLost line, not a traceback."""
    import socket

    from transformer_xl.train.distributed import Dist, RankLost

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in dict(WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(RankLost, match=rf"^rank 1 of 2 could not join the process group \(store 127.0.0.1:{port}\): "
                                       r".*; dist_timeout is 1 s$"):
        Dist("cpu", timeout=1)
    assert not torch.distributed.is_initialized()
