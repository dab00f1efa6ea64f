"""TransformerXLLM behaviour: batch-first API, functional memory, recurrence invariant, softmax variants."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import TINY, tiny_model
from tests.helpers import adaptive_model as _model
from tests.helpers import assert_same_outputs as _same_outputs
from transformer_xl import CheckpointError, ConfigError, TransformerXLLM, TXLConfig

V = TINY["n_token"]


def test_output_shapes_and_memories(tiny_model) -> None:
    model = tiny_model()
    x = torch.randint(0, V, (3, 4))
    out = model(x, targets=x, return_log_probs=True)
    assert out.nll.shape == (3, 4) and out.loss.shape == ()
    assert torch.allclose(out.loss, out.nll.mean())
    assert out.log_probs.shape == (3, 4, V)
    assert len(out.mems) == model.config.n_layer + 1
    assert all(m.shape == (3, 4, 16) and not m.requires_grad for m in out.mems)
    out2 = model(x, mems=out.mems)
    assert all(m.shape == (3, 6, 16) for m in out2.mems)  # capped at mem_len
    assert model.init_mems(5)[0].shape == (5, 0, 16)


def test_input_memories_are_not_mutated(tiny_model) -> None:
    for attn_type in range(4):
        model = tiny_model(attn_type=attn_type, mem_len=8, tgt_len=4)
        x = torch.randint(0, V, (2, 4))
        mems = model(x).mems
        copies = [m.clone() for m in mems]
        model(x, mems=mems)
        assert all(torch.equal(a, b) for a, b in zip(mems, copies)), attn_type


def _sliding_reference(model: TransformerXLLM, x: torch.Tensor, y: torch.Tensor, *, tgt_len: int,
                       mem_len: int) -> list[torch.Tensor]:
    """Per-segment nll where every layer's memory is the last ``mem_len`` positions of that layer's whole history.

    The oracle keeps all hidden states itself (a forward with an unbounded ``mem_len`` returns its input
    memories plus this segment's states) and slices the newest ``mem_len`` out of them: it never relies on the
    model's memory update trimming anything."""
    keep_all = model.config.lengths(mem_len=10**6)
    history: list[torch.Tensor] | None = None
    nlls = []
    for s in range(0, x.size(1), tgt_len):
        mems = None if history is None else [h[:, max(0, h.size(1) - mem_len):] for h in history]
        out = model(x[:, s:s + tgt_len], y[:, s:s + tgt_len], mems, lengths=keep_all)
        hids = [m[:, -tgt_len:] for m in out.mems]  # [B, Q, D]: this segment's states of every layer
        history = hids if history is None else [torch.cat([h, n], 1) for h, n in zip(history, hids)]
        nlls.append(out.nll)
    return nlls


def _segments(model: TransformerXLLM, x: torch.Tensor, y: torch.Tensor, tgt_len: int) -> list[torch.Tensor]:
    """The model's own recurrence: per-segment nll, memories carried by the model."""
    mems, parts = None, []
    for s in range(0, x.size(1), tgt_len):
        out = model(x[:, s:s + tgt_len], y[:, s:s + tgt_len], mems)
        mems = out.mems
        parts.append(out.nll)
    return parts


def _assert_every_segment(parts: list[torch.Tensor], reference: list[torch.Tensor], n: int) -> None:
    assert len(parts) == len(reference) == n
    for s, (part, ref) in enumerate(zip(parts, reference)):
        torch.testing.assert_close(part, ref, atol=1e-5, rtol=1e-5, msg=f"segment {s}")


@pytest.mark.parametrize("attn_type", [0, 1])
def test_recurrence_equals_full_context(attn_type: int, tiny_model) -> None:
    """Relative encodings: 3 segments with enough memory == one pass over the whole sequence; past that, every
    further segment equals the sliding-context reference (the memory keeps the newest positions)."""
    model = tiny_model(attn_type=attn_type, tgt_len=4, mem_len=12)
    seq = torch.randint(0, V, (2, 25))
    x, y = seq[:, :-1], seq[:, 1:]
    parts = _segments(model, x, y, 4)
    torch.testing.assert_close(torch.cat(parts[:3], 1), model(x[:, :12], y[:, :12]).nll, atol=1e-5, rtol=1e-5)
    _assert_every_segment(parts, _sliding_reference(model, x, y, tgt_len=4, mem_len=12), 6)


@pytest.mark.parametrize("attn_type", [0, 1])  # absolute encodings (2, 3) store memories with positions added
@pytest.mark.parametrize("mem_len", [4, 6])
def test_recurrence_with_limited_memory_equals_sliding_context(attn_type: int, mem_len: int, tiny_model) -> None:
    """With mem_len M, segment s sees exactly the M previous positions (per layer), nothing earlier: every
    segment equals the sliding-context reference."""
    model = tiny_model(attn_type=attn_type, tgt_len=4, mem_len=mem_len)
    seq = torch.randint(0, V, (2, 21))
    x, y = seq[:, :-1], seq[:, 1:]
    parts = _segments(model, x, y, 4)
    _assert_every_segment(parts, _sliding_reference(model, x, y, tgt_len=4, mem_len=mem_len), 5)
    joint = model(x[:, 0:12], y[:, 0:12]).nll[:, 8:]
    assert (parts[2] - joint).abs().max() > 1e-4  # segment 1 is out of reach of segment 3: not the full context


def test_ext_len_memory_ends_where_extended_context_begins(tiny_model) -> None:
    """Official ext_len: the last ext_len positions are re-read as context, so memory excludes them."""
    model = tiny_model(tgt_len=4, ext_len=2, mem_len=6)
    seq = torch.randint(0, V, (2, 11))
    out1 = model(seq[:, 0:4], seq[:, 1:5])
    assert out1.mems[0].size(1) == 2  # 4 positions, last 2 kept back for the next segment's context
    # next segment: ext context = positions 2..3, targets for positions 4..7
    out2 = model(seq[:, 2:8], seq[:, 5:9], out1.mems)
    assert out2.nll.shape == (2, 4)
    # all earlier positions in memory + the extended context form exactly the full history
    full = tiny_model(tgt_len=4, ext_len=2, mem_len=6)(seq[:, 0:8], seq[:, 1:9]).nll[:, 4:]
    torch.testing.assert_close(out2.nll, full, atol=1e-5, rtol=1e-5)


def test_mem_len_zero_has_no_memory(tiny_model) -> None:
    model = tiny_model(mem_len=0)
    x = torch.randint(0, V, (2, 4))
    out = model(x, x)
    assert out.mems == [] and model.init_mems(2) == []


def test_evaluation_lengths_are_an_argument(tiny_model) -> None:
    model = tiny_model(tgt_len=4, mem_len=4)
    lengths = model.config.lengths(mem_len=16, clamp_len=3, same_length=True)
    mems = None
    for _ in range(5):
        mems = model(torch.randint(0, V, (1, 4)), mems=mems, lengths=lengths).mems
    assert mems[0].size(1) == 16 and model.config.mem_len == 4  # the model is not changed
    assert model(torch.randint(0, V, (1, 4)), mems=mems).mems[0].size(1) == 4  # the config's lengths again
    with pytest.raises(ConfigError):
        model.config.lengths(mem_len=-1)


def test_bad_shapes_fail_clearly(tiny_model) -> None:
    model = tiny_model()
    with pytest.raises(ConfigError, match="batch, time"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ConfigError, match="targets"):
        model(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ConfigError, match="memory tensors"):
        model(torch.zeros(2, 4, dtype=torch.long), mems=[torch.zeros(2, 1, 16)])


def test_attn_type_3_too_long_segment_is_a_clear_error(tiny_model) -> None:
    model = tiny_model(attn_type=3, tgt_len=4, mem_len=2)
    with pytest.raises(ConfigError, match="learned 6 positions"):
        model(torch.zeros(1, 7, dtype=torch.long))


def test_tied_weights_share_storage(tiny_model) -> None:
    model = tiny_model(cutoffs=[10, 30], div_val=2, tie_projs=[False, True, True])
    assert model.crit.out_layers[1].weight is model.word_emb.emb_layers[1].weight
    assert model.crit.out_projs[1] is model.word_emb.emb_projs[1]
    assert model.crit.out_projs[0] is not model.word_emb.emb_projs[0]
    untied = tiny_model(tie_weight=False)
    assert untied.crit.out_layers[0].weight is not untied.word_emb.emb_layers[0].weight


def test_official_initialization_statistics() -> None:
    torch.manual_seed(0)
    cfg = TXLConfig(n_token=3000, n_layer=2, n_head=4, d_model=64, d_head=16, d_inner=256, cutoffs=[1000],
                    div_val=2, tie_weight=False)
    model = TransformerXLLM(cfg)
    qkv = model.layers[0].dec_attn.qkv_net.weight
    assert abs(qkv.std().item() - 0.02) < 0.002
    assert abs(model.word_emb.emb_projs[0].std().item() - 0.01) < 0.001
    assert abs(model.layers[0].pos_ff.layer_norm.weight.mean().item() - 1.0) < 0.01
    assert model.layers[0].pos_ff.CoreNet[0].bias.abs().max() == 0
    assert model.crit.out_layers[0].bias.abs().max() == 0
    assert model.crit.cluster_bias.abs().max() == 0
    uni = TransformerXLLM(TXLConfig(n_token=300, init="uniform", init_range=0.05))
    w = uni.layers[0].dec_attn.o_net.weight
    assert w.abs().max() <= 0.05 and w.abs().max() > 0.045


def test_dropout_only_in_training(tiny_model) -> None:
    model = tiny_model(dropout=0.5, dropatt=0.5)
    x = torch.randint(0, V, (2, 4))
    a, b = model(x, x).nll, model(x, x).nll
    assert torch.equal(a, b)
    model.train()
    assert not torch.equal(model(x, x).nll, model(x, x).nll)


def test_float64_model_keeps_float64_nll(tiny_model) -> None:
    model = tiny_model(cutoffs=[10, 30], div_val=2).double()
    x = torch.randint(0, V, (2, 4))
    out = model(x, x, return_log_probs=True)
    assert out.nll.dtype == torch.float64 and out.log_probs.dtype == torch.float64


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_save_load_round_trip(tmp_path, attn_type: int) -> None:
    model = _model(attn_type=attn_type)
    model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["MANIFEST.json", "config.json", "model.safetensors"]
    loaded = TransformerXLLM.from_pretrained(tmp_path / "m")
    assert loaded.config == model.config
    assert loaded.crit.out_layers[1].weight is loaded.word_emb.emb_layers[1].weight  # ties restored
    _same_outputs(model, loaded)


def test_from_pretrained_returns_the_model_in_eval_mode(tmp_path) -> None:
    model = _model(dropout=0.5, dropatt=0.5).train()
    model.save_pretrained(tmp_path)
    loaded = TransformerXLLM.from_pretrained(tmp_path)
    assert not any(m.training for m in loaded.modules())  # dropout off: two forwards agree
    x = torch.randint(0, 60, (2, 4), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(loaded(x, x).nll, loaded(x, x).nll, atol=0, rtol=0)
    assert all(m.training for m in loaded.train().modules())  # training it further is one call


@pytest.mark.parametrize("as_text", [False, True])
def test_save_pretrained_writes_the_vocabulary_in_the_manifest(tmp_path, as_text: bool) -> None:
    from transformer_xl.data import Vocab
    from transformer_xl.store.manifest import verify_manifest

    vocab = Vocab([f"w{i}" for i in range(60)], special=["w0"], eos="w0")
    _model().save_pretrained(tmp_path, vocab=vocab.to_json() if as_text else vocab)
    assert Vocab.load(tmp_path / "vocab.json").sha256() == vocab.sha256()
    assert set(verify_manifest(tmp_path, required=True)["files"]) == {"config.json", "model.safetensors", "vocab.json"}


def test_save_pretrained_refuses_a_vocabulary_of_another_size(tmp_path) -> None:
    from transformer_xl.data import Vocab

    with pytest.raises(ConfigError, match=r"^the vocabulary has 3 symbols but the model predicts n_token=60$"):
        _model().save_pretrained(tmp_path / "a", vocab=Vocab(["a", "b", "c"]))
    for text in ("[1, 2]", "{not json", '{"symbols": 3}'):
        with pytest.raises(ConfigError, match="not a txl vocabulary"):
            _model().save_pretrained(tmp_path / "b", vocab=text)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # refused before writing


def test_evaluation_lengths_leave_the_saved_config_alone(tmp_path) -> None:
    model = _model(attn_type=1)
    model(torch.zeros(1, 4, dtype=torch.long), lengths=model.config.lengths(mem_len=50))
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["mem_len"] == 4
    TransformerXLLM.from_pretrained(tmp_path)


def test_corrupt_or_missing_files_fail_clearly(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        TransformerXLLM.from_pretrained(tmp_path / "nope")
    model = _model()
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"model.safetensors does not match its SHA-256 .*100 bytes where"):
        TransformerXLLM.from_pretrained(tmp_path)
    for verify in (True, False):  # without a manifest, or not verified: the safetensors header is checked
        (tmp_path / "MANIFEST.json").unlink(missing_ok=True)
        with pytest.raises(CheckpointError, match="not a readable safetensors"):
            TransformerXLLM.from_pretrained(tmp_path, verify=verify)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        TransformerXLLM.from_pretrained(tmp_path)


def _edit_config(directory, **changes) -> None:
    """Change ``config.json`` of a saved model and drop the manifest (a hand-edited directory)."""
    cfg = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, **changes}))
    (directory / "MANIFEST.json").unlink(missing_ok=True)


