"""The captured decode step against the plain one: tokens and log-probabilities (1e-5, fp32), the memories it
returns, branches, interleaved streams, the ring's wrap-around, narrower types, and bad input."""

from __future__ import annotations

import copy
import json
import math
import mmap
import os
from pathlib import Path

import pytest
import torch

from tests.helpers import generation_model
from transformer_xl import ConfigError, TransformerXLLM
from transformer_xl.inference.arena import HUGE_PAGE
from transformer_xl.inference.captured import CapturedDecoder, CaptureOptions
from transformer_xl.inference.generate import _decoder, generate, reference_generate, stream
from transformer_xl.model import Recurrence, native
from transformer_xl.model.int8 import quantize_rows

V = 40


def _model(seed: int = 0, **overrides) -> TransformerXLLM:
    return generation_model(seed, train=False, n_token=V, **overrides)


def _prompt(b: int = 2, p: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, p), generator=torch.Generator().manual_seed(seed))


def _eager(model: TransformerXLLM, batch: int = 2, **kw) -> CapturedDecoder:
    return CapturedDecoder(model, batch=batch, compile=False, **kw)


@pytest.mark.parametrize("overrides", [
    {},
    {"cutoffs": [10, 25], "div_val": 2, "tie_projs": [False, True, True]},  # projected clusters, one per cluster
    {"cutoffs": [10, 25]},  # the clusters fused into one matrix
    {"pre_lnorm": True, "untie_r": True, "clamp_len": 3},
    {"same_length": True},
])
@pytest.mark.parametrize("mem_len", [4, 15, 30])  # the ring wraps around / fills whole slot blocks / never fills
def test_greedy_and_sampled_generation_equal_the_plain_step(overrides, mem_len) -> None:
    model = _model(**overrides)
    ids, n = _prompt(), 14
    for kw in ({"do_sample": True, "top_k": 3, "seed": 5}, {}):  # sampled: words of every cluster
        plain = generate(model, ids, max_new_tokens=n, mem_len=mem_len, captured=False, **kw)
        cap = generate(model, ids, max_new_tokens=n, mem_len=mem_len, captured=_eager(model, mem_len=mem_len), **kw)
        assert torch.equal(cap.new_tokens, plain.new_tokens)
        assert (cap.log_probs - plain.log_probs).abs().max() <= 1e-5
        assert all((a - b).abs().max() <= 1e-5 for a, b in zip(cap.mems, plain.mems))
        assert [m.shape for m in cap.mems] == [m.shape for m in plain.mems]
    if mem_len == 30 and not overrides:  # and the oracle that recomputes everything
        ref_ids, ref_lp = reference_generate(model, ids, n, mode="full", mem_len=mem_len)
        assert torch.equal(cap.new_tokens, ref_ids) and (cap.log_probs - ref_lp).abs().max() <= 1e-5


@pytest.mark.parametrize("overrides", [{}, {"cutoffs": [10, 25]}, {"pre_lnorm": True, "untie_r": True}])
@pytest.mark.parametrize("mem_len", [4, 30])
def test_batch_one_equals_the_plain_step(overrides, mem_len) -> None:
    """Batch 1 (one sum per product, ``blocked_linear``, ``_dot_keys``, ``_dot_positions``, ``_mix_values``, with no
    other row fused in) gives the same tokens and log-probabilities as the plain step."""
    model, ids = _model(**overrides), _prompt(b=1)
    plain = generate(model, ids, max_new_tokens=14, mem_len=mem_len, captured=False)
    dec = _eager(model, batch=1, mem_len=mem_len)
    cap = generate(model, ids, max_new_tokens=14, mem_len=mem_len, captured=dec)
    assert torch.equal(cap.new_tokens, plain.new_tokens)
    assert (cap.log_probs - plain.log_probs).abs().max() <= 1e-5
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(cap.mems, plain.mems))


@pytest.mark.parametrize("batch, int8, products", [(1, False, "compiled"), (3, True, "compiled"),
                                                   (1, False, "native"), (3, True, "native")])
