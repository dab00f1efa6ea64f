"""The sequence module over vectors: the language model's layers exactly, the GTrXL layers equal to the paper's
equations written out, episode resets exact (inside a segment and through the memory), one-step acting equal to the
segment forward, the stop-gradient, shapes refused in one line."""

from __future__ import annotations

import copy

import pytest
import torch

from transformer_xl import ConfigError, SequenceConfig, SequenceState, TransformerXLLM, TransformerXLSequence

D_IN = 3


def _model(seed: int = 0, **changes) -> TransformerXLSequence:
    torch.manual_seed(seed)
    cfg = SequenceConfig(**{**dict(d_in=D_IN, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, mem_len=4),
                            **changes})
    model = TransformerXLSequence(cfg).eval()
    with torch.no_grad():  # gates away from their near-identity start, so that the memory matters
        for gate in model.gates.modules():
            if getattr(gate, "bias", None) is not None:
                gate.bias.zero_()
    return model


def _x(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, D_IN, generator=torch.Generator().manual_seed(seed))


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _with_the_lms_layers(**changes) -> tuple[TransformerXLSequence, TransformerXLLM]:
    """A post-LN sequence module and a language model of its layers config with the same layers and position biases,
    the input projection the identity (so that the language model's embeddings are its inputs)."""
    seq = _model(reorder=False, gating="residual", d_in=16, window=False, **changes)
    lm = TransformerXLLM(seq.config.layers_config(n_token=11)).eval()
    state = {k: v for k, v in lm.state_dict().items() if k.startswith(("layers.", "pos_enc."))}
    assert seq.load_state_dict(state, strict=False).missing_keys == ["in_proj.weight", "in_proj.bias"]
    with torch.no_grad():
        seq.in_proj.weight.copy_(torch.eye(16))
        seq.in_proj.bias.zero_()
    return seq, lm


@pytest.mark.parametrize("grad,untie_r", [(False, False), (True, False), (False, True)])
def test_residual_without_reorder_is_the_language_models_layers(grad: bool, untie_r: bool) -> None:
    """Given the language model's embeddings as inputs (the input projection the identity), its layers and position
    biases (one ``u``, ``v`` per layer with untie_r): the same hidden states and memories, segment after segment
    (training path with grad, inference without)."""
    seq, lm = _with_the_lms_layers(untie_r=untie_r)
    ids = torch.randint(0, 11, (2, 15), generator=torch.Generator().manual_seed(3))
    mems, seq_state = None, None
    with torch.set_grad_enabled(grad):
        for seg in ids.split(5, dim=1):
            out = lm(seg, mems=mems)
            got = seq(lm.word_emb(seg), seq_state)
            _close(got.output.detach(), out.hidden)
            mems, seq_state = out.mems, got.state
            _close(seq_state.mems, torch.stack(mems[:-1], dim=1))  # every layer's input, the last mem_len steps
            assert seq_state.valid.all()
    assert not seq.gates  # the language model's layers: no gate


