"""The inference cache (memory keys/values, W_kR R) gives exactly what the plain formulas give."""

from __future__ import annotations

import pytest
import torch

from transformer_xl import InferenceCache, TransformerXLLM, TXLConfig
from transformer_xl.errors import ConfigError

V = 40


@pytest.mark.parametrize("kw", [
    dict(attn_type=0), dict(attn_type=1), dict(attn_type=0, pre_lnorm=True),
    dict(attn_type=0, same_length=True, clamp_len=5), dict(attn_type=0, ext_len=3),
    dict(attn_type=0, mem_len=4), dict(attn_type=0, mem_len=30), dict(attn_type=1, pre_lnorm=True, mem_len=20),
])
def test_memory_kv_cache_equals_projecting_memory(kw: dict) -> None:
    """Keys/values of the memory cached from earlier segments == projecting the memory again."""
    base = dict(n_token=V, n_layer=3, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=6, mem_len=8,
                init_std=0.3)
    model = TransformerXLLM(TXLConfig(**{**base, **kw})).eval()
    gen = torch.Generator().manual_seed(4)
    mems_a = mems_b = None
    cache = InferenceCache()
    projected: list[int] = []
    for layer in model.layers:  # count the memory projections the cache saves
        layer.dec_attn._memory_kv = _counting(layer.dec_attn._memory_kv, projected)
    with torch.no_grad():
        for seg in range(5):
            qlen = 1 if seg >= 3 else 6 + model.config.ext_len  # also one token at a time, as generation
            x = torch.randint(0, V, (2, qlen), generator=gen)
            ref = model(x, x, mems_a)
            before = len(projected)
            out = model(x, x, mems_b, cache=cache)
            assert len(projected) == before  # served from the cache: the memory is not projected again
            # float rounding: cached and projected anew, the products block differently (a few units in the last
            # place of values about 1 on AVX2 and AMX kernels, carried over five segments)
            torch.testing.assert_close(out.nll, ref.nll, rtol=1e-5, atol=1e-5)
            for a, b in zip(out.mems, ref.mems):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            mems_a, mems_b = ref.mems, out.mems
        # Memories that are not the ones the cache produced are projected anew (the same values as without it)
        other = [m[:, 1:].clone() for m in mems_b]
        torch.testing.assert_close(model(x, x, other, cache=cache).nll, model(x, x, other).nll)
    with pytest.raises(ConfigError, match="no_grad"):
        model(x, x, mems_b, cache=cache)


def _counting(fn, calls: list[int]):
    def wrapped(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return wrapped


@pytest.mark.parametrize("attn_type", [2, 3])
def test_memory_kv_cache_off_for_absolute_positions(attn_type: int) -> None:
    model = TransformerXLLM(TXLConfig(n_token=V, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32,
                                      tgt_len=6, mem_len=6, attn_type=attn_type)).eval()
    x = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(1))
    cache = InferenceCache()
    with torch.no_grad():
        out = model(x, x, None, cache=cache)
        # their memories get position embeddings: nothing to reuse, the plain formula runs
        torch.testing.assert_close(model(x, x, out.mems, cache=cache).nll, model(x, x, out.mems).nll)
        assert cache._k == [] and cache._tables == {}


