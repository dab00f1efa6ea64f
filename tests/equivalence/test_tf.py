"""txl against the official TensorFlow code (``tf/model.py``, run as it is by ``tests/equivalence/tf_oracle.py`` in
``.venv-tf``): every variant the paper's four released checkpoints use is built by that code, given random weights,
saved by its own ``tf.train.Saver`` and evaluated over several segments with memory; ``txl convert --from tf`` then
turns the checkpoint into a txl model whose per-token log-likelihoods must equal TensorFlow's to 1e-5, and the
official PyTorch code's (the test-only oracle of ``official_oracle.py``) where it expresses the variant.

Run by ``make test-tf`` (which builds ``.venv-tf`` and sets ``TXL_REQUIRE_TF=1``: none of these may skip there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.equivalence import official_oracle
from tests.helpers import REPO
from tests.interop.tf_files import segment_nll
from transformer_xl import TransformerXLLM
from transformer_xl.cli import main
from transformer_xl.interop.official import to_official

pytestmark = pytest.mark.tf

TF_PYTHON = Path(os.environ.get("TXL_TF_PYTHON") or REPO / ".venv-tf" / "bin" / "python")
DRIVER = REPO / "tests" / "equivalence" / "tf_oracle.py"
TOL = 1e-5

_BASE = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=8, tgt_len=5, segments=3,
             init_std=0.02)
#: One variant per released model (and the options the paper evaluates them with), at tiny sizes.
VARIANTS = {
    # enwik8/text8: div_val 1, no cutoffs, tied softmax, shared r biases; same_length and clamp_len at evaluation
    "char": dict(n_token=30, d_embed=16, cutoffs=[], div_val=1, tie_projs=[False], proj_same_dim=True,
                 untie_r=False, same_length=True, clamp_len=6),
    # the same without same_length and clamp_len: the official PyTorch code computes it too
    "char-plain": dict(n_token=30, d_embed=16, cutoffs=[], div_val=1, tie_projs=[False], proj_same_dim=True,
                       untie_r=False, same_length=False, clamp_len=-1),
    # WikiText-103: div_val 4 (here 2), cutoffs, projections tied but the first (proj_share_all_but_first), untie_r
    "wt103": dict(n_token=60, d_embed=16, cutoffs=[20, 40], div_val=2, tie_projs=[False, True, True],
                  proj_same_dim=True, untie_r=True, same_length=True, clamp_len=6),
    # One Billion Word: div_val 4 (here 2), proj_same_dim False, no projection tied, untie_r, no clamp_len
    "lm1b": dict(n_token=60, d_embed=16, cutoffs=[20, 40], div_val=2, tie_projs=[False, False, False],
                 proj_same_dim=False, untie_r=True, same_length=True, clamp_len=-1),
    # div_val 1 with cutoffs and d_embed < d_model (the TF base scripts' adaptive softmax over one table)
    "adaptive-one-table": dict(n_token=60, d_embed=12, cutoffs=[20, 40], div_val=1, tie_projs=[False, True, False],
                               proj_same_dim=True, untie_r=True, same_length=False, clamp_len=4),
}


def _spec(name: str, seed: int) -> dict:
    spec = {**_BASE, **VARIANTS[name], "name": name, "seed": seed}
    rng = np.random.default_rng(seed)
    spec["ids"] = rng.integers(0, spec["n_token"], size=(spec["segments"] * spec["tgt_len"] + 1, 3)).tolist()
    return spec


@pytest.fixture(scope="module")
def tf_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every variant built, saved and evaluated by the official TF code, in one process of ``.venv-tf``."""
    if not TF_PYTHON.is_file():
        if os.environ.get("TXL_REQUIRE_TF"):
            pytest.fail(f"TXL_REQUIRE_TF is set but {TF_PYTHON} does not exist (make test-tf builds it)")
        pytest.skip(f"the TensorFlow oracle's environment is not built ({TF_PYTHON}; make test-tf)")
    root = tmp_path_factory.mktemp("tf")
    specs = [_spec(name, seed) for seed, name in enumerate(VARIANTS)]
    (root / "specs.json").write_text(json.dumps(specs))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_"))}
    proc = subprocess.run([str(TF_PYTHON), str(DRIVER), str(root / "specs.json"), str(root)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def _convert(run: Path, out: Path) -> TransformerXLLM:
    assert main(["convert", "--from", "tf", str(run / "model"), "--out", str(out)]) == 0
    return TransformerXLLM.from_pretrained(out)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_converted_checkpoint_scores_every_token_as_the_official_tf_code(tf_runs: Path, tmp_path: Path,
                                                                          name: str) -> None:
    run = tf_runs / name
    spec = next(s for s in json.loads((tf_runs / "specs.json").read_text()) if s["name"] == name)
    want = np.array(json.loads((run / "nll.json").read_text())["nll"])  # [n_seg, tgt_len, bsz]
    model = _convert(run, tmp_path / "txl")
    cfg = model.config
    assert (cfg.untie_r, cfg.div_val, list(cfg.cutoffs)) == (spec["untie_r"], spec["div_val"], spec["cutoffs"])
    assert cfg.tf_memory and cfg.layer_norm_epsilon == 1e-12
    got = segment_nll(model, spec)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < TOL, f"{name}: max |txl - tf| = {np.abs(got - want).max():.2e}"


def test_the_official_pytorch_code_agrees_where_it_expresses_the_variant(tf_runs: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """No same_length (the two codes' windows differ by one key): given TF's zero first memory and LayerNorm
    epsilon, the official PyTorch code's losses equal TensorFlow's."""
    spec = next(s for s in json.loads((tf_runs / "specs.json").read_text()) if s["name"] == "char-plain")
    want = np.array(json.loads((tf_runs / "char-plain" / "nll.json").read_text())["nll"])
    model = _convert(tf_runs / "char-plain", tmp_path / "txl")
    as_pytorch = TransformerXLLM(model.config.replace(layer_norm_epsilon=1e-5, tf_memory=False))
    as_pytorch.load_state_dict(model.state_dict())  # the same weights, for the export's kwargs and names
    kwargs, state = to_official(as_pytorch)
    monkeypatch.setattr(official_oracle, "LN_EPS", 1e-12)  # and TF's epsilon and first memory given to the oracle
    kwargs.update(mem_len=spec["mem_len"], clamp_len=spec["clamp_len"], same_length=spec["same_length"])
    oracle = official_oracle.OfficialOracle(kwargs, state)
    ids = torch.tensor(spec["ids"])  # [N, B]
    t, bsz = spec["tgt_len"], ids.size(1)
    mems = [torch.zeros(spec["mem_len"], bsz, spec["d_model"]) for _ in range(spec["n_layer"] + 1)]
    got = []
    with torch.no_grad():
        for s in range(spec["segments"]):
            loss, mems = oracle(ids[s * t:(s + 1) * t], ids[s * t + 1:(s + 1) * t + 1], mems)
            got.append(loss.numpy())
    assert np.abs(np.array(got) - want).max() < TOL


def test_txl_with_the_pytorch_conventions_differs_from_tf_where_they_differ(tf_runs: Path, tmp_path: Path) -> None:
    """The TF options are not decoration: without tf_memory (an empty first memory, PyTorch's same_length window)
    the same weights score the first segment and the windowed queries differently."""
    spec = next(s for s in json.loads((tf_runs / "specs.json").read_text()) if s["name"] == "char")
    want = np.array(json.loads((tf_runs / "char" / "nll.json").read_text())["nll"])
    model = _convert(tf_runs / "char", tmp_path / "txl")
    pytorch_like = TransformerXLLM(model.config.replace(tf_memory=False)).eval()
    pytorch_like.load_state_dict(model.state_dict())
    assert np.abs(segment_nll(pytorch_like, spec) - want).max() > 1e-3


def test_the_driver_runs_the_official_code_as_it_is() -> None:
    """The oracle imports the official model.py unmodified (its sha256 as ``shared/oracle/README.md`` lists it)."""
    import hashlib

    if not TF_PYTHON.is_file() and not os.environ.get("TXL_REQUIRE_TF"):
        pytest.skip("the TensorFlow oracle's environment is not built")
    sys.path.insert(0, str(DRIVER.parent))
    path = Path(os.environ.get("TXL_TF_ORACLE") or REPO.parent / "shared" / "oracle" / "transformer-xl-tf") / \
        "model.py"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == \
        "0dbd44a6c1fd204cc9d3b921663de52278baebcc7f2fc815a3bef84263bcfc65"