def test_compiled_step_equals_the_plain_step(batch, int8, products) -> None:
    """The graph torch.compile makes, not only the function it compiles. ``compiled``: every product a reduction
    inductor generates; at batch 3 the rows' sums fused into one pass, over int8 weights widened as read (against the
    plain step over their dequantized values). ``native``: txl's kernels called from the graph; int8 with the
    activation quantized per row, so within a tolerance of the plain step on the same tokens (teacher-forced)."""
    if products == "native" and (why := native.unavailable()):
        pytest.skip(why)
    model = _dequantized(_model(cutoffs=[10, 25], tie_weight=False))
    ids = _prompt(b=batch)
    dec = CapturedDecoder(model, batch=batch, mem_len=4, int8=int8, products=products)
    assert dec.weights["layers"][0]["ff1"].form == ("tiles" if products == "native" else "blocks")
    plain = generate(model, ids, max_new_tokens=12, mem_len=4, captured=False)
    if products == "native" and int8:
        got = _forced(dec, model, ids, plain.new_tokens)
        err = (got - plain.log_probs[:, 1:]).abs().max()
        assert 0 < err <= 0.05
        return
    cap = generate(model, ids, max_new_tokens=12, mem_len=4, captured=dec)
    assert torch.equal(cap.new_tokens, plain.new_tokens)
    assert (cap.log_probs - plain.log_probs).abs().max() <= 1e-5
    assert dec.compile_s is not None and dec.compile_s > 0


def _forced(dec: CapturedDecoder, model: TransformerXLLM, ids: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """The log-probabilities ``dec`` gives each of ``new``'s tokens after the one before it (the plain path's
    tokens fed to both), ``[B, len(new) - 1]``."""
    forced = torch.cat([ids, new], 1)
    mems = generate(model, ids, max_new_tokens=1, mem_len=dec.mem_len).mems
    lps = []
    for t in range(ids.size(1), forced.size(1) - 1):
        lp, mems = dec.step(forced[:, t], mems)
        lps.append(lp.gather(1, forced[:, t + 1, None]))
    return torch.cat(lps, 1)


#: A captured step compiled and compared with the plain step in a child process (the test below).
_CHILD = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from tests.inference.test_captured import _model, _prompt
from transformer_xl.inference.captured import CapturedDecoder
from transformer_xl.inference.generate import generate
model, ids = _model(cutoffs=[10, 25], tie_weight=False), _prompt(b=1)
dec = CapturedDecoder(model, batch=1, mem_len=4)
plain = generate(model, ids, max_new_tokens=6, mem_len=4, captured=False)
cap = generate(model, ids, max_new_tokens=6, mem_len=4, captured=dec)
assert torch.equal(cap.new_tokens, plain.new_tokens), (cap.new_tokens, plain.new_tokens)
assert (cap.log_probs - plain.log_probs).abs().max() <= 1e-5
"""


@pytest.mark.slow
def test_a_step_compiled_for_one_instruction_set_is_not_reused_by_a_process_with_another(tmp_path) -> None:
    """Two processes sharing inductor's cache, the first restricted to AVX2 and the second to scalar code
    (``ATEN_CPU_CAPABILITY=default``): before the cache was keyed by the vector width, the second took the first's
    generated code and failed to compile it (and between AVX2 and AVX-512: NaN log-probabilities, or a corrupted
    heap); now each compiles its own and both decode as the plain step."""
    import subprocess
    import sys

    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    if not any("avx2" in str(isa) for isa in valid_vec_isa_list()):
        pytest.skip("not an AVX2 CPU")
    repo = str(Path(__file__).resolve().parents[2])
    for capability in ("avx2", "default"):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"), "ATEN_CPU_CAPABILITY": capability,
               "OMP_NUM_THREADS": "1"}
        run = subprocess.run([sys.executable, "-c", _CHILD, repo], env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, (capability, run.stderr[-2000:])


def _dequantized(model: TransformerXLLM) -> TransformerXLLM:
    """A copy of ``model`` whose weights that the captured step takes as int8 hold the float values it multiplies by
    (``q * scale``): the same math in float32, for the plain step."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        mats = [m.weight for layer in ref.layers for m in (layer.dec_attn.qkv_net, layer.dec_attn.o_net,
                                                           layer.pos_ff.CoreNet[0], layer.pos_ff.CoreNet[3])]
        for w in [*mats, *(m.weight for m in ref.crit.out_layers), ref.crit.cluster_weight]:
            q, scale = quantize_rows(w)
            w.copy_(q[:, :w.size(1)].float() * scale.float()[:, None])
    return ref


