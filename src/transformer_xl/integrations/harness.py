"""The model backend ``transformer-xl`` of EleutherAI's lm-evaluation-harness (``lm_eval`` 0.4.x).

Installed with the ``eval`` extra (``pip install -e '.[eval]'`` in the checkout). The harness 0.4 looks models up in its
own registry and reads no plugin entry point, so ``txl-lm-eval`` (or ``python -m transformer_xl.integrations.harness``)
registers this backend and then runs the harness's own command line with the arguments given::

    txl-lm-eval --model transformer-xl --model_args pretrained=runs/wt2,mem_len=640,batch_size=8 --tasks wikitext

In Python, importing this module registers it (when ``lm_eval`` is installed) for ``lm_eval.simple_evaluate``.
The three requests of the harness:

* ``loglikelihood(context, continuation)``: the stream ``start symbol + context + continuation`` is read in segments
  of ``tgt_len`` with the memory of the ``mem_len`` positions before (a context longer than a segment goes through
  the model segment by segment, not truncated); the continuation's log-probability and whether each of its tokens
  was the most likely one. Requests are scored ``batch_size`` at a time (padded and masked).
* ``loglikelihood_rolling(document)``: the document read as a text file, each line ending with its end-of-line
  symbol: the ``total_log_prob`` that ``txl score --documents`` gives it.
* ``generate_until(context, gen_kwargs)``: :meth:`TransformerXLLM.stream` after the context, up to ``max_gen_toks``
  tokens, cut at the first ``until`` string.

Strings become ids as :mod:`transformer_xl.inference.lines` describes (the model's own corpus rules).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

from transformer_xl.errors import ConfigError, DataError, TXLError, install_hint
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.inference.loading import load_model
from transformer_xl.inference.score import score_ids
from transformer_xl.safejson import short_repr

try:  # the core package does not need the harness: without it, the backend is a plain class
    from lm_eval.api.model import LM as _Base
except ImportError:  # pragma: no cover - depends on the environment
    _Base = object  # type: ignore[assignment,misc]

__all__ = ["MODEL_NAME", "MODEL_NAMES", "TransformerXLHarness", "main", "register"]

#: The name the backend is registered under (``--model transformer-xl``).
MODEL_NAME = "transformer-xl"
#: Every name it is registered and declared under (``--model txl`` as well): pyproject.toml's ``lm_eval.models``.
MODEL_NAMES = (MODEL_NAME, "txl")


def _flag(name: str, value: Any) -> bool | None:
    """A boolean model argument: ``true``/``false`` (any case), 1/0, or a bool; None stays None."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"{name} must be true or false, got {value!r}")


def _integer(name: str, value: Any, minimum: int) -> int | None:
    """An integer model argument (the harness passes numbers as int, or as text); None stays None."""
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {number}")
    return number