def test_in_training_the_dropout_draws_are_the_language_models() -> None:
    """In training, from the same seed, the same dropout masks in the same order (R's, the input's, the layers'):
    the language model's layer inputs and last layer output to float rounding, segment after segment (another
    mask would change them by far more)."""
    seq, lm = _with_the_lms_layers(dropout=0.3, dropatt=0.2)
    ids = torch.randint(0, 11, (2, 15), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # a first segment read in eval mode: both memories full (the same R table length)
        mems, state = lm(ids[:, :5]).mems, seq(lm.word_emb(ids[:, :5])).state
    lm.train()
    seq.train()
    for i, seg in enumerate(ids[:, 5:].split(5, dim=1)):
        emb = lm.word_emb(seg).detach()
        torch.manual_seed(10 + i)
        out = lm(seg, mems=mems)
        torch.manual_seed(10 + i)
        got = seq(emb, state)
        mems, state = out.mems, got.state
        # every layer's input, after dropout: to float rounding too (a unit in the last place on AVX2 kernels)
        torch.testing.assert_close(state.mems, torch.stack(mems[:-1], dim=1), rtol=1e-6, atol=1e-7)
        # the last layer's output (before the LM's own output dropout, which the sequence module leaves to its user):
        # to float rounding (a unit in the last place on AMX and AVX2 kernels); another mask changes it by far more
        torch.testing.assert_close(got.output[:, -4:].detach(), mems[-1], rtol=1e-6, atol=1e-7)
    torch.manual_seed(12)
    assert not torch.equal(seq(emb, state).output, seq.eval()(emb, state).output)  # dropout did run


def test_the_layers_config_carries_every_layer_field() -> None:
    cfg = SequenceConfig(d_in=3, n_layer=3, n_head=2, d_model=8, d_head=4, d_inner=24, dropout=0.25, dropatt=0.125,
                         mem_len=5, clamp_len=7, untie_r=True, init_std=0.05)
    txl = cfg.layers_config()
    for name in ("n_layer", "n_head", "d_model", "d_head", "d_inner", "dropout", "dropatt", "mem_len", "clamp_len",
                 "untie_r", "init_std"):
        assert getattr(txl, name) == getattr(cfg, name), name
    assert txl.pre_lnorm and txl.attn_type == 0 and txl.n_token == 1
    post_ln = SequenceConfig(d_in=3, reorder=False, gating="residual").layers_config(n_token=9)
    assert not post_ln.pre_lnorm and post_ln.n_token == 9


@pytest.mark.parametrize("gating", ["residual", "output", "highway", "sigmoid-tanh", "gru"])
def test_a_reset_inside_a_segment_equals_a_fresh_run(gating: str) -> None:
    model = _model(gating=gating)
    x = _x(2, 7)
    reset = torch.zeros(2, 7, dtype=torch.bool)
    reset[0, 3] = True
    with torch.no_grad():
        out = model(x, reset=reset).output
        fresh = model(x[:1, 3:]).output
        alone = model(x[1:]).output
    _close(out[0, 3:], fresh[0])  # row 0 after its boundary: as if the episode started there
    _close(out[1], alone[0])  # row 1: no boundary, untouched by row 0's
    with torch.no_grad():  # without the reset, the steps after t=3 do see the earlier ones
        assert not torch.allclose(model(x).output[0, 3:], fresh[0], atol=1e-4)


def test_a_reset_masks_the_memory_and_the_new_episode_carries_on_through_it() -> None:
    model = _model()
    x1, x2, x3 = _x(2, 5, seed=1), _x(2, 5, seed=2), _x(2, 5, seed=3)
    reset2 = torch.zeros(2, 5, dtype=torch.bool)
    reset2[1, 2] = True  # row 1's new episode starts at step 2 of the second segment
    with torch.no_grad():
        s1 = model(x1)
        o2 = model(x2, s1.state, reset2)
        o3 = model(x3, o2.state)
        f2 = model(x2[1:, 2:])  # row 1's episode from its start, fresh
        f3 = model(x3[1:], f2.state)
        r2 = model(x2[:1], SequenceState(s1.state.mems[:1], s1.state.valid[:1]))  # row 0 alone
    _close(o2.output[1, 2:], f2.output[0])  # through the memory: nothing before the boundary is read
    _close(o3.output[1], f3.output[0])  # and the memory it leaves holds the new episode's steps only
    _close(o2.output[0], r2.output[0])
    assert o2.state.valid[1].tolist() == [False, True, True, True] and o2.state.valid[0].all()


@pytest.mark.parametrize("reorder,gating", [(False, "residual"), (True, "gru"), (True, "highway")])
def test_one_step_acting_equals_the_segment_forward(reorder: bool, gating: str) -> None:
    model = _model(reorder=reorder, gating=gating)
    x = _x(2, 9)
    reset = torch.zeros(2, 9, dtype=torch.bool)
    reset[0, 4] = reset[1, 7] = True
    with torch.no_grad():
        whole = model(x[:, :3])  # a first segment, then the rest as one segment or step by step
        seg = model(x[:, 3:], whole.state, reset[:, 3:])
        state, steps = whole.state, []
        for t in range(3, 9):
            y, state = model.step(x[:, t], state, reset[:, t])
            steps.append(y)
    _close(torch.stack(steps, dim=1), seg.output)
    _close(state.mems, seg.state.mems)
    assert torch.equal(state.valid, seg.state.valid)
    with torch.no_grad():  # without the window a step of a segment sees more than mem_len steps back
        unlimited = TransformerXLSequence(model.config.__class__(**{**model.config.to_dict(), "window": False}))
        unlimited.load_state_dict(model.state_dict())
        assert not torch.allclose(unlimited(x[:, 3:], whole.state, reset[:, 3:]).output, seg.output, atol=1e-4)


def test_no_gradient_crosses_the_memory() -> None:
    model = _model().train()
    x1, x2 = _x(2, 5, seed=1).requires_grad_(), _x(2, 5, seed=2).requires_grad_()
    s1 = model(x1).state
    assert not s1.mems.requires_grad
    model(x2, s1).output.sum().backward()
    assert x1.grad is None
    assert x2.grad is not None and x2.grad.abs().sum() > 0


def test_the_state_has_fixed_shapes_and_the_inputs_are_not_modified() -> None:
    model = _model()
    state = model.init_state(2)
    assert state.mems.shape == (2, 2, 4, 16) and not state.valid.any()
    mems, valid = state.mems.clone(), state.valid.clone()
    with torch.no_grad():
        out = model(_x(2, 6), state)
    assert torch.equal(state.mems, mems) and torch.equal(state.valid, valid)
    assert out.output.shape == (2, 6, 16) and out.state.mems.shape == (2, 2, 4, 16) and out.state.valid.all()


def test_gates_start_near_the_identity_a_markov_model() -> None:
    """With the paper's positive gate bias every layer starts close to passing its input on: the output depends on
    the past much less than with the gates open."""
    x = _x(1, 6)

    def past_effect(model: TransformerXLSequence) -> float:
        with torch.no_grad():
            return (model(x).output[0, -1] - model(x[:, -1:]).output[0, -1]).abs().max().item()

    closed = TransformerXLSequence(_model().config.__class__(**{**_model().config.to_dict(), "gate_bias": 6.0}))
    assert past_effect(closed) < 0.1 * past_effect(_model())


@pytest.mark.parametrize("changes,message", [
    (dict(gating="lstm"), "gating must be one of residual, output, highway, sigmoid-tanh, gru, got 'lstm'"),
    (dict(gating="gru", reorder=False), "gating 'gru' needs reorder=True (the gated layers of GTrXL take the layer "
                                        "norm inside the residual branch)"),
    (dict(d_in=0), "d_in must be a positive integer, got 0"),
    (dict(n_head=0), "n_head must be a positive integer, got 0"),
    (dict(reorder="yes"), "reorder must be true or false, got 'yes'"),
    (dict(window=1), "window must be true or false, got 1"),
    (dict(gate_bias="2"), "gate_bias must be a number, got '2'"),
    (dict(gate_bias=True), "gate_bias must be a number, got True"),
])
def test_bad_configs_are_one_line_errors(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        SequenceConfig(**{"d_in": 3, **changes})
    assert str(info.value) == message
    assert SequenceConfig(d_in=3, gate_bias=1).gate_bias == 1  # an int is a number


def test_bad_inputs_are_one_line_errors() -> None:
    model = _model()
    bad = [
        (torch.zeros(2, 5), {}, "x must be [batch, time, d_in=3], got shape (2, 5)"),
        (torch.zeros(2, 5, 4), {}, "x must be [batch, time, d_in=3], got shape (2, 5, 4)"),
        (_x(2, 5), dict(reset=torch.zeros(2, 5)), "reset must be a bool tensor [batch=2, time=5], got torch.float32 "
                                                  "(2, 5)"),
        (_x(2, 5), dict(reset=torch.zeros(2, 4, dtype=torch.bool)), "reset must be a bool tensor [batch=2, time=5], "
                                                                    "got torch.bool (2, 4)"),
        (_x(2, 5), dict(state=SequenceState(torch.zeros(2, 3, 4, 16), torch.zeros(2, 4, dtype=torch.bool))),
         "state.mems must be [batch=2, n_layer=2, M, d_model=16], got shape (2, 3, 4, 16)"),
        (_x(2, 5), dict(state=SequenceState(torch.zeros(2, 2, 4, 8), torch.zeros(2, 4, dtype=torch.bool))),
         "state.mems must be [batch=2, n_layer=2, M, d_model=16], got shape (2, 2, 4, 8)"),
        (_x(2, 5), dict(state=SequenceState(torch.zeros(2, 2, 4, 16), torch.zeros(2, 4))),
         "state.valid must be a bool tensor [batch=2, M=4], got torch.float32 (2, 4)"),
        (_x(2, 5), dict(state=SequenceState(torch.zeros(2, 2, 4, 16), torch.zeros(2, 3, dtype=torch.bool))),
         "state.valid must be a bool tensor [batch=2, M=4], got torch.bool (2, 3)"),
    ]
    for x, kwargs, message in bad:
        with pytest.raises(ConfigError) as info:
            model(x, **kwargs)
        assert str(info.value) == message


def test_the_state_and_the_computation_follow_the_models_device_and_dtype() -> None:
    """On another device (``meta`` stands for an accelerator here) the fresh state, the default reset and the
    position table are made there; in float64 and bfloat16 the output is float32's, in that type."""
    meta = _model().to("meta")
    state = meta.init_state(2)
    assert state.mems.device.type == state.valid.device.type == "meta"
    out = meta(torch.zeros(2, 5, D_IN, device="meta"))  # no reset given: made on x's device
    assert out.output.device.type == out.state.valid.device.type == "meta"
    x = _x(2, 5)
    with torch.no_grad():
        ref = _model()(x).output
        for dtype, tol in ((torch.float64, 1e-6), (torch.bfloat16, 5e-2)):
            got = _model().to(dtype)(x.to(dtype)).output
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), ref, rtol=0, atol=tol)