@pytest.mark.parametrize("words", [False, True])  # int8 lanes widened as read, or 32-bit words split by shifts
@pytest.mark.parametrize("batch", [1, 3, 17])  # one row, rows fused into one pass, more than SUM_ROWS rows
def test_int8_weights_multiply_by_their_dequantized_values(monkeypatch, batch, words) -> None:
    """The int8 step (row blocks, in lanes or in words, scaled per row) is the float step over ``q * scale``: the
    same tokens and log-probabilities (1e-5), whatever the batch (weights that are their own int8 values quantize to
    the same numbers: the prompt's forward is the same too)."""
    from transformer_xl.inference import packing

    monkeypatch.setattr(packing, "int8_words", lambda: words)
    model = _dequantized(_model(cutoffs=[10, 25], tie_weight=False))
    ids = _prompt(b=batch)
    dec = _eager(model, batch=batch, mem_len=4, int8=True, products="compiled")
    cap = generate(model, ids, max_new_tokens=8, mem_len=4, captured=dec)
    plain = generate(model, ids, max_new_tokens=8, mem_len=4, captured=False)
    assert dec.weights["layers"][0]["qkv"].weight.dtype == torch.int8
    assert dec.weights["layers"][0]["qkv"].weight.dim() == (4 if words else 3)
    assert torch.equal(cap.new_tokens, plain.new_tokens)
    assert (cap.log_probs - plain.log_probs).abs().max() <= 1e-5


def _plain_step(model: TransformerXLLM, tok: torch.Tensor, mems: list[torch.Tensor], mem_len: int):
    rec = Recurrence(model, model.config.lengths(mem_len=mem_len, ext_len=0), inference_cache=False, mems=mems)
    with torch.no_grad():
        return model.log_prob(rec(tok[:, None]).hidden[:, -1]), rec.mems


def test_branches_and_returned_memories_stay_as_returned() -> None:
    """Stepping from an older state (a branch) reloads it; memories once returned never change, through many
    steps that move the live window to new buffers."""
    model = _model()
    dec = _eager(model, mem_len=4)
    mems = generate(model, _prompt(), max_new_tokens=1, mem_len=4).mems
    tok_a, tok_b = torch.tensor([1, 2]), torch.tensor([3, 4])
    lp_a, mems_a = dec.step(tok_a, mems)
    kept = [m.clone() for m in mems_a]
    lp_b, mems_b = dec.step(tok_b, mems)  # a branch from the same state
    ref_a, ref_mems_a = _plain_step(model, tok_a, mems, 4)
    ref_b, _ = _plain_step(model, tok_b, mems, 4)
    assert (lp_a - ref_a).abs().max() <= 1e-5 and (lp_b - ref_b).abs().max() <= 1e-5
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(mems_a, ref_mems_a))
    cur = mems_b
    for t in range(200):  # more steps than a buffer holds
        _, cur = dec.step(torch.tensor([t % V, (3 * t) % V]), cur)
    assert all(torch.equal(a, b) for a, b in zip(mems_a, kept))
    lp_again, _ = dec.step(tok_b, mems_a)  # back to the first branch
    assert (lp_again - _plain_step(model, tok_b, mems_a, 4)[0]).abs().max() <= 1e-5


