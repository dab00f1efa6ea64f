"""The TF-to-txl map on the checkpoint TensorFlow wrote (tests/assets/tf_tiny): TensorFlow's own losses (stored
beside it) reproduced without TensorFlow; the architecture read from names and shapes, and refused when it is not the
official code's. ``tests/equivalence/test_tf.py`` runs the official code itself on every released variant."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.interop.tf_files import segment_nll, tf_golden, tf_tiny
from transformer_xl.errors import CheckpointError
from transformer_xl.interop.tf import architecture, read_checkpoint, state_dict, tf_shapes
from transformer_xl.interop.tf_released import GENERIC_LENGTHS, lengths_for
from transformer_xl.model import TransformerXLLM


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tf_tiny(tmp_path_factory.mktemp("tf") / "tiny")


def test_the_converted_model_scores_every_token_as_tensorflow_did(tiny: Path) -> None:
    spec, want = tf_golden()
    ckpt = read_checkpoint(tiny, **lengths_for(None))
    model = TransformerXLLM(ckpt.config).eval()
    model.load_state_dict_strict(state_dict(ckpt))
    got = segment_nll(model, spec)
    assert np.abs(got - want).max() < 1e-5


def test_the_architecture_comes_from_the_names_and_shapes(tiny: Path) -> None:
    ckpt = read_checkpoint(tiny, **GENERIC_LENGTHS)
    cfg = ckpt.config
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner, cfg.n_token) == (2, 8, 2, 4, 16, 24)
    assert (cfg.div_val, cfg.cutoffs, cfg.tie_projs, cfg.untie_r) == (2, (8, 16), (False, True, True), True)
    assert cfg.layer_norm_epsilon == 1e-12 and cfg.tf_memory and cfg.tie_weight and ckpt.proj_same_dim
    assert {n.rsplit("/", 1)[-1] for n in ckpt.ignored} >= {"Adam", "Adam_1", "global_step", "beta1_power"}


def test_every_variable_the_map_reads_is_one_the_tf_code_makes(tiny: Path) -> None:
    """The TF variables of the config, as tf/model.py makes them, are exactly the checkpoint's model variables."""
    ckpt = read_checkpoint(tiny, **GENERIC_LENGTHS)
    model_vars = {n for n in ckpt.bundle.entries if n.startswith("transformer/") and n not in ckpt.ignored}
    assert set(tf_shapes(ckpt.config, ckpt.proj_same_dim)) == model_vars


def _shapes() -> dict[str, tuple[int, ...]]:
    from tests.interop.tf_files import TF_TINY
    from transformer_xl.interop.tensorbundle import TensorBundle, find_prefix

    return TensorBundle(find_prefix(TF_TINY)).shapes()


@pytest.mark.parametrize("case", ["missing", "shape", "unknown", "no-layers", "not-xl", "empty-cluster", "bias-rank"])
def test_what_is_not_the_official_architecture_is_refused_in_one_line(case: str) -> None:
    from transformer_xl.interop.tf import check_variables

    shapes = _shapes()
    if case == "missing":
        del shapes["transformer/layer_1/ff/LayerNorm/beta"]
        match = "lacks transformer/layer_1/ff/LayerNorm/beta"
    elif case == "shape":
        shapes["transformer/layer_1/rel_attn/o/kernel"] = (8, 9)
        match = r"layer_1/rel_attn/o/kernel has shape \[8, 9\]"
    elif case == "unknown":
        shapes["transformer/layer_0/rel_attn/gate/kernel"] = (8, 8)
        match = "does not make: an unknown architecture"
    elif case == "no-layers":
        shapes = {k: v for k, v in shapes.items() if "/layer_" not in k}
        match = "layers are"
    elif case == "empty-cluster":  # a cluster of width 0 would divide by zero reading div_val
        shapes["transformer/adaptive_embed/cutoff_1/lookup_table"] = (8, 0)
        match = r"cutoff_1/lookup_table has shape \[8, 0\]"
    elif case == "bias-rank":
        shapes["transformer/adaptive_softmax/cutoff_2/b"] = ()
        match = r"cutoff_2/b has shape \[\]"
    else:
        shapes = {"bert/embeddings/word_embeddings": (30, 8), "global_step": ()}
        match = "not a Transformer-XL of the official TF code"
    with pytest.raises(CheckpointError, match=match) as info:
        cfg, same = architecture(shapes, **GENERIC_LENGTHS)
        check_variables(shapes, tf_shapes(cfg, same))
    assert "\n" not in str(info.value)


def test_proj_same_dim_false_reads_as_identity_projections() -> None:
    """One Billion Word's layout: cluster 0 has d_embed == d_model and no projection in TF."""
    shapes = _shapes()
    for name in ("transformer/adaptive_embed/cutoff_0/proj_W", "transformer/adaptive_softmax/cutoff_0/proj"):
        del shapes[name]
    cfg, same = architecture(shapes, **GENERIC_LENGTHS)
    assert not same and cfg.tie_projs == (False, True, True)
    assert "transformer/adaptive_embed/cutoff_0/proj_W" not in tf_shapes(cfg, same)