def test_weights_that_do_not_fit_the_config(tmp_path) -> None:
    _model().save_pretrained(tmp_path)
    _edit_config(tmp_path, d_inner=64)
    with pytest.raises(CheckpointError, match=r"holds 6,974 parameters but its config \(n_token=60, d_model=16, "
                                              r"d_inner=64\) describes 9,086"):
        TransformerXLLM.from_pretrained(tmp_path)
    _edit_config(tmp_path, d_inner=32, n_head=4, d_head=4)  # as many parameters, other shapes
    with pytest.raises(CheckpointError, match=r"weights do not fit the config \(wrong shape: pos_enc.r_r_bias"):
        TransformerXLLM.from_pretrained(tmp_path)
    _edit_config(tmp_path, n_head=2, d_head=8, bogus=1)
    with pytest.raises(ConfigError, match="bogus"):
        TransformerXLLM.from_pretrained(tmp_path)


def test_a_changed_model_dir_is_refused_and_loads_with_verify_false(tmp_path) -> None:
    model = _model()
    model.save_pretrained(tmp_path)
    blob = bytearray((tmp_path / "model.safetensors").read_bytes())
    blob[-2] ^= 0x01  # a low mantissa bit of the last weight: finite, but not what was written
    (tmp_path / "model.safetensors").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=r"model\.safetensors does not match its SHA-256"):
        TransformerXLLM.from_pretrained(tmp_path)
    loaded = TransformerXLLM.from_pretrained(tmp_path, verify=False)
    changed = [k for k, v in loaded.state_dict().items() if not torch.equal(v, model.state_dict()[k])]
    assert changed == ["word_emb.emb_projs.2", "crit.out_projs.2"]  # one tied tensor, one value changed