def test_interleaved_streams_over_one_decoder() -> None:
    model = _model()
    dec = _eager(model, mem_len=5)
    a = stream(model, _prompt(seed=1), max_new_tokens=10, mem_len=5, captured=dec)
    b = stream(model, _prompt(seed=2), max_new_tokens=10, mem_len=5, captured=dec)
    got_a, got_b = [], []
    for sa, sb in zip(a, b):
        got_a.append(sa.tokens)
        got_b.append(sb.tokens)
    for got, seed in ((got_a, 1), (got_b, 2)):
        ref = generate(model, _prompt(seed=seed), max_new_tokens=10, mem_len=5, captured=False)
        assert torch.equal(torch.stack(got, 1), ref.new_tokens)


def test_narrower_types_stay_close() -> None:
    """A bf16 key/value ring and int8 weights change the values a little (their perplexity cost on a trained
    model is measured in docs/performance.md), never the shapes or the memories' layout."""
    model = _model()
    ids = _prompt()
    plain = generate(model, ids, max_new_tokens=8, mem_len=4, captured=False)
    cases = [({"kv_dtype": "bfloat16"}, 0.03), ({"int8": True, "products": "compiled"}, 0.15)]
    if native.available():
        cases.append(({"int8": True, "products": "native"}, 0.15))
    for kw, tol in cases:
        dec = _eager(model, mem_len=4, **kw)
        got = _forced(dec, model, ids, plain.new_tokens)
        assert (dec.weights["layers"][0]["qkv"].weight.dtype == torch.int8) == bool(kw.get("int8")), kw
        assert (got - plain.log_probs[:, 1:]).abs().max() <= tol, kw
        assert (got - plain.log_probs[:, 1:]).abs().max() > 0, kw


def test_bad_input_is_one_line() -> None:
    model = _model()
    with pytest.raises(ConfigError, match="attn_type 1"):
        _eager(_model(attn_type=1))
    with pytest.raises(ConfigError, match=r"^unknown kv_dtype 'int4'; known: float32, bfloat16$"):
        _eager(model, kv_dtype="int4")
    with pytest.raises(ConfigError, match=r"^mem_len must be a positive integer, got 0$"):
        _eager(model, mem_len=0)
    with pytest.raises(ConfigError, match=r"^batch must be a positive integer, got 0$"):
        _eager(model, batch=0)
    with pytest.raises(ConfigError, match=r"^int8 decoding is for the CPU; the model is on meta$"):
        _eager(_model().to("meta"), int8=True)
    dec = _eager(model, mem_len=4)
    mems = generate(model, _prompt(), max_new_tokens=1, mem_len=4).mems
    with pytest.raises(ConfigError, match="tokens must be"):
        dec.step(torch.tensor([1, 2, 3]), mems)
    with pytest.raises(ConfigError, match="mems must be"):
        dec.step(torch.tensor([1, 2]), mems[:-1])
    with pytest.raises(ConfigError, match="another model, batch"):
        generate(model, _prompt(b=1), max_new_tokens=2, mem_len=4, captured=dec)


def test_a_generation_builds_its_decoder_from_options_and_checks_a_given_one() -> None:
    """``captured=CaptureOptions(...)`` is built by the library for the generation's batch and lengths; a decoder
    given must have been made for the same model, batch, mem_len, clamp_len and same_length."""
    model = _model()
    lengths = model.config.lengths(mem_len=4, clamp_len=3, ext_len=0)
    dec = _decoder(model, CaptureOptions(int8=True, kv_dtype="bfloat16"), batch=2, lengths=lengths)
    assert dec is not None and dec.int8 and dec.kv_dtype == "bfloat16" and dec.batch == 2
    assert dec.lengths == lengths and dec.ks[0].dtype == torch.bfloat16
    assert _decoder(model, False, batch=2, lengths=lengths) is None
    ids = _prompt()
    for other in ({"clamp_len": 2}, {"same_length": True}, {"mem_len": 5}):
        given = _eager(model, **{"mem_len": 4, "clamp_len": 3, **other})
        with pytest.raises(ConfigError, match=r"another model, batch .* or lengths"):
            generate(model, ids, max_new_tokens=2, mem_len=4, clamp_len=3, captured=given)
    same = _eager(model, mem_len=4, clamp_len=3)
    plain = generate(model, ids, max_new_tokens=6, mem_len=4, captured=False, clamp_len=3)
    cap = generate(model, ids, max_new_tokens=6, mem_len=4, clamp_len=3, captured=same)
    assert torch.equal(cap.new_tokens, plain.new_tokens)
    with pytest.raises(ConfigError, match="captured must be"):
        generate(model, ids, max_new_tokens=2, mem_len=4, captured="int8")