def test_a_step_without_reset_continues_the_episode() -> None:
    model = _model()
    x = _x(2, 4)
    with torch.no_grad():
        seg = model(x)
        y, state = model.step(x[:, 0])
        for t in range(1, 4):
            y, state = model.step(x[:, t], state)
    _close(y, seg.output[:, -1])
    _close(state.mems, seg.state.mems)


def test_the_layers_start_as_the_language_models() -> None:
    """N(0, init_std) weights, zero biases, ``u`` and ``v`` N(0, init_std) in the layers; the gate biases at
    gate_bias."""
    torch.manual_seed(0)
    model = TransformerXLSequence(SequenceConfig(d_in=3, n_layer=2, d_model=64, d_inner=256, init_std=0.05,
                                                 gate_bias=1.5))
    weights = torch.cat([m.weight.flatten() for m in model.layers.modules() if isinstance(m, torch.nn.Linear)])
    biases = [m.bias for m in model.layers.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert biases and not torch.cat(biases).any()
    assert abs(weights.std().item() - 0.05) < 0.002 and abs(weights.mean().item()) < 0.002
    for bias in (model.pos_enc.r_w_bias, model.pos_enc.r_r_bias):
        assert 0.03 < bias.std().item() < 0.07
    assert all(torch.equal(g.bias, torch.full((64,), 1.5)) for pair in model.gates for g in pair)


def test_config_round_trips() -> None:
    cfg = SequenceConfig(d_in=5, gating="highway", gate_bias=1.5)
    assert SequenceConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown SequenceConfig field 'mem_length' \\(did you mean 'mem_len'"):
        SequenceConfig.from_dict({**cfg.to_dict(), "mem_length": 3})


def _layer_norm(ln: torch.nn.LayerNorm, h: torch.Tensor) -> torch.Tensor:
    """``LN(h)``: normalised over the features (biased variance), then ``ln``'s own scale and shift."""
    mean = h.mean(-1, keepdim=True)
    var = ((h - mean) ** 2).mean(-1, keepdim=True)
    return (h - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def _paper_gate(gate: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``g(x, y)`` (paper Sec. 3.2) from the gate's weights: the GRU-type gate, or the residual ``x + y``."""
    if gate.gating == "residual":
        return x + y
    assert gate.gating == "gru"
    d = x.size(-1)
    w_r, w_z, w_g = gate.w.weight.split(d)
    u_r, u_z = gate.u.weight.split(d)
    r = torch.sigmoid(y @ w_r.T + x @ u_r.T)
    z = torch.sigmoid(y @ w_z.T + x @ u_z.T - gate.bias)
    h = torch.tanh(y @ w_g.T + (r * x) @ gate.u_g.weight.T)
    return (1 - z) * x + z * h


def _gtrxl(model: TransformerXLSequence, x: torch.Tensor, mems: torch.Tensor, seg: object,
           relu: bool = True) -> torch.Tensor:
    """GTrXL's forward written out from the model's weights (Parisotto et al., 2020, Sec. 3.2: identity map
    reordering and gating), layer after layer from ``E = W x + b``, with ``M`` the layer's memory:

        Y_bar = RelMHA(LN([SG(M), E]))        Y     = g_MHA(E, ReLU(Y_bar))
        E_bar = f(LN(Y))                      E_out = g_MLP(Y, ReLU(E_bar))

    ``f`` the feed-forward ``W_2 ReLU(W_1 . + b_1) + b_2``. Only RelMHA (relative scores, masked softmax, values,
    output projection) is the model's own attention, run on the normalised inputs with its layer norm off."""
    act = torch.relu if relu else (lambda t: t)
    e = x @ model.in_proj.weight.T + model.in_proj.bias
    for i, layer in enumerate(model.layers):
        g_mha, g_mlp = model.gates[i]
        rel_mha = copy.deepcopy(layer.dec_attn)
        rel_mha.pre_lnorm = False  # the attention alone: the layer norm is written out here
        ln_mha, ln_mlp = layer.dec_attn.layer_norm, layer.pos_ff.layer_norm
        y_bar = rel_mha.branch(_layer_norm(ln_mha, e), _layer_norm(ln_mha, mems[:, i]), seg)
        y = _paper_gate(g_mha, e, act(y_bar))
        lin1, lin2 = layer.pos_ff.CoreNet[0], layer.pos_ff.CoreNet[3]
        e_bar = torch.relu(_layer_norm(ln_mlp, y) @ lin1.weight.T + lin1.bias) @ lin2.weight.T + lin2.bias
        e = _paper_gate(g_mlp, y, act(e_bar))
    return e


@pytest.mark.parametrize("gating", ["gru", "residual"])
def test_the_gtrxl_layers_are_the_papers_equations(gating: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward of a reordered (GTrXL) model equals the paper's equations written out in :func:`_gtrxl`, on a
    second segment (a memory of valid steps) with a reset: the layer norm inside each branch (on the memory too), a
    ReLU on each branch's output before the gate, each gate ``g(stream, branch)``. With the residual gating the ReLU
    is still applied (the reordered residual model is not plain pre-LN)."""
    model = _model(gating=gating, init_std=0.3)
    with torch.no_grad():  # layer norms with their own scale and shift, gate biases of mixed signs
        for name, p in model.named_parameters():
            if "layer_norm" in name or (name.startswith("gates.") and name.endswith(".bias")):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    reset = torch.zeros(2, 5, dtype=torch.bool)
    reset[1, 2] = True
    segments = []  # the Segment (mask, relative positions) each layer gets, for the written-out forward's RelMHA
    layer_fn = model._layer

    def spy(i: int, layer: torch.nn.Module, h: torch.Tensor, mem: torch.Tensor, seg: object) -> torch.Tensor:
        segments.append(seg)
        return layer_fn(i, layer, h, mem, seg)

    monkeypatch.setattr(model, "_layer", spy)
    with torch.no_grad():
        state = model(_x(2, 5, seed=1)).state
        segments.clear()
        got = model(_x(2, 5, seed=2), state, reset).output
        assert len(segments) == 2 and segments[0] is segments[1]  # the segment's mask and positions
        want = _gtrxl(model, _x(2, 5, seed=2), state.mems, segments[0])
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        # the ReLUs matter here: without them the output is far from the model's
        assert (got - _gtrxl(model, _x(2, 5, seed=2), state.mems, segments[0], relu=False)).abs().max() > 1e-2