def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path) -> None:
    model = _model()
    with torch.no_grad():
        model.layers[1].pos_ff.CoreNet[0].bias[3] = float("inf")
    model.save_pretrained(tmp_path)
    for verify in (True, False):
        with pytest.raises(CheckpointError, match=r"tensor 'layers.1.pos_ff.CoreNet.0.bias' holds non-finite"):
            TransformerXLLM.from_pretrained(tmp_path, verify=verify)


def test_a_non_float_tensor_is_refused_from_the_header(tmp_path) -> None:
    from transformer_xl.store.layout import save_model_dir

    model = _model()
    state = dict(model.state_dict())
    state["layers.0.pos_ff.layer_norm.bias"] = state["layers.0.pos_ff.layer_norm.bias"].long()
    save_model_dir(tmp_path, state, model.config.to_json())
    with pytest.raises(CheckpointError, match=r"'layers.0.pos_ff.layer_norm.bias' is stored as I64"):
        TransformerXLLM.from_pretrained(tmp_path)


_HUGE_PROBE = """
import resource, sys
from transformer_xl import TransformerXLLM, TXLError
for path in sys.argv[1:]:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        TransformerXLLM.from_pretrained(path)
    except TXLError as exc:
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, exc, sep="|")
"""


def test_a_config_far_larger_than_its_weights_is_refused_before_allocating(tmp_path) -> None:
    import subprocess
    import sys

    from tests.helpers import subprocess_env

    huge = [dict(n_layer=100000), dict(d_model=10**7), dict(n_token=10**9)]
    for i, changes in enumerate(huge):
        _model().save_pretrained(tmp_path / str(i))
        _edit_config(tmp_path / str(i), **changes)
    out = subprocess.run([sys.executable, "-c", _HUGE_PROBE, *(str(tmp_path / str(i)) for i in range(len(huge)))],
                         capture_output=True, text=True, env=subprocess_env(tmp_path), timeout=60, check=True).stdout
    lines = out.strip().split("\n")
    assert len(lines) == len(huge), out
    for line in lines:
        rss_kib, message = line.split("|")
        assert int(rss_kib) < 2**20, line  # ru_maxrss is in KiB on Linux: < 1 GiB more
        assert "the config does not belong to these weights" in message, line
    assert "holds the weights of 2 layers but its config says n_layer=100000" in lines[0]