def test_no_compiler_is_one_line_before_anything_is_compiled(monkeypatch) -> None:
    """Where inductor cannot run (no C++ compiler on the CPU, no triton on CUDA) the decoder says so in one
    ConfigError line instead of failing inside torch.compile at its first step."""
    import transformer_xl.inference.captured as captured

    monkeypatch.setattr(captured, "compile_unavailable", lambda device: "inductor needs a C++ compiler")
    with pytest.raises(ConfigError, match=r"^the captured step cannot be compiled here: inductor needs a C\+\+ "
                       r"compiler; decode without --captured$"):
        CapturedDecoder(_model(), batch=1, mem_len=4)
    _eager(_model(), batch=1, mem_len=4)  # compile=False needs no compiler


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_step_equals_the_plain_step() -> None:
    """On CUDA the compiled step is replayed as a CUDA graph (reduce-overhead, the buffers static)."""
    model = _model().cuda()
    ids = _prompt().cuda()
    plain = generate(model, ids, max_new_tokens=12, mem_len=4, captured=False)
    cap = generate(model, ids, max_new_tokens=12, mem_len=4, captured=True)
    assert torch.equal(cap.new_tokens, plain.new_tokens)
    assert (cap.log_probs - plain.log_probs).abs().max() <= 1e-5


def test_memories_longer_than_mem_len_keep_their_newest_rows() -> None:
    """Given more rows than ``mem_len`` (another decoder's memories, a longer prompt's), a step attends to the
    newest ``mem_len`` of them, as the plain step cuts them."""
    model = _model()
    long = generate(model, _prompt(p=12), max_new_tokens=1, mem_len=9).mems  # 9 rows, for a decoder of 4
    assert long[0].size(1) == 9
    dec = _eager(model, mem_len=4)
    tok = torch.tensor([5, 6])
    lp, mems = dec.step(tok, long)
    ref, ref_mems = _plain_step(model, tok, [m[:, -4:] for m in long], 4)
    assert (lp - ref).abs().max() <= 1e-5
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(mems, ref_mems))


def test_a_memory_edited_in_place_after_it_was_returned_is_loaded_again() -> None:
    """The same tensor objects, changed in place (their version counters moved): the step reloads them instead of
    continuing from the state it kept."""
    model = _model()
    dec = _eager(model, mem_len=4)
    _, mems = dec.step(torch.tensor([1, 2]), generate(model, _prompt(), max_new_tokens=1, mem_len=4).mems)
    for m in mems:
        m.mul_(0.5)  # edited in place: same objects
    tok = torch.tensor([3, 4])
    ref, _ = _plain_step(model, tok, [m.clone() for m in mems], 4)
    lp, _ = dec.step(tok, mems)
    assert (lp - ref).abs().max() <= 1e-5


def test_the_memories_keep_the_model_dtype_and_a_long_mem_len() -> None:
    """A float64 model's memories stay float64; a memory longer than the buffers' minimum spare room (mem_len 200),
    and the shortest one (1), step like the plain path."""
    model = _model().double()
    tok = torch.tensor([7, 8])
    for mem_len in (200, 1):
        mems = generate(model, _prompt(), max_new_tokens=1, mem_len=mem_len).mems
        lp, new = _eager(model, mem_len=mem_len).step(tok, mems)
        ref, ref_mems = _plain_step(model, tok, mems, mem_len)
        assert all(m.dtype == torch.float64 for m in new) and [m.shape for m in new] == [m.shape for m in ref_mems]
        assert (lp - ref).abs().max() <= 1e-5  # the position table is built in float32, as for every model


