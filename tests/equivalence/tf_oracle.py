"""Test-only driver of the official TensorFlow Transformer-XL (``tf/model.py`` of kimiyoung/transformer-xl, commit
44781ed), run as it is under TensorFlow 2's v1 compatibility layer. It runs in an environment of its own
(``.venv-tf``: ``tensorflow-cpu`` and ``tf-keras``, no torch), as a subprocess of the tests:

    .venv-tf/bin/python tests/equivalence/tf_oracle.py SPEC.json OUT_DIR   (SPEC.json: a spec, or a list of named specs)

It builds the official graph for the variant ``SPEC.json`` describes, gives every variable random values (biases,
LayerNorms and the softmax's cluster parameters included, which the official initializers leave at 0 or 1), saves
them with the code's own ``tf.train.Saver`` (with an Adam optimizer's slots and ``global_step`` beside them, as a
training run leaves them) into ``OUT_DIR/model/``, then evaluates ``SPEC["segments"]`` segments of the token stream
``SPEC["ids"]`` ``[n_seg * tgt_len + 1, bsz]`` with the memory carried over, as the official ``train_gpu.py``
evaluation does (the memory starts as ``mem_len`` zero vectors). It writes the per-token negative log-likelihoods
``[n_seg, tgt_len, bsz]`` to ``OUT_DIR/nll.json``.

What TensorFlow 2 removed is shimmed, each shim listed here and checked in :func:`check_shims`:

* ``tf``: the module's name ``tf`` is bound to ``tf.compat.v1`` (graph mode, ``disable_eager_execution``);
* ``tf.contrib.layers.layer_norm``: variable scope ``LayerNorm``, ``beta`` (zeros) and ``gamma`` (ones) of shape
  ``[d]``, normalization over the last axis with TF 1's epsilon 1e-12 added to the variance
  (``tf.nn.moments`` then ``tf.nn.batch_normalization``, as TF 1's ``layer_norm`` computes it);
* the per-token losses: ``mask_adaptive_logsoftmax`` is called with ``return_mean=False`` (its own argument), the
  losses it computes before its mean.

The official code is imported from ``$TXL_TF_ORACLE`` (default: ``shared/oracle/transformer-xl-tf`` beside the
repository); it is never copied into txl.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.compat.v1.layers needs Keras 2 (tf-keras)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf2

tf1 = tf2.compat.v1
LN_EPS = 1e-12  # TF 1's tf.contrib.layers.layer_norm


def oracle_dir() -> Path:
    repo = Path(__file__).resolve().parents[2]
    return Path(os.environ.get("TXL_TF_ORACLE") or repo.parent / "shared" / "oracle" / "transformer-xl-tf")


def layer_norm(inputs, begin_norm_axis=-1, **_):
    """TF 1's ``tf.contrib.layers.layer_norm`` over the last axis (the only use in model.py)."""
    assert begin_norm_axis == -1
    with tf1.variable_scope("LayerNorm"):
        d = inputs.shape[-1]
        beta = tf1.get_variable("beta", [d], initializer=tf1.zeros_initializer())
        gamma = tf1.get_variable("gamma", [d], initializer=tf1.ones_initializer())
        mean, variance = tf1.nn.moments(inputs, [-1], keep_dims=True)
        return tf1.nn.batch_normalization(inputs, mean, variance, offset=beta, scale=gamma, variance_epsilon=LN_EPS)


class _V1:
    """``tf.compat.v1`` with ``contrib.layers.layer_norm`` added."""

    contrib = type("contrib", (), {"layers": type("layers", (), {"layer_norm": staticmethod(layer_norm)})})

    def __getattr__(self, name):
        return getattr(tf1, name)


def load_model_module():
    path = oracle_dir() / "model.py"
    if not path.is_file():
        sys.exit(f"tf_oracle: the official TensorFlow model.py is not at {path} (set TXL_TF_ORACLE)")
    spec = importlib.util.spec_from_file_location("official_tf_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.tf = _V1()  # the code's `tf` is TF 1's namespace
    mod.mask_adaptive_logsoftmax = functools.partial(mod.mask_adaptive_logsoftmax, return_mean=False)
    return mod


def check_shims() -> None:
    """The layer_norm shim against TF 1's formula written out in numpy: (x - mean) / sqrt(var + 1e-12) * g + b."""
    g = tf1.Graph()
    with g.as_default(), tf1.Session(graph=g) as sess:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(3, 4, 6)).astype(np.float32)
        with tf1.variable_scope("check"):
            y = layer_norm(tf1.constant(x))
        sess.run(tf1.global_variables_initializer())
        gamma = rng.normal(size=6).astype(np.float32)
        beta = rng.normal(size=6).astype(np.float32)
        names = {v.name: v for v in tf1.global_variables()}
        names["check/LayerNorm/gamma:0"].load(gamma, sess)
        names["check/LayerNorm/beta:0"].load(beta, sess)
        got = sess.run(y)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + LN_EPS) * gamma + beta
    assert np.abs(got - want).max() < 1e-5, np.abs(got - want).max()
    assert sorted(names) == ["check/LayerNorm/beta:0", "check/LayerNorm/gamma:0"], sorted(names)