@pytest.mark.parametrize("damage", ["truncate", "bit-flip"])
def test_from_pretrained_verifies_every_kind_of_model_dir(tmp_path, damage) -> None:
    from tests.helpers import damage_file, model_dirs

    model = _model(untie_r=False)
    for directory in model_dirs(tmp_path, model).values():
        _same_outputs(model, TransformerXLLM.from_pretrained(directory))
        damage_file(directory / "model.safetensors", damage)
        with pytest.raises(CheckpointError, match=r"model\.safetensors does not match its SHA-256"):
            TransformerXLLM.from_pretrained(directory)
        if damage == "bit-flip":
            TransformerXLLM.from_pretrained(directory, verify=False)


def test_generate_and_stream_methods_are_the_inference_functions() -> None:
    """Hugging Face's calling convention, model.generate(input_ids, max_new_tokens=...), over
    transformer_xl.inference.generate (the same ids, log-probabilities and memories)."""
    from tests.helpers import tiny_model
    from transformer_xl.inference.generate import GenerationOutput, generate, stream

    model = tiny_model(1)
    ids = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]])
    kw = dict(max_new_tokens=6, do_sample=True, top_k=5, seed=3)
    ours, ref = model.generate(ids, **kw), generate(model, ids, **kw)
    assert isinstance(ours, GenerationOutput) and ours.sequences.shape == (2, 11)
    torch.testing.assert_close(ours.sequences, ref.sequences, rtol=0, atol=0)
    torch.testing.assert_close(ours.log_probs, ref.log_probs, rtol=0, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(ours.mems, ref.mems, strict=True))
    steps = [s.tokens for s in model.stream(ids, **kw)]
    assert torch.equal(torch.stack(steps, 1), torch.stack([s.tokens for s in stream(model, ids, **kw)], 1))
    assert torch.equal(torch.stack(steps, 1), ours.new_tokens)
    assert model.generate(ids[0].tolist(), max_new_tokens=2).sequences.shape == (1, 7)