def test_a_step_over_its_own_last_memories_continues_without_loading_them(monkeypatch) -> None:
    """Loading projects every memory row again: a step given the memories it returned last continues from its ring;
    any other memories (a branch, fewer tensors) are loaded. The decoder's lengths have no ext_len."""
    model = _model(ext_len=2)
    dec = _eager(model, mem_len=4)
    assert dec.lengths.ext_len == 0
    loads: list[int] = []
    real = dec.load
    monkeypatch.setattr(dec, "load", lambda mems: (loads.append(len(mems)), real(mems))[1])
    start = generate(model, _prompt(), max_new_tokens=1, mem_len=4).mems
    _, mems = dec.step(torch.tensor([1, 2]), start)
    _, mems = dec.step(torch.tensor([3, 4]), mems)
    _, mems = dec.step(torch.tensor([5, 6]), mems)
    assert len(loads) == 1
    dec.step(torch.tensor([5, 6]), start)  # a branch from the first state
    assert len(loads) == 2


def test_the_read_only_tensors_share_one_buffer_in_step_order_and_each_ring_has_its_own() -> None:
    """On the CPU (arena): packed weights and position keys are views into one buffer, in the order a step reads
    them (a bias shared by every layer once; the input projections too, not the embedding tables, of which a step
    gathers a few rows); every ring a buffer of its own (a step writes them)."""
    dec = _eager(_model(cutoffs=[10, 25], div_val=2, untie_r=False), mem_len=4)
    w = dec.weights["layers"]
    projs = [proj.weight for _, proj in dec.weights["emb"]]  # adaptive input's projections (div_val 2): in the arena
    order = [w[0]["qkv"].weight, w[0]["u"], dec.pos_keys[0], w[0]["o"].weight, w[0]["ff2"].bias, w[1]["qkv"].weight,
             dec.pos_keys[1], *projs, dec.weights["head"][0][1].weight]
    assert len(projs) == 3 and len({t.untyped_storage().data_ptr() for t in order}) == 1
    assert [t.data_ptr() for t in order] == sorted(t.data_ptr() for t in order)
    assert not {t.untyped_storage().data_ptr() for t, _ in dec.weights["emb"]} & {order[0].untyped_storage().data_ptr()}
    assert w[0]["u"] is w[1]["u"] and w[0]["v"] is w[1]["v"]  # untie_r=False: one copy
    rings = {t.untyped_storage().data_ptr() for t in [*dec.ks, *dec.vs]}
    assert len(rings) == 2 * len(w) and not rings & {order[0].untyped_storage().data_ptr()}
    if hasattr(mmap, "MADV_HUGEPAGE"):  # the rings on huge pages too (arena.huge_page_zeros: 2 MiB aligned)
        assert all(t.data_ptr() % HUGE_PAGE == 0 for t in [*dec.ks, *dec.vs])


def test_the_state_lives_on_the_model_device() -> None:
    """Every buffer of the decoder is made on the model's device (PyTorch's ``meta`` device stands in for an
    accelerator: shapes and placement without data); positions are integers, the ring has the asked type."""
    model = _model().to("meta")
    dec = _eager(model, mem_len=4, kv_dtype="bfloat16")
    mems = [torch.zeros(2, 3, model.config.d_model, device="meta") for _ in range(model.config.n_layer + 1)]
    lp, new = dec.step(torch.tensor([1, 2], device="meta"), mems)
    state = [*dec.ks, *dec.vs, dec.slot_pos, dec.cur, *dec.pos_keys, dec._hist, lp, *new]
    assert {t.device.type for t in state} == {"meta"}
    assert {t.dtype for t in [*dec.ks, *dec.vs, *dec.pos_keys]} == {torch.bfloat16}
    assert dec.slot_pos.dtype == dec.cur.dtype == torch.long