def test_projected_position_table_cache_follows_lengths_and_weights() -> None:
    """Inference reuses W_kR R across forwards (suffix of a longer table): the same scores as projecting
    R again, for growing and shrinking K, other clamp_len, and after the weights change."""
    cfg = TXLConfig(n_token=V, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=4, mem_len=40,
                    init_std=0.3)
    model = TransformerXLLM(cfg).eval()
    gen = torch.Generator().manual_seed(2)
    cache = InferenceCache()

    def both(x: torch.Tensor, mems, **lengths) -> tuple[torch.Tensor, list[torch.Tensor]]:
        lengths = cfg.lengths(**lengths)
        with torch.no_grad():
            fast = model(x, x, mems, lengths=lengths, cache=cache)
        ref = model(x, x, mems, lengths=lengths)  # with a gradient: W_kR R projected in full
        torch.testing.assert_close(fast.nll, ref.nll.detach(), rtol=1e-5, atol=1e-6)
        return fast.nll, fast.mems

    mems = None
    for _ in range(12):  # K grows one token at a time (generation): W_kR R kept per layer, and doubles
        _, mems = both(torch.randint(0, V, (2, 1), generator=gen), mems)
    assert cache._tables[0][1].size(0) >= 12
    for _ in range(3):
        _, mems = both(torch.randint(0, V, (2, 4), generator=gen), mems)
    assert cache._tables[0][1].size(0) >= 24
    both(torch.randint(0, V, (2, 4), generator=gen), None)  # short K again
    both(torch.randint(0, V, (2, 4), generator=gen), mems, clamp_len=3)
    with torch.no_grad():  # an in-place update (as an optimizer step) bumps the version counter
        for layer in model.layers:
            layer.dec_attn.r_net.weight.mul_(-1.5)
    both(torch.randint(0, V, (2, 4), generator=gen), mems)
    model.load_state_dict(TransformerXLLM(cfg).state_dict())  # load_state_dict too
    both(torch.randint(0, V, (2, 4), generator=gen), mems)
    with torch.no_grad():  # a write through .data bypasses the version counter: clear() is the documented way
        for layer in model.layers:
            layer.dec_attn.r_net.weight.data.copy_(torch.randn(16, 16, generator=gen))
    cache.clear()
    both(torch.randint(0, V, (2, 4), generator=gen), mems)
    assert not any("cache" in k for k in model.state_dict())  # a cache, not state


def test_memories_changed_in_place_are_projected_anew() -> None:
    model = TransformerXLLM(TXLConfig(n_token=V, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=4,
                                      mem_len=8, init_std=0.3)).eval()
    x = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(5))
    cache = InferenceCache()
    with torch.no_grad():
        mems = model(x, x, None, cache=cache).mems
        for m in mems:
            m[0].zero_()  # the kept keys/values no longer describe these memories
        torch.testing.assert_close(model(x, x, mems, cache=cache).nll, model(x, x, mems).nll)


def test_inference_mode_models_can_use_the_cache() -> None:
    """Tensors made under ``torch.inference_mode`` keep no version counter; the cache still works with them."""
    with torch.inference_mode():
        model = TransformerXLLM(TXLConfig(n_token=V, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32,
                                          tgt_len=4, mem_len=8, init_std=0.3)).eval()
        x = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(6))
        cache, mems_a, mems_b = InferenceCache(), None, None
        for _ in range(3):
            out, ref = model(x, x, mems_a, cache=cache), model(x, x, mems_b)
            torch.testing.assert_close(out.nll, ref.nll, rtol=1e-5, atol=1e-6)
            mems_a, mems_b = out.mems, ref.mems


def _generation_model(**kw) -> TransformerXLLM:
    base = dict(n_token=V, n_layer=3, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=5, mem_len=7,
                init_std=0.3)
    return TransformerXLLM(TXLConfig(**{**base, **kw})).eval()


@pytest.mark.parametrize("kw", [dict(), dict(pre_lnorm=True, untie_r=True), dict(same_length=True, clamp_len=4),
                                dict(attn_type=1), dict(cutoffs=[10, 20], div_val=2)])