def _read(model: TransformerXLLM, ids: torch.Tensor, step: int, real: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probabilities of ``ids`` read ``step`` tokens at a time with the memory (and ``key_mask`` from ``real``)."""
    mems, mask, out = model.init_mems(ids.size(0)), torch.zeros(ids.size(0), 0, dtype=torch.bool), []
    for beg in range(0, ids.size(1), step):
        part = ids[:, beg:beg + step]
        key_mask = None if real is None else torch.cat([mask, real[:, beg:beg + step]], dim=1)
        res = model(part, mems=mems, key_mask=key_mask, return_log_probs=True)
        mems, mask = res.mems, res.mem_mask
        out.append(res.log_probs)
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("attn_type,same_length", [(0, False), (0, True), (1, False)])
@pytest.mark.parametrize("side,step", [("right", 3), ("right", 1), ("left", 7)])
def test_padded_rows_score_as_they_do_alone(tiny_model, attn_type, same_length, side, step) -> None:
    """A key mask (paper Sec. 3.2's memory per row): a shorter row padded on the right (read in segments, the memory
    keeping its real positions only) or on the left (one segment) gets the log-probabilities it gets alone."""
    model = tiny_model(attn_type=attn_type, same_length=same_length, clamp_len=4, mem_len=5)
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randint(0, 50, (1, 7), generator=gen), torch.randint(0, 50, (1, 4), generator=gen)
    real_b = torch.tensor([[True] * 4 + [False] * 3])
    if side == "left":
        real_b = real_b.flip(1)
    padded_b = torch.zeros(1, 7, dtype=torch.long)
    padded_b[real_b] = b[0]
    batch = _read(model, torch.cat([a, padded_b]), step, torch.cat([torch.ones(1, 7, dtype=torch.bool), real_b]))
    torch.testing.assert_close(batch[0], _read(model, a, step)[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(batch[1][real_b[0]], _read(model, b, step)[0], rtol=0, atol=1e-5)


def test_a_right_padded_row_continues_from_its_last_real_token(tiny_model) -> None:
    model = tiny_model(mem_len=5)
    b, nxt = torch.tensor([[3, 4, 5]]), torch.tensor([[6]])
    padded = torch.tensor([[3, 4, 5, 0, 0]])
    first = model(padded, mems=model.init_mems(1), key_mask=torch.tensor([[True] * 3 + [False] * 2]))
    assert first.mem_mask.tolist() == [[False, False, True, True, True]]
    then = model(nxt, mems=first.mems, key_mask=torch.cat([first.mem_mask, torch.ones(1, 1, dtype=torch.bool)], 1),
                 return_log_probs=True)
    alone = _read(model, torch.cat([b, nxt], 1), 4)[:, -1]
    torch.testing.assert_close(then.log_probs[:, 0], alone, rtol=0, atol=1e-5)


def test_a_key_mask_is_refused_where_it_cannot_hold(tiny_model) -> None:
    ids = torch.zeros(2, 3, dtype=torch.long)
    ok = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ConfigError, match="padding needs relative positions: attn_type 2"):
        tiny_model(attn_type=2)(ids, key_mask=ok)
    with pytest.raises(ConfigError, match="ext_len > 0"):
        tiny_model()(ids, key_mask=ok, lengths=tiny_model().config.lengths(ext_len=1))
    with pytest.raises(ConfigError, match=r"key_mask must be bool \[batch=2, memory \+ segment=3\]"):
        tiny_model()(ids, key_mask=ok[:, :2])


def test_tf_memory_starts_from_mem_len_zero_states() -> None:
    """tf_memory: no memory given is mem_len zero states (attended to, so not the same as an empty memory);
    init_mems gives them; a padded batch's key mask counts them as real keys."""
    model = tiny_model(0, tf_memory=True, mem_len=5)
    ids = torch.randint(0, model.config.n_token, (2, 7), generator=torch.Generator().manual_seed(0))
    zeros = [torch.zeros(2, 5, model.config.d_model) for _ in range(model.config.n_layer + 1)]
    with torch.no_grad():
        fresh = model(ids[:, :-1], ids[:, 1:])
        given = model(ids[:, :-1], ids[:, 1:], zeros)
        started = model(ids[:, :-1], ids[:, 1:], model.init_mems(2))
        padded = model(ids[:, :-1], ids[:, 1:], key_mask=torch.ones(2, 6, dtype=torch.bool))
        empty = model(ids[:, :-1], ids[:, 1:], [z[:, :0] for z in zeros])
    assert torch.equal(fresh.nll, given.nll) and torch.equal(fresh.nll, started.nll)
    assert torch.allclose(fresh.nll, padded.nll, atol=1e-6)
    assert not torch.allclose(fresh.nll, empty.nll)
    assert [m.shape[1] for m in fresh.mems] == [5] * (model.config.n_layer + 1)