@pytest.mark.parametrize("clamp_len", [0, 1])
def test_the_shortest_clamp_lengths_match_the_plain_step(clamp_len) -> None:
    """clamp_len 0 clamps nothing; 1 makes every distance but 0 look like 1."""
    model = _model(clamp_len=clamp_len)
    ids = _prompt()
    plain = generate(model, ids, max_new_tokens=6, mem_len=4, captured=False)
    cap = generate(model, ids, max_new_tokens=6, mem_len=4, captured=_eager(model, mem_len=4))
    assert torch.equal(cap.new_tokens, plain.new_tokens)
    assert (cap.log_probs - plain.log_probs).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------- captured by default
def test_the_rule_captures_when_the_tokens_left_repay_the_compilation() -> None:
    """``pays``: the time the tokens save (a plain step's seconds times the share saved) against the compile time."""
    from transformer_xl.inference.captured import pays

    step_s, compile_s = 0.03, 20.0
    enough = int(compile_s / (step_s * 0.5)) + 1
    assert not pays(5, step_s, compile_s, saving=0.5)  # a handful of tokens: the plain step
    assert pays(enough, step_s, compile_s, saving=0.5) and not pays(enough - 2, step_s, compile_s, saving=0.5)
    assert pays(1, step_s, 0.0) and not pays(0, step_s, 0.0)  # compiled already: any step left
    assert not pays(enough, step_s, compile_s, saving=0.25)


def test_the_compile_estimate_is_cold_warm_from_the_disk_cache_and_zero_once_compiled(tmp_path, monkeypatch) -> None:
    import transformer_xl.inference.captured as captured

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(captured, "_DONE", set())
    key = captured.step_key(_model(), batch=1, lengths=_model().config.lengths(mem_len=4, ext_len=0),
                            options=CaptureOptions())
    assert captured.compile_estimate(key) == captured.COMPILE_S["cold"]
    captured._record(key)
    assert captured.compile_estimate(key) == 0.0  # this process holds the graph
    captured._DONE.clear()  # another process: inductor's on-disk cache holds it
    assert captured.compile_estimate(key) == captured.COMPILE_S["warm"]
    other = key.replace('"float32"', '"bfloat16"')
    assert other != key and captured.compile_estimate(other) == captured.COMPILE_S["cold"]


def test_processes_recording_at_once_write_their_own_temporary_files(tmp_path, monkeypatch) -> None:
    """Forked processes can hold the same object ids: the temporary file of a record is named by the process."""
    import transformer_xl.inference.captured as captured

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(captured, "_DONE", set())
    moved: list[str] = []
    real = Path.replace
    monkeypatch.setattr(Path, "replace", lambda self, target: moved.append(self.name) or real(self, target))
    for pid in (101, 202):
        monkeypatch.setattr(captured.os, "getpid", lambda pid=pid: pid)
        captured._DONE.clear()
        captured._record(f"step {pid}")
    assert len(moved) == 2 and ".101." in moved[0] and ".202." in moved[1]
    assert json.loads(captured._seen_path().read_text()) == ["step 101", "step 202"]