def run(spec: dict, out: Path) -> None:
    mod = load_model_module()
    check_shims()
    tf1.disable_eager_execution()
    tf1.reset_default_graph()
    tf1.set_random_seed(spec.get("seed", 0))
    ids = np.asarray(spec["ids"], dtype=np.int32)  # [n_seg * tgt_len + 1, bsz]
    tgt_len, mem_len, n_seg = spec["tgt_len"], spec["mem_len"], spec["segments"]
    bsz, d_model, n_layer = ids.shape[1], spec["d_model"], spec["n_layer"]
    inp = tf1.placeholder(tf1.int32, [None, bsz])
    tgt = tf1.placeholder(tf1.int32, [None, bsz])
    mems = [tf1.placeholder(tf1.float32, [None, bsz, d_model]) for _ in range(n_layer)]
    init = tf1.initializers.random_normal(stddev=spec.get("init_std", 0.02), seed=spec.get("seed", 0))
    nll, new_mems = mod.transformer(
        dec_inp=inp, target=tgt, mems=mems, n_token=spec["n_token"], n_layer=n_layer, d_model=d_model,
        d_embed=spec["d_embed"], n_head=spec["n_head"], d_head=spec["d_head"], d_inner=spec["d_inner"],
        dropout=0.0, dropatt=0.0, initializer=init, is_training=False, mem_len=mem_len,
        cutoffs=list(spec["cutoffs"]), div_val=spec["div_val"], tie_projs=list(spec["tie_projs"]),
        same_length=spec["same_length"], clamp_len=spec["clamp_len"], use_tpu=False,
        untie_r=spec["untie_r"], proj_same_dim=spec["proj_same_dim"])
    model_vars = tf1.trainable_variables()
    step = tf1.train.get_or_create_global_step()
    train_op = tf1.train.AdamOptimizer(1e-3).minimize(tf1.reduce_mean(nll), global_step=step)
    del train_op  # only its slots are wanted in the checkpoint: never run
    rng = np.random.default_rng(spec.get("seed", 0))
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for v in model_vars:  # every variable random, so that no zero bias or unit gain hides a wrong map
            shape = v.shape.as_list()
            scale = 0.3 if "LayerNorm" in v.name or "bias" in v.name or v.name.endswith(("/b:0", "cluster_b:0")) \
                else 1.0 / np.sqrt(shape[0] if len(shape) > 1 else 8)
            value = rng.normal(size=shape) * scale
            if v.name.endswith("gamma:0"):
                value += 1.0
            v.load(value.astype(np.float32), sess)
        saver = tf1.train.Saver()
        (out / "model").mkdir(parents=True, exist_ok=True)
        saver.save(sess, str(out / "model" / "model.ckpt"), global_step=0)
        state = [np.zeros([mem_len, bsz, d_model], np.float32) for _ in range(n_layer)]
        losses = []
        for s in range(n_seg):
            feed = {inp: ids[s * tgt_len:(s + 1) * tgt_len], tgt: ids[s * tgt_len + 1:(s + 1) * tgt_len + 1]}
            feed.update(dict(zip(mems, state)))
            loss, state = sess.run([nll, new_mems], feed_dict=feed)
            losses.append(loss.tolist())
    (out / "nll.json").write_text(json.dumps({"nll": losses, "variables": {v.name: v.shape.as_list()
                                                                            for v in model_vars}}))


if __name__ == "__main__":
    specs = json.loads(Path(sys.argv[1]).read_text())  # one spec, or a list of them (each written to OUT/<name>)
    for one in specs if isinstance(specs, list) else [specs]:
        run(one, Path(sys.argv[2]) / one["name"] if isinstance(specs, list) else Path(sys.argv[2]))
