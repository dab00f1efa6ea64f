"""Generation with the Transformer-XL memory as the cache (paper Sec. 3.2 and the "evaluation speed" of Sec. 4).

The prompt is consumed in segments of ``tgt_len`` tokens carrying the memories; the log-probabilities at
the last prompt position give the first new token. Every further token is one forward of a ``[B, 1]``
segment that attends over the cached hidden states of the previous ``mem_len`` positions of every layer:
nothing of the past is recomputed, so a step costs the same at token 10 and at token 10,000, and the
context a token can depend on grows with depth (``n_layer * mem_len``, paper Sec. 3.2).

API (functions over the public ``forward`` of :class:`transformer_xl.model.TransformerXLLM`)::

    out = generate(model, input_ids, max_new_tokens=200, do_sample=True, top_p=0.9, seed=0)
    out.sequences, out.log_probs, out.mems           # continue: generate(model, out.sequences[:, -1:], mems=out.mems)
    for step in stream(model, input_ids, max_new_tokens=200):
        step.tokens, step.log_probs                   # [B] each, as soon as they are chosen

:func:`reference_generate` recomputes every step from scratch (greedy): the oracle of the tests and the
baseline of ``benchmarks/bench_generate.py``.

The lengths of generation (``mem_len``, ``clamp_len``; ``ext_len`` is 0) are arguments: the model is not
changed. Each forward runs in eval mode without a gradient; between two steps (when :func:`stream` yields) the
model is back in the caller's mode, so two generations over one model do not disturb each other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from transformer_xl.devices import synchronize
from transformer_xl.errors import ConfigError, check_int
from transformer_xl.inference.captured import CapturedDecoder, CaptureOptions, compile_estimate, pays, step_key
from transformer_xl.inference.decode import supported
from transformer_xl.inference.sampling import Penalties, check_sampling, choose_next, penalize
from transformer_xl.interop.onnx_runtime import OnnxRecurrence, OnnxRuntimeLM
from transformer_xl.model import Lengths, Recurrence, TransformerXLLM, eval_mode
from transformer_xl.model.fastpath import compile_unavailable

#: What generates: a PyTorch model, or an ONNX export on ONNX Runtime (:mod:`transformer_xl.interop.onnx_runtime`).
LM = TransformerXLLM | OnnxRuntimeLM


@dataclass
class GenerationStep:
    """One decoding step of a batch: the chosen token of every row."""

    index: int  # 0 for the first new token
    tokens: Tensor  # [B] chosen ids (``pad_token_id`` for rows that had already stopped)
    log_probs: Tensor  # [B] model log-probability of each chosen id (before temperature/top-k/top-p; 0 if padded)
    finished: Tensor  # [B] bool: the row has emitted a stop token at or before this step
    mems: list[Tensor] = field(default_factory=list)  # memories of every position *before* ``tokens``


@dataclass
class GenerationOutput:
    """Result of :func:`generate`."""

    sequences: Tensor  # [B, P + N] prompt followed by the generated ids
    log_probs: Tensor  # [B, N] model log-probabilities of the generated ids (0 after a row stopped)
    mems: list[Tensor]  # memories of every position of ``sequences`` except the last (which is not yet fed)
    finished: Tensor  # [B] bool: the row stopped on a stop token
    prompt_length: int = 0

    @property
    def new_tokens(self) -> Tensor:
        """``[B, N]`` the generated ids only."""
        return self.sequences[:, self.prompt_length:]


# ---------------------------------------------------------------------------------------------- validation
def _as_ids(model: LM, input_ids: Tensor | Sequence[int] | Sequence[Sequence[int]]) -> Tensor:
    device = torch.device("cpu") if isinstance(model, OnnxRuntimeLM) else next(model.parameters()).device
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=device)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2:
        raise ConfigError(f"input_ids must be [batch, time] (or [time]), got shape {tuple(ids.shape)}")
    if ids.size(0) == 0 or ids.size(1) == 0:
        raise ConfigError("input_ids is empty: give at least one token per row (a text prompt that is empty "
                          "starts from the vocabulary's <eos>, see transformer_xl.data.codec)")
    n_token = model.config.n_token
    if ids.min() < 0 or ids.max() >= n_token:
        raise ConfigError(f"input_ids must lie in [0, {n_token}), got ids in [{int(ids.min())}, {int(ids.max())}]")
    return ids


# ---------------------------------------------------------------------------------------------- decoding
def _lengths(model: LM, mem_len: int | None, clamp_len: int | None) -> Lengths:
    """Generation's lengths: ``mem_len`` (default: the model's, at least 1), ``clamp_len``, no ``ext_len``."""
    if mem_len is None and model.config.mem_len == 0:
        raise ConfigError("the model has mem_len 0: generation uses the memory as its cache, give mem_len >= 1")
    check_int("mem_len", model.config.mem_len if mem_len is None else mem_len, 1)
    return model.config.lengths(mem_len=mem_len, clamp_len=clamp_len, ext_len=0)


def stream(
    model: LM,
    input_ids: Tensor | Sequence[int] | Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 100,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    mems: list[Tensor] | None = None,
    mem_len: int | None = None,
    clamp_len: int | None = None,
    prompt_chunk: int | None = None,
    stop_token_ids: Sequence[int] = (),
    pad_token_id: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    captured: bool | CaptureOptions | CapturedDecoder | None = None,
    note: Callable[[str], None] | None = None,
) -> Iterator[GenerationStep]:
    """Yield one :class:`GenerationStep` per new token (incremental decoding, see the module docstring).

    Args:
        model: a :class:`~transformer_xl.model.TransformerXLLM`, or an
            :class:`~transformer_xl.interop.onnx_runtime.OnnxRuntimeLM` (an ONNX export run by ONNX Runtime on the
            CPU: the same loop, sampling and stops over its graphs; its ``clamp_len`` is the export's, no ``captured``).
        input_ids: ``[B, P]`` (or ``[P]``) prompt ids, ``P >= 1``; with ``mems`` they follow the memorized text.
        do_sample: draw from the (tempered, filtered) distribution; otherwise greedy. ``temperature=0`` is greedy.
        top_k: keep the ``top_k`` most likely ids (0: all). ``top_p``: nucleus mass in (0, 1] (1: all).
        min_p: keep the ids at least ``min_p`` times as likely as the most likely one (0: all).
        repetition_penalty: multiply the log-probability of every id already in the row (prompt included) by it
            (> 1: less likely; 1: off). ``no_repeat_ngram_size`` N: never complete an N-gram the row already
            holds (0: off). Both apply to greedy decoding too (:mod:`transformer_xl.inference.sampling`).
        mems: memories to continue from (e.g. :attr:`GenerationOutput.mems`).
        mem_len: memory length while generating (default: the model's ``mem_len``); may exceed training's.
        clamp_len: clamp relative distances (default: the model's; useful with a long ``mem_len``).
        prompt_chunk: segment length for consuming the prompt (default: the model's ``tgt_len``).
        stop_token_ids: a row stops after emitting one of these; later steps give it ``pad_token_id``
            (default: the first stop token). Generation ends when every row stopped.
        seed / generator: randomness of sampling (a ``torch.Generator`` on the model's device or the CPU).
        captured: how every token after the prompt is decoded. ``None`` (default): the captured step
            (:class:`~transformer_xl.inference.captured.CapturedDecoder`, compiled once per model shape) when it
            pays, else the plain step: the first step is plain and timed, and the rest is captured when
            :func:`~transformer_xl.inference.captured.pays` says the tokens left repay the expected compilation
            (none when compiled already in this process, a few seconds from inductor's on-disk cache), and the
            model and the machine support it. ``False``: the plain step. ``True``: the captured one (a one-line
            error where it cannot run), built for these lengths and this batch; a
            :class:`~transformer_xl.inference.captured.CaptureOptions` one with int8 weights and/or a bf16
            key/value ring; or give your own decoder (made for this model, batch and lengths).
            Same tokens and log-probabilities either way (to float rounding).
        note: called with a one-line message when a generation starts the captured step (before compiling it,
            with the expected seconds) and after its first step (the seconds it took).
    """
    check_sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    penalties = Penalties(repetition_penalty, no_repeat_ngram_size)
    ids = _as_ids(model, input_ids)
    cfg = model.config
    lengths = _lengths(model, mem_len, clamp_len)
    chunk = check_int("prompt_chunk", cfg.tgt_len if prompt_chunk is None else prompt_chunk, 1)
    _check_mems(model, mems, ids.size(0))
    stop = torch.as_tensor(list(stop_token_ids), dtype=torch.long, device=ids.device)
    if stop.numel() and (stop.min() < 0 or stop.max() >= cfg.n_token):
        raise ConfigError(f"stop_token_ids must lie in [0, {cfg.n_token})")
    if generator is None and seed is not None and do_sample:
        generator = torch.Generator(device=ids.device).manual_seed(seed)
    batch = ids.size(0)
    if isinstance(model, OnnxRuntimeLM):
        if captured:
            raise ConfigError("captured decoding is a PyTorch step; the onnxruntime backend runs its exported step")
        rec: Recurrence | OnnxRecurrence = OnnxRecurrence(model, lengths, mems=mems)
        decoding = _Decoding(model, batch, lengths, None, False, note)
    else:
        rec = Recurrence(model, lengths, mems=list(mems or []))
        auto = captured is None and supported(model) is None and not compile_unavailable(ids.device.type)
        decoding = _Decoding(model, batch, lengths, None if captured is None else _decoder(
            model, captured, batch=batch, lengths=lengths), auto, note)
    return _stream(model, ids, max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
                   top_k=top_k, top_p=top_p, min_p=min_p, penalties=penalties, rec=rec, chunk=chunk, stop=stop,
                   pad=pad_token_id, generator=generator, decoding=decoding)


class _Decoding:
    """How a generation computes the log-probabilities after each new token: the plain step, the captured one
    (``decoder``), or, with ``auto``, a timed plain step first and then the one :func:`pays` chooses."""

    def __init__(self, model: LM, batch: int, lengths: Lengths, decoder: CapturedDecoder | None,
                 auto: bool, note: Callable[[str], None] | None) -> None:
        self.model, self.batch, self.lengths = model, batch, lengths
        self.decoder, self.auto, self.note = decoder, auto, note

    def __call__(self, rec: Recurrence | OnnxRecurrence, tok: Tensor, left: int) -> Tensor:
        """``[B, V]`` after ``tok [B]`` (``rec`` moves on); ``left``: the steps that may follow this one."""
        if self.decoder is None:
            start = time.perf_counter()
            log_probs = _next_log_probs(self.model, rec, [tok[:, None]])  # one new position over the memories
            if self.auto:
                self.auto = False
                synchronize(log_probs.device)
                key = step_key(self.model, batch=self.batch, lengths=self.lengths, options=CaptureOptions())
                if pays(left, time.perf_counter() - start, compile_estimate(key)):
                    self.decoder = _decoder(self.model, True, batch=self.batch, lengths=self.lengths)
            return log_probs
        dec = self.decoder
        first = self.note is not None and dec.compile_s is None and dec.compiled
        if first:
            expected = compile_estimate(dec.key)
            self.note(f"captured decode step: compiling (expected about {expected:.0f} s; --no-captured: the plain "
                      "step)" if expected else "captured decode step: compiled already")
        log_probs, rec.mems = dec.step(tok, rec.mems)  # the same as the plain step, as one captured graph
        if first and dec.compile_s is not None:
            self.note(f"captured decode step: first step {dec.compile_s:.1f} s")
        return log_probs


def _decoder(model: TransformerXLLM, captured: bool | CaptureOptions | CapturedDecoder, *, batch: int,
             lengths: Lengths) -> CapturedDecoder | None:
    """The captured decoder of a generation (None: the plain step): the one place a generation builds one; a
    decoder given is checked against the generation's model, batch and lengths."""
    if captured is False:
        return None
    if captured is True or isinstance(captured, CaptureOptions):
        opts = CaptureOptions() if captured is True else captured
        return CapturedDecoder(model, batch=batch, mem_len=lengths.mem_len, clamp_len=lengths.clamp_len,
                               same_length=lengths.same_length, int8=opts.int8, kv_dtype=opts.kv_dtype)
    if not isinstance(captured, CapturedDecoder):
        raise ConfigError(f"captured must be a bool, CaptureOptions or CapturedDecoder, got {type(captured).__name__}")
    ours = (lengths.mem_len, lengths.clamp_len, lengths.same_length)
    theirs = (captured.lengths.mem_len, captured.lengths.clamp_len, captured.lengths.same_length)
    if captured.model is not model or captured.batch != batch or theirs != ours:
        raise ConfigError(f"the captured decoder was made for another model, batch ({captured.batch}) or lengths "
                          f"(mem_len, clamp_len, same_length {theirs}) than this generation's (batch {batch}, {ours})")
    return captured


def advance(model: TransformerXLLM, input_ids: Tensor | Sequence[int] | Sequence[Sequence[int]], *,
            mems: list[Tensor] | None = None, mem_len: int | None = None, clamp_len: int | None = None,
            prompt_chunk: int | None = None, every_position: bool = False,
            each_segment: Callable[[int, Tensor], None] | None = None) -> tuple[Tensor, list[Tensor]]:
    """Read ``input_ids`` after ``mems`` (in segments of ``prompt_chunk``, default ``tgt_len``), in eval mode without
    a gradient: the step :func:`stream` takes for a prompt (and, with one token, for every new token), for callers
    that choose tokens themselves (a server batching the rows of several requests).

    Returns ``(log_probs, mems)``: the next-token log-probabilities ``[B, V]`` after the last position, and the
    memories of every position read. ``each_segment(start, table)``: called with each segment's log-probabilities
    ``table [B, L, V]`` (positions ``start .. start + L - 1`` of ``input_ids``), which are dropped after the call, so
    at most one segment's table is held (``L x V`` floats per row); the ``[B, V]`` returned is then a copy of the
    last row. ``every_position`` returns ``[B, T, V]`` instead, the tables of every position (``T x V`` floats per
    row: 8.8 GB for 8,192 tokens of a 267,735-word vocabulary; for short texts only).
    """
    if every_position and each_segment is not None:
        raise ConfigError("give every_position or each_segment, not both")
    ids = _as_ids(model, input_ids)
    lengths = _lengths(model, mem_len, clamp_len)
    chunk = check_int("prompt_chunk", model.config.tgt_len if prompt_chunk is None else prompt_chunk, 1)
    _check_mems(model, mems, ids.size(0))
    rec = Recurrence(model, lengths, mems=list(mems or []))
    segments = [ids[:, i:i + chunk] for i in range(0, ids.size(1), chunk)]
    if each_segment is None and not every_position:
        return _next_log_probs(model, rec, segments), rec.mems
    if every_position:
        with eval_mode(model), torch.no_grad():
            log_probs = torch.cat([model.log_prob(rec(x).hidden) for x in segments], 1)  # [B, T, V]
        return log_probs, rec.mems
    with eval_mode(model), torch.no_grad():
        for i, x in enumerate(segments):
            table = model.log_prob(rec(x).hidden)  # [B, L, V]
            each_segment(i * chunk, table)
            last = table[:, -1].clone()  # [B, V], not a view that would keep the segment's table
            del table  # before the next segment's is made
    return last, rec.mems


def _check_mems(model: LM, mems: list[Tensor] | None, batch: int) -> None:
    if mems and (len(mems) != model.config.n_layer + 1 or mems[0].size(0) != batch):
        raise ConfigError(f"mems must be {model.config.n_layer + 1} tensors with batch size {batch}")


def _next_log_probs(model: LM, rec: Recurrence | OnnxRecurrence, segments: Iterable[Tensor]) -> Tensor:
    """Feed ``segments`` to ``rec`` in eval mode without a gradient; the next-token log-probabilities ``[B, V]``.

    The modes are entered per call, not across the generator's ``yield``: the caller's code between two steps
    (and another generation over the same model) runs in its own mode."""
    if isinstance(rec, OnnxRecurrence):
        return rec.next_log_probs(segments)
    with eval_mode(model), torch.no_grad():
        for x in segments:
            hidden = rec(x).hidden
        return model.log_prob(hidden[:, -1])


def _stream(model: LM, ids: Tensor, *, max_new_tokens: int, do_sample: bool, temperature: float,
            top_k: int, top_p: float, min_p: float, penalties: Penalties, rec: Recurrence | OnnxRecurrence, chunk: int,
            stop: Tensor, pad: int | None, generator: torch.Generator | None,
            decoding: _Decoding) -> Iterator[GenerationStep]:
    log_probs = _next_log_probs(model, rec, (ids[:, i:i + chunk] for i in range(0, ids.size(1), chunk)))  # [B, V]
    finished = torch.zeros(ids.size(0), dtype=torch.bool, device=ids.device)
    history = ids  # [B, t] the text so far (what the penalties look at)
    for i in range(max_new_tokens):
        scores = penalize(log_probs, history, penalties)
        tok = choose_next(scores, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                          min_p=min_p, generator=generator)  # [B]
        lp = log_probs.gather(1, tok[:, None])[:, 0]  # [B] (log_probs was made without a gradient)
        if stop.numel():
            tok = tok.masked_fill(finished, int(stop[0]) if pad is None else pad)
            lp = lp.masked_fill(finished, 0.0)
            finished = finished | torch.isin(tok, stop)
        if penalties.active:
            history = torch.cat([history, tok[:, None]], 1)
        yield GenerationStep(index=i, tokens=tok, log_probs=lp, finished=finished.clone(), mems=rec.mems)
        if i + 1 == max_new_tokens or bool(finished.all()):
            break
        log_probs = decoding(rec, tok, max_new_tokens - i - 2)


def generate(model: LM, input_ids: Tensor | Sequence[int] | Sequence[Sequence[int]],
             **kwargs) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` ids after ``input_ids``; arguments as :func:`stream`.

    Returns a :class:`GenerationOutput` with the prompt plus new ids, their log-probabilities and the
    final memories (to continue, feed ``out.sequences[:, -1:]`` with ``mems=out.mems``).
    """
    ids = _as_ids(model, input_ids)
    toks: list[Tensor] = []
    lps: list[Tensor] = []
    mems: list[Tensor] = list(kwargs.get("mems") or [])
    finished = torch.zeros(ids.size(0), dtype=torch.bool, device=ids.device)
    for step in stream(model, ids, **kwargs):
        toks.append(step.tokens)
        lps.append(step.log_probs)
        mems, finished = step.mems, step.finished
    new = torch.stack(toks, 1) if toks else ids.new_zeros(ids.size(0), 0)
    log_probs = torch.stack(lps, 1) if lps else torch.zeros(ids.size(0), 0, device=ids.device)
    return GenerationOutput(sequences=torch.cat([ids, new], 1), log_probs=log_probs, mems=mems,
                            finished=finished, prompt_length=ids.size(1))


# ---------------------------------------------------------------------------------------------- reference
def reference_generate(model: TransformerXLLM, input_ids: Tensor | Sequence[int] | Sequence[Sequence[int]],
                       max_new_tokens: int, *, mode: str = "full", mem_len: int | None = None,
                       prompt_chunk: int | None = None, do_sample: bool = False, temperature: float = 1.0,
                       top_k: int = 0, top_p: float = 1.0, seed: int | None = None) -> tuple[Tensor, Tensor]:
    """Decoding that recomputes every step from scratch (slow: the tests' oracle, the benchmark's baseline).

    ``mode="full"``: each step is one forward, without memory, over the whole context (prompt and every
    token so far). It equals incremental decoding when ``mem_len`` covers the whole text and the
    attention is relative (``attn_type`` 0 or 1): every position then sees exactly its whole past.

    ``mode="replay"``: each step starts from empty memories and replays the whole history with the
    segmentation :func:`generate` uses (the prompt in segments of ``prompt_chunk``, then one token per
    segment), so every position attends to the same keys as in incremental decoding, for any ``mem_len``.

    Greedy by default; sampling options as :func:`stream` (same seed, same draws). Returns
    ``(new_ids [B, N], log_probs [B, N])``.
    """
    if mode not in ("full", "replay"):
        raise ConfigError(f"mode must be 'full' or 'replay', got {mode!r}")
    check_sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p)
    ids = _as_ids(model, input_ids)
    gen = torch.Generator(device=ids.device).manual_seed(seed) if do_sample and seed is not None else None
    lengths = model.config.lengths(mem_len=mem_len, ext_len=0)
    chunk = model.config.tgt_len if prompt_chunk is None else prompt_chunk
    toks: list[Tensor] = []
    lps: list[Tensor] = []
    with eval_mode(model), torch.no_grad():
        seq = ids
        for _ in range(max_new_tokens):
            if mode == "full":
                hidden = model(seq, lengths=lengths).hidden
            else:
                rec = Recurrence(model, lengths, inference_cache=False)
                for start in range(0, ids.size(1), chunk):
                    hidden = rec(ids[:, start:start + chunk]).hidden
                for t in range(ids.size(1), seq.size(1)):
                    hidden = rec(seq[:, t:t + 1]).hidden
            log_probs = model.log_prob(hidden[:, -1])
            tok = choose_next(log_probs, do_sample=do_sample, temperature=temperature, top_k=top_k,
                              top_p=top_p, generator=gen)
            toks.append(tok)
            lps.append(log_probs.gather(1, tok[:, None])[:, 0])
            seq = torch.cat([seq, tok[:, None]], 1)
    if not toks:
        return ids.new_zeros(ids.size(0), 0), torch.zeros(ids.size(0), 0)
    return torch.stack(toks, 1), torch.stack(lps, 1)