def test_a_decoders_first_compiled_step_makes_its_key_known_to_the_estimate(tmp_path, monkeypatch) -> None:
    """The key a decoder records at its first compiled step is :func:`step_key` of its model, batch, lengths and
    options, the one a generation's rule asks ``compile_estimate`` about: 0 s after it, while the keys of other
    options, another batch or another weight type stay cold."""
    import transformer_xl.inference.captured as captured
    from transformer_xl.inference import decode

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(captured, "_DONE", set())
    monkeypatch.setattr(captured, "_compiled", lambda device, batch, **kw: lambda *a: decode.step(*a))  # "compiled"
    model = _model()
    lengths = model.config.lengths(mem_len=4, ext_len=0)
    cold = captured.COMPILE_S["cold"]
    for opts in (CaptureOptions(), CaptureOptions(int8=True, kv_dtype="bfloat16")):
        key = captured.step_key(model, batch=2, lengths=lengths, options=opts)
        assert captured.compile_estimate(key) == cold
        generate(model, _prompt(), max_new_tokens=2, mem_len=4, captured=_decoder(model, opts, batch=2,
                                                                                  lengths=lengths))
        assert captured.compile_estimate(key) == 0.0, opts
    for other in (captured.step_key(model, batch=1, lengths=lengths, options=CaptureOptions()),
                  captured.step_key(_model().double(), batch=2, lengths=lengths, options=CaptureOptions()),
                  captured.step_key(model, batch=2, lengths=lengths, options=CaptureOptions(kv_dtype="bfloat16"))):
        assert captured.compile_estimate(other) == cold


def test_auto_true_and_false_give_the_same_tokens_and_auto_chooses_by_the_rule(tmp_path, monkeypatch) -> None:
    """``captured=None`` (the default) decodes plain when the rule says no and captured when it says yes; both give
    the tokens of ``captured=False`` and ``captured=True`` (the step run eagerly as if compiled: the compiled graph is
    tested above), and a captured generation notes its first step."""
    import transformer_xl.inference.captured as captured
    import transformer_xl.inference.generate as gen
    from transformer_xl.inference import decode

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(captured, "_DONE", set())
    monkeypatch.setattr(captured, "_compiled", lambda device, batch, **kw: lambda *a: decode.step(*a))
    model, ids = _model(cutoffs=[10, 25]), _prompt()
    runs, notes = {}, []
    for name, choice in (("plain", False), ("captured", True), ("auto", None)):
        for says in (False, True):
            monkeypatch.setattr(gen, "pays", lambda *a, says=says: says)
            before = len(notes)
            out = generate(model, ids, max_new_tokens=12, mem_len=4, captured=choice, note=notes.append)
            runs[name, says] = out
            assert (len(notes) > before) == (choice is True or (choice is None and says)), (name, says, notes)
    for key, out in runs.items():
        assert torch.equal(out.new_tokens, runs["plain", False].new_tokens), key
        assert (out.log_probs - runs["plain", False].log_probs).abs().max() <= 1e-5, key
    assert notes[0].startswith("captured decode step: ") and notes[-1].startswith("captured decode step: ")


def test_auto_uses_the_plain_step_for_a_model_the_captured_step_does_not_support(monkeypatch) -> None:
    """An unsupported model (attn_type 1, a sampled softmax) decodes plain under the default, silently; with
    ``captured=True`` it is a one-line error."""
    import transformer_xl.inference.generate as gen

    monkeypatch.setattr(gen, "pays", lambda *a: True)
    for overrides, why in (({"attn_type": 1}, "attn_type 1"), ({"sample_softmax": 8}, "sampled-softmax")):
        model, ids, notes = _model(**overrides), _prompt(), []
        plain = generate(model, ids, max_new_tokens=6, mem_len=4, captured=False)
        auto = generate(model, ids, max_new_tokens=6, mem_len=4, note=notes.append)
        assert torch.equal(auto.new_tokens, plain.new_tokens) and not notes
        with pytest.raises(ConfigError, match=f"^the captured decode step does not support .*{why}.*; use the plain"):
            generate(model, ids, max_new_tokens=6, mem_len=4, captured=True)


def test_the_expected_compile_seconds_are_the_measured_ones_rounded_up() -> None:
    """COMPILE_S is benchmarks/results/compile_time_cpu_1t.json's larger figures, rounded up to 5 s."""
    import transformer_xl.inference.captured as captured

    report = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results"
                         / "compile_time_cpu_1t.json").read_text(encoding="utf-8"))
    for kind in ("cold", "warm"):
        assert captured.COMPILE_S[kind] == 5 * math.ceil(max(r[f"{kind}_s"] for r in report["rows"]) / 5)