def _device(device: str | None) -> str:
    """The torch device to run on: ``device``, except that a CUDA device (the harness's default ``cuda:0``) falls
    back to the CPU, with a note on stderr, where CUDA is not available."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        print(f"transformer-xl: device {device} asked for but CUDA is not available; using the CPU", file=sys.stderr)
        return "cpu"
    return str(device)


class TransformerXLHarness(_Base):  # type: ignore[misc,valid-type]
    """A txl model answering the harness's requests (see the module docstring).

    ``pretrained``: a model, checkpoint or run directory, or a Hub id. ``mem_len``, ``clamp_len``,
    ``same_length``, ``tgt_len``: the evaluation lengths (default: the model's). ``batch_size``: requests scored
    side by side (``auto`` is taken as 16). ``level``/``tokenizer``/``vocab``: as ``txl score``.
    """

    def __init__(self, pretrained: str, mem_len: Any = None, clamp_len: Any = None, same_length: Any = None,
                 tgt_len: Any = None, batch_size: Any = 1, device: str | None = None, level: str | None = None,
                 tokenizer: str | None = None, vocab: str | None = None, **ignored: Any) -> None:
        if _Base is not object:
            super().__init__()
        self.model, directory = load_model(str(pretrained), device=_device(device))
        self.encoder = LineEncoder.for_model(directory, vocab=vocab, level=level, tokenizer=tokenizer)
        if len(self.encoder.vocab) != self.model.config.n_token:
            raise ConfigError(f"the vocabulary has {len(self.encoder.vocab)} symbols but the model predicts "
                              f"{self.model.config.n_token}")
        self.lengths = dict(tgt_len=_integer("tgt_len", tgt_len, 1), mem_len=_integer("mem_len", mem_len, 0),
                            clamp_len=_integer("clamp_len", clamp_len, -1),
                            same_length=_flag("same_length", same_length))
        auto = str(batch_size).startswith("auto")
        self.batch_size = 16 if auto else _integer("batch_size", batch_size, 1) or 1

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any],
                            additional_config: dict[str, Any] | None = None) -> TransformerXLHarness:
        """The backend of ``--model_args`` (a dict): the harness's own options (``--batch_size``, ``--device``) fill
        in what the model arguments leave out, and a ``batch_size`` given in the model arguments wins."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(cls, arg_string: str,
                               additional_config: dict[str, Any] | None = None) -> TransformerXLHarness:
        """The backend of ``--model_args pretrained=DIR,mem_len=N,...`` (as :meth:`create_from_arg_obj`)."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # -- the harness's requests -----------------------------------------------------------------
    def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``(log p(continuation | context), whether every continuation token was the most likely)`` per request.

        A continuation that gives no token (empty, or only spaces for a word or character model) is refused, every
        request before any is scored, in one line (:class:`DataError`): it has no probability to measure, and
        ``(0.0, True)`` would call it certain, the best answer of any multiple choice (the harness's own
        Hugging Face backend asserts a continuation has tokens)."""
        pairs = [self.split_pair(*req.args) for req in requests]
        for n, (req, (_, cont)) in enumerate(zip(requests, pairs)):
            if not cont:
                raise DataError(f"loglikelihood request {n}: the continuation {short_repr(req.args[1])} gives no "
                                f"token at the model's {self.encoder.level} level, so it has no probability to "
                                "score; give each continuation at least one token")
        start = self.encoder.start_ids()
        scores = self._score([start + ctx + cont for ctx, cont in pairs], greedy=True, quiet=disable_tqdm)
        out = []
        for req, (_, cont), sc in zip(requests, pairs, scores):
            n = len(cont)
            greedy = sc.is_greedy[len(sc.is_greedy) - n:]  # scored with greedy=True: never None
            result = (math.fsum(sc.log_probs[len(sc.log_probs) - n:].tolist()), bool(all(greedy)))
            self._remember("loglikelihood", req, result)
            out.append(result)
        return out

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """The log-probability of each document, read as a text file (``txl score --documents``'s total)."""
        start = self.encoder.start_ids()
        streams = [start + self.encoder.text_ids(req.args[0]) for req in requests]
        # equivalent: greedy=True would also mark each token's rank (slower); the log-probabilities are the same
        scores = self._score(streams, quiet=disable_tqdm,
                             greedy=False)  # pragma: no mutate
        out = []
        for req, sc in zip(requests, scores):
            out.append(math.fsum(sc.log_probs.tolist()))
            self._remember("loglikelihood_rolling", req, out[-1])
        return out

    # equivalent: the harness's signature; generation shows no progress, so disable_tqdm's default is never read
    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:  # pragma: no mutate
        """The text generated after each context: greedy unless ``do_sample``, at most ``max_gen_toks`` tokens, cut
        before the first of the ``until`` strings."""
        return [self._generate(*req.args) for req in requests]

    # -- pieces ---------------------------------------------------------------------------------
    def split_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The ids of ``context`` and of ``continuation`` after it: the ids of the joined text past the context's
        when the context's ids begin them (always for characters and bytes; for words, when the context ends between
        two words), else each encoded alone (a word the request cuts in two is then two words)."""
        ctx = self.encoder.string_ids(context)
        whole = self.encoder.string_ids(context + continuation)
        # equivalent: with equal lengths whole == ctx, and a continuation that adds no id to it alone has none either
        if len(whole) > len(ctx) and whole[:len(ctx)] == ctx:  # pragma: no mutate
            return ctx, whole[len(ctx):]
        return ctx, self.encoder.string_ids(continuation)

    def _score(self, streams: list[list[int]], *, greedy: bool, quiet: bool) -> list[Any]:
        return score_ids(self.model, streams, batch_size=self.batch_size, greedy=greedy,
                         progress="off" if quiet else "auto", desc="transformer-xl", **self.lengths)

    def _generate(self, context: str, gen_kwargs: dict[str, Any] | None = None) -> str:
        kw = dict(gen_kwargs or {})
        until = kw.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        # sampling at temperature 0 is greedy (TransformerXLLM.stream); greedy ignores temperature and seed
        sampling = dict(do_sample=True, temperature=float(kw.get("temperature", 1.0)),
                        seed=int(kw.get("seed", 0))) if kw.get("do_sample") else {}
        ids = self.encoder.start_ids() + self.encoder.string_ids(context)
        decoder = self.encoder.codec.decoder(ids)
        text = ""
        # left out: the device of the context (the model's) only shows on a GPU
        prompt = torch.tensor([ids], device=next(self.model.parameters()).device)  # pragma: no mutate
        steps = self.model.stream(prompt, max_new_tokens=int(kw.get("max_gen_toks", 256)),
                                  mem_len=self.lengths["mem_len"], clamp_len=self.lengths["clamp_len"], **sampling)
        for step in steps:
            text += decoder.feed([int(step.tokens[0])])
            cut = [i for i in (text.find(s) for s in until if s) if i >= 0]
            if cut:
                steps.close()
                return text[:min(cut)]
        return text + decoder.flush()

    def _remember(self, kind: str, request: Any, result: Any) -> None:
        hook = getattr(self, "cache_hook", None)  # the harness's --use_cache
        if hook is not None:
            hook.add_partial(kind, request.args, result)


def register() -> None:
    """Register :class:`TransformerXLHarness` as ``transformer-xl`` and ``txl`` in the harness's model registry (once;
    the names the package's ``lm_eval.models`` entry points declare, for the harness versions that read them)."""
    from lm_eval.api.registry import model_registry

    for name in MODEL_NAMES:
        if name not in model_registry:
            model_registry.register(name, target=TransformerXLHarness)


if _Base is not object:
    register()


def main(argv: Sequence[str] | None = None) -> None:
    """``txl-lm-eval ARGS``: the harness's own command line (``lm_eval ARGS``) with ``transformer-xl`` registered."""
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        print(f"txl-lm-eval: error: the evaluation harness is not installed: {install_hint('eval')}",
              file=sys.stderr)
        raise SystemExit(2) from None
    register()
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        cli_evaluate()
    except TXLError as exc:  # our backend's refusal (a missing model, a bad model argument): one line, as txl's
        if os.environ.get("TXL_DEBUG"):
            raise
        print(f"txl-lm-eval: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":  # pragma: no cover - python -m transformer_xl.integrations.harness
    main()