def test_buffers_give_the_functional_paths_tokens_and_log_probs(kw: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generation through the append-only buffers (moved to new buffers every few tokens: mem_len 7, a slack of
    4, 70 tokens) == the plain formula (memories concatenated, every memory projected again): the same tokens,
    log-probs and memories, for a batch of 3 rows sampled with one seed."""
    import transformer_xl.inference.generate as G
    import transformer_xl.model.cache as C
    from transformer_xl.model import Recurrence

    model = _generation_model(**kw)
    prompt = torch.randint(0, V, (3, 11), generator=torch.Generator().manual_seed(8))
    monkeypatch.setattr(C, "MIN_SLACK", 1)
    moves: list[int] = []
    move = InferenceCache._move_window
    monkeypatch.setattr(InferenceCache, "_move_window", lambda self, n: moves.append(1) or move(self, n))
    fast = G.generate(model, prompt, max_new_tokens=70, do_sample=True, seed=3)
    assert len(moves) >= 10  # the window really moved to new buffers
    monkeypatch.setattr(G, "Recurrence", lambda model, lengths, mems: Recurrence(model, lengths, mems=mems,
                                                                                  inference_cache=False))
    plain = G.generate(model, prompt, max_new_tokens=70, do_sample=True, seed=3)
    assert torch.equal(fast.sequences, plain.sequences)
    torch.testing.assert_close(fast.log_probs, plain.log_probs, rtol=1e-5, atol=1e-5)
    for a, b in zip(fast.mems, plain.mems):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_returned_memories_stay_what_they_were() -> None:
    """The functional contract: memories a forward returned are views of the buffers, but later forwards (which
    write on, and move the window) never change them; a forward from an older state branches correctly."""
    model = _generation_model()
    cache = InferenceCache()
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randint(0, V, (2, 1 if i > 1 else 5), generator=gen) for i in range(60)]
    kept: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    mems = None
    with torch.no_grad():
        for x in xs:
            mems = model(x, x, mems, cache=cache).mems
            kept.append((mems, [m.clone() for m in mems]))
        for returned, copy in kept:
            for a, b in zip(returned, copy):
                assert torch.equal(a, b)
        old = kept[20][0]  # branch from an older state: the same as without a cache
        x = xs[21]
        torch.testing.assert_close(model(x, x, old, cache=cache).nll, model(x, x, old).nll, rtol=1e-5, atol=1e-6)
        again = model(x, x, old, cache=cache)  # twice from the same memories: the same result
        torch.testing.assert_close(again.nll, model(x, x, old).nll, rtol=1e-5, atol=1e-6)


def test_a_generation_step_copies_nothing_of_the_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the buffers a one-token step concatenates nothing of memory length: no torch.cat runs at all."""
    model = _generation_model(mem_len=40)
    cache = InferenceCache()
    x = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mems = model(x, mems=None, cache=cache).mems
        for _ in range(3):
            mems = model(x[:, :1], mems=mems, cache=cache).mems
        calls: list[tuple] = []
        real_cat = torch.cat
        monkeypatch.setattr(torch, "cat", lambda ts, *a, **k: calls.append(tuple(t.shape for t in ts))
                            or real_cat(ts, *a, **k))
        model(x[:, :1], mems=mems, cache=cache)
    assert calls == [] and mems[0].size(1) == 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("batch", [1, 4])
def test_cuda_generation_through_the_buffers_equals_cpu_and_the_plain_path(batch: int,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA: the buffers (moved several times), the one-query attention and position scores give the plain
    path's tokens and log-probs, and the CPU's."""
    import transformer_xl.inference.generate as G
    import transformer_xl.model.cache as C
    from transformer_xl.model import Recurrence

    torch.backends.cuda.matmul.allow_tf32 = False
    monkeypatch.setattr(C, "MIN_SLACK", 1)
    model = _generation_model(cutoffs=[10, 20], div_val=2, d_embed=16, untie_r=True)
    gpu = _generation_model(cutoffs=[10, 20], div_val=2, d_embed=16, untie_r=True).cuda()
    gpu.load_state_dict(model.state_dict())
    prompt = torch.randint(0, V, (batch, 11), generator=torch.Generator().manual_seed(8))
    fast = G.generate(gpu, prompt.cuda(), max_new_tokens=40)
    cpu = G.generate(model, prompt, max_new_tokens=40)
    monkeypatch.setattr(G, "Recurrence", lambda model, lengths, mems: Recurrence(model, lengths, mems=mems,
                                                                                  inference_cache=False))
    plain = G.generate(gpu, prompt.cuda(), max_new_tokens=40)
    assert torch.equal(fast.sequences, plain.sequences) and torch.equal(fast.sequences.cpu(), cpu.sequences)
    torch.testing.assert_close(fast.log_probs, plain.log_probs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fast.log_probs.cpu(), cpu.log_probs, rtol=1e-4, atol=1e-4)
