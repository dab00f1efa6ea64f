"""Ablations of paper Table 6 (recurrence x encoding x loss) and Table 10 (equal GPU memory), at a chosen scale.

Every variant is the same model size trained the same way on the same data; what changes:

* **recurrence**: memories carried between training segments (``mem_len = tgt_len``) or not (``mem_len = 0``);
* **encoding**: ``ours`` (attn_type 0), ``shaw`` (1, Shaw et al. 2018), ``vaswani`` (2, absolute sinusoid),
  ``alrfou`` (3, learned absolute per layer, Al-Rfou et al. 2018);
* **loss**: ``full`` (cross entropy on every position of the segment) or ``half`` (only on the second half,
  as Al-Rfou et al.: "half losses exclude positions with very short attention lengths during training").
  Implemented here by averaging the per-token NLL over the last ``tgt_len // 2`` positions.

**Variant sets** (:data:`VARIANT_SETS`). ``table6``: the nine rows of the paper's Table 6 (its WikiText-103
blocks). ``table6-core``: three of them (Ours, Ours with Shaw et al. encodings, Ours without recurrence) on the
dataset given. The paper's Table 7 has these three rows but on One Billion Word, a corpus of shuffled sentences
with no long-range dependency, so that only the context fragmentation within a sentence stream is tested; it
was not run here (the name ``table7`` is refused with a pointer, :data:`RETIRED_SETS`). ``table10``: the
paper's Table 10 (Appendix A: Transformer-XL with backprop length 128 and memory 128 against no recurrence
with 176 / 172 "under the same GPU memory constraints"), at equal **measured** peak memory: the peak of one
Transformer-XL training step (``tgt_len = mem_len = T``, the run's batch) is measured and each
no-recurrence row trains with the longest segment whose peak stays within it
(:mod:`transformer_xl.experiments.equal_memory`; the allocator peak on CUDA, the bytes saved for backward plus
parameters, gradients, Adam moments and memories on CPU). Each no-recurrence row is trained twice: for the
run's ``steps`` (equal steps, so more training tokens than Transformer-XL) and for ``round(steps * T / L)``
steps (``-eqtok``: the same number of training tokens as Transformer-XL). ``table10-ratio``: the paper's
length ratios instead (``T * 176/128`` full, ``T * 172/128`` half), also at equal steps and equal tokens.
Every row stores ``train_steps`` and ``train_tokens``.

**Evaluation** of each variant on the validation split (batch 10, the official ``eval.py`` scoring,
:func:`transformer_xl.inference.evaluate`):

* **PPL init**: the training lengths, as the model was trained (``same_length`` off). Recurrence:
  ``tgt_len = mem_len = T`` (a query reads ``T+1 .. 2T`` keys; attention length ``2T``). No recurrence, full
  loss: ``tgt_len = T``, no memory (``1 .. T`` keys; ``T``). No recurrence, half loss: ``tgt_len = T/2`` with
  ``ext_len = T/2`` (``T/2+1 .. T`` keys, the positions it was trained on; ``T``).
* **Attention-length search**, as the official evaluation scripts: ``same_length = True``, ``tgt_len = T``,
  ``mem_len = A``, so every query reads exactly ``A`` keys, ``A`` being the attention length.
  :func:`search_attention_length` evaluates ``A = T, 2T, 4T, ...`` while the loss improves by more than the
  tolerance (up to ``max_len``), then bisects between evaluated lengths (below ``T`` too) until the shortest
  length within the tolerance of the best loss is known to ``step`` positions. Learned absolute encodings
  (attn_type 3) are searched only where every key has a learned position (``A + T <= tgt_len + mem_len`` of
  training): not at all for a model trained without memory.
* **PPL best** is the lowest loss of all these evaluations (init included: an absolute encoding given more
  keys than in training only gets worse), and **Attn Len** the shortest attention length whose loss is within
  ``rel_tol x`` that best loss (``rel_tol`` 0.001 by default); ``tried`` keeps every evaluation.
* **Window** (no-recurrence rows only): the vanilla evaluation of the paper's Sec. 3.1, every token predicted
  from its own window of exactly ``L`` previous tokens (``L`` = the training ``tgt_len``; stride 1, no memory:
  :func:`transformer_xl.inference.window.evaluate_sliding_window`), over the same first ``max_tokens + 1`` tokens (every
  token but the first is scored, where the memory evaluation scores ``(N // 10 - 1) x 10``).

**Seeds**: every variant is trained once per seed into ``OUT/seed<k>/<variant>/``;
:func:`transformer_xl.experiments.ablation_report.aggregate` gives, per variant, the mean and the sample standard
deviation (``ddof = 1``; none for one seed) with the minimum and maximum of PPL init, PPL best, window PPL and
Attn Len (and of the losses, from which bpc is ``loss / ln 2``).

Training is :class:`transformer_xl.train.Trainer` (the loop of ``txl train``: Adam, the official linear warm-up then
cosine schedule, gradient clipping 0.25, memories carried; ``half_loss`` for the Half rows) into
``OUT/seed<k>/<variant>/run/`` on the chosen device, checkpointed so that an interrupted variant resumes where
it stopped. Each finished variant leaves ``config.json``, ``model.safetensors`` and ``result.json`` there; a
re-run skips finished variants.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from transformer_xl.data import Corpus
from transformer_xl.errors import ConfigError, check_int
from transformer_xl.experiments import equal_memory as EM
from transformer_xl.experiments.attn_search import AttnSearch, search_attention_length
from transformer_xl.experiments.grid import run_seed_grid
from transformer_xl.inference.evaluate import evaluate
from transformer_xl.inference.window import evaluate_sliding_window
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.store import layout as L
from transformer_xl.store.checkpoint import list_checkpoints
from transformer_xl.store.files import read_json, write_json
from transformer_xl.store.layout import RunDir
from transformer_xl.train import TrainConfig, Trainer
from transformer_xl.train.plot import read_metrics

ENCODINGS = {"ours": 0, "shaw": 1, "vaswani": 2, "alrfou": 3}
ENCODING_NAMES = {"ours": "Ours", "shaw": "Shaw et al. (2018)", "vaswani": "Vaswani et al. (2017)",
                  "alrfou": "Al-Rfou et al. (2018)"}


@dataclass(frozen=True)
class Variant:
    """One ablation row: recurrence, encoding, loss, and the training segment length relative to ``T``."""

    recurrence: bool
    encoding: str
    loss: str  # "full" | "half"
    length_scale: float = 1.0  # training tgt_len = round(T * length_scale)
    equal_memory: bool = False  # training tgt_len: the longest whose peak memory fits Transformer-XL's
    equal_tokens: bool = False  # train round(steps * T / tgt_len) steps: Transformer-XL's number of tokens

    def __post_init__(self) -> None:
        if self.equal_memory and (self.recurrence or self.length_scale != 1.0):
            raise ConfigError(f"{self.name}: equal memory is a length for a model without recurrence")

    @property
    def name(self) -> str:
        scale = "" if self.length_scale == 1.0 else f"-x{self.length_scale:g}"
        return (f"{'rec' if self.recurrence else 'norec'}-{self.encoding}-{self.loss}{scale}"
                f"{'-eqmem' if self.equal_memory else ''}{'-eqtok' if self.equal_tokens else ''}")


def _v(text: str) -> Variant:
    return parse_variant(text)


def parse_variant(text: str) -> Variant:
    """``rec-ours-full``, ``norec-alrfou-half``, ``norec-ours-full-x1.375``, ``norec-ours-full-eqmem-eqtok``."""
    parts = text.split("-")
    try:
        rec, enc, loss, *mods = parts
        if rec not in ("rec", "norec") or enc not in ENCODINGS or loss not in ("full", "half"):
            raise ValueError
        scale = float(mods.pop(0)[1:]) if mods and mods[0].startswith("x") else 1.0
        eqmem = bool(mods) and mods[0] == "eqmem" and bool(mods.pop(0))
        eqtok = bool(mods) and mods[0] == "eqtok" and bool(mods.pop(0))
        if mods or not (math.isfinite(scale) and scale > 0):
            raise ValueError
    except ValueError:
        raise ConfigError(f"bad variant {text!r}: expected rec|norec-{'|'.join(ENCODINGS)}-full|half"
                          "[-xSCALE|-eqmem][-eqtok], e.g. norec-alrfou-half") from None
    return Variant(rec == "rec", enc, loss, scale, eqmem, eqtok)


TABLE6 = tuple(_v(n) for n in ("rec-ours-full", "rec-shaw-full", "rec-ours-half", "norec-ours-full",
                                "norec-ours-half", "norec-shaw-full", "norec-shaw-half", "norec-vaswani-half",
                                "norec-alrfou-half"))
TABLE6_CORE = tuple(_v(n) for n in ("rec-ours-full", "rec-shaw-full", "norec-ours-full"))
TABLE10 = tuple(_v(n) for n in ("rec-ours-full", "rec-ours-half", "norec-ours-full-eqmem", "norec-ours-half-eqmem",
                                 "norec-ours-full-eqmem-eqtok", "norec-ours-half-eqmem-eqtok"))
TABLE10_RATIO = tuple(_v(n) for n in ("rec-ours-full", "rec-ours-half", "norec-ours-full-x1.375",
                                       "norec-ours-half-x1.34375", "norec-ours-full-x1.375-eqtok",
                                       "norec-ours-half-x1.34375-eqtok"))
VARIANT_SETS = {"table6": TABLE6, "table6-core": TABLE6_CORE, "table10": TABLE10, "table10-ratio": TABLE10_RATIO}
RETIRED_SETS = {"table7": "the paper's Table 7 is on One Billion Word, which was not run; its three rows on the "
                          "dataset given are --variants table6-core (Table 6 rows, not Table 7)"}


def variant_set(text: str) -> list[Variant]:
    """A set name of :data:`VARIANT_SETS` or a comma-separated list of variant names."""
    if text in RETIRED_SETS:
        raise ConfigError(f"--variants {text}: {RETIRED_SETS[text]}")
    if text in VARIANT_SETS:
        return list(VARIANT_SETS[text])
    return [parse_variant(v.strip()) for v in text.split(",")]


def variant_config(base: TXLConfig, v: Variant, tgt_len: int, *, train_len: int | None = None) -> TXLConfig:
    """The model config of a variant: ``base`` size, the variant's encoding and lengths (``train_len``: the
    training segment of an equal-memory variant, measured by the caller)."""
    if v.equal_memory and train_len is None:
        raise ConfigError(f"{v.name}: the equal-memory length must be measured first (train_len)")
    tgt = train_len if train_len is not None else max(2, round(tgt_len * v.length_scale))
    return base.replace(attn_type=ENCODINGS[v.encoding], tgt_len=tgt, mem_len=tgt if v.recurrence else 0, ext_len=0,
                        same_length=False, untie_r=base.untie_r and v.encoding == "ours")


def variant_steps(v: Variant, steps: int, tgt_len: int, train_len: int) -> int:
    """Training steps: ``steps``, or for ``-eqtok`` the steps that read as many tokens as ``steps`` of length T."""
    return max(1, round(steps * tgt_len / train_len)) if v.equal_tokens else steps


# ---------------------------------------------------------------------------------------------- training
#: What a run writes in its directory before its first checkpoint (and its lock and temporaries, hidden names).
RUN_ENTRIES = frozenset({L.CONFIG, L.VOCAB, L.METRICS, L.RESULTS, L.CHECKPOINTS, L.BEST, L.FINAL, L.EVENTS,
                         L.WANDB, L.LOGGERS})


def clear_unstarted_run(root: Path) -> None:
    """Remove a variant's run that stopped before its first checkpoint -- only what a run writes: the entries of
    :data:`RUN_ENTRIES`, the run lock and txl's temporaries of them (``.NAME.*.tmp``, ``.NAME.old``). A path that
    is not a directory, or one that holds anything else (a ``.git``, an ``.env``), is a one-line
    :class:`ConfigError`, and nothing is removed."""
    from transformer_xl.store.lock import LOCK

    def ours(name: str) -> bool:
        if name in RUN_ENTRIES or name == LOCK:
            return True
        if name[:1] != "." or not name.endswith((".tmp", ".old")):  # a hidden name is the user's (.git, .env)
            return False
        stem, _, rand = name[1:-4].rpartition(".")  # .NAME.old, or .NAME.RANDOM.tmp (mkstemp/mkdtemp)
        if name.endswith(".old"):
            return name[1:-4] in RUN_ENTRIES
        return stem in RUN_ENTRIES and rand.replace("_", "a").isalnum()

    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory: give the experiment another --out")
    if foreign := sorted(p.name for p in root.iterdir() if not ours(p.name)):
        raise ConfigError(f"{root} holds files a training run did not write ({', '.join(foreign[:3])}): "
                          "move them, or give the experiment another --out")
    shutil.rmtree(root)


def train_variant(cfg: TXLConfig, corpus: Corpus, run_dir: str | Path, *, steps: int, batch_size: int = 16,
                  lr: float = 1e-3, warmup: int = 50, half_loss: bool = False, clip: float = 0.25, seed: int = 0,
                  max_minutes: float | None = None, eval_tokens: int | None = None, device: str = "cpu",
                  progress: bool = False) -> tuple[TransformerXLLM, dict[str, Any]]:
    """Train ``cfg`` on ``corpus`` with :class:`transformer_xl.train.Trainer` on ``device`` into ``run_dir`` (resumed
    when it
    holds a checkpoint). Returns the model (eval mode) and a log: steps, training tokens, minutes, why it
    stopped, the loss every 50 steps."""
    run = RunDir(run_dir)
    resume = run.root if list_checkpoints(run.checkpoints) else None
    if resume is None and run.root.exists():  # started but stopped before its first checkpoint: nothing to keep
        clear_unstarted_run(run.root)
    overrides = {k: v for k, v in cfg.to_dict().items() if k != "n_token"}
    tc = TrainConfig(dataset=corpus.name, model="tiny", model_overrides=overrides, out_dir=str(run.root),
                     batch_size=batch_size, lr=lr, warmup_step=warmup, max_step=steps, clip=clip, seed=seed,
                     half_loss=half_loss, max_minutes=max_minutes, eval_interval=steps, eval_max_tokens=eval_tokens,
                     save_interval=max(1, steps // 10), keep_checkpoints=1, log_interval=min(50, steps),
                     final_eval=False, progress=progress, device=device)
    trainer = Trainer(tc, resume=resume, corpus=corpus)
    summary = trainer.fit()
    history = [{"step": r["step"], "loss": r["train_loss"], "minutes": r["time"] / 60}
               for r in read_metrics(run.root) if r.get("kind") == "train"]
    return trainer.model.eval(), {"steps": summary["step"], "tokens": trainer.tokens, "minutes": summary["minutes"],
                                  "stopped": summary["stopped"], "history": history}


# ---------------------------------------------------------------------------------------------- evaluation
def _init_lengths(v: Variant, cfg: TXLConfig) -> dict[str, Any]:
    T = cfg.tgt_len
    if v.recurrence:
        return dict(tgt_len=T, mem_len=T, ext_len=0, attn_len=2 * T)
    if v.loss == "half":
        return dict(tgt_len=T - T // 2, mem_len=0, ext_len=T // 2, attn_len=T)
    return dict(tgt_len=T, mem_len=0, ext_len=0, attn_len=T)


def evaluate_variant(model: TransformerXLLM, v: Variant, data: np.ndarray, search: AttnSearch, *,
                     batch_size: int = 10, max_tokens: int | None = None, window: bool | None = None,
                     device: Any = None) -> dict[str, Any]:
    """PPL init, PPL best and Attn Len (the ``same_length`` search), and for no-recurrence rows (or ``window``)
    the stride-1 window PPL at the training length (module docstring)."""
    cfg = model.config
    T = cfg.tgt_len
    init = _init_lengths(v, cfg)
    lengths = {k: init[k] for k in ("tgt_len", "mem_len", "ext_len")}
    res = evaluate(model, data, batch_size=batch_size, max_tokens=max_tokens, same_length=False, device=device,
                   **lengths)
    tried = [{"attn_len": init["attn_len"], **lengths, "same_length": False, "loss": res.loss}]
    max_len = search.max_len if cfg.max_context is None else min(search.max_len, cfg.max_context - T)
    found = None
    if max_len >= 1:  # attn_type 3 trained without memory: no length with a learned position for every key

        def loss_at(a: int) -> float:
            r = evaluate(model, data, batch_size=batch_size, max_tokens=max_tokens, tgt_len=T, mem_len=a, ext_len=0,
                         same_length=True, device=device)
            tried.append({"attn_len": a, "tgt_len": T, "mem_len": a, "ext_len": 0, "same_length": True,
                          "loss": r.loss})
            return r.loss

        found = search_attention_length(loss_at, start=min(T, max_len), step=search.step, max_len=max_len,
                                        rel_tol=search.rel_tol)
    best = min(t["loss"] for t in tried)
    within = [t for t in tried if t["loss"] <= best + search.rel_tol * abs(best)]
    pick = min(within, key=lambda t: (t["attn_len"], t["same_length"]))
    out = {"loss_init": res.loss, "ppl_init": math.exp(res.loss), "attn_len_init": init["attn_len"],
           "loss_best": best, "ppl_best": math.exp(best), "attn_len_best": pick["attn_len"],
           "best_from": "search" if pick["same_length"] else "init", "tokens": res.tokens,
           "attn_search": {"same_length": True, "eval_tgt_len": T, "start": min(T, max_len) if found else None,
                           "step": search.step, "max_len": max_len, "rel_tol": search.rel_tol,
                           "censored": bool(found and found["censored"])},
           "tried": tried}
    if (not v.recurrence) if window is None else window:
        w = evaluate_sliding_window(model, data, window=T, max_tokens=max_tokens, device=device)
        out.update(loss_window=w.loss, ppl_window=math.exp(w.loss), window_len=T, window_tokens=w.tokens)
    else:
        out.update(loss_window=None, ppl_window=None, window_len=None, window_tokens=None)
    return out


# ---------------------------------------------------------------------------------------------- equal memory
def _mem_key(v: Variant) -> str:
    """The equal-memory length is shared by a variant and its ``-eqtok`` twin."""
    return Variant(False, v.encoding, v.loss, equal_memory=True).name


def equal_memory_lengths(base: TXLConfig, variants: Sequence[Variant], *, tgt_len: int, batch_size: int,
                         device: str = "cpu", method: str | None = None) -> dict[str, Any]:
    """For each equal-memory variant: Transformer-XL's measured peak (same encoding and loss, ``tgt_len =
    mem_len = T``) and the longest no-recurrence segment within it (:mod:`transformer_xl.experiments.equal_memory`),
    under ``lengths[<variant without -eqtok>]``."""
    method = method or EM.default_method(device)
    out: dict[str, Any] = {"method": method, "device": device, "batch_size": batch_size, "tgt_len": tgt_len,
                           "lengths": {}}
    for v in variants:
        if not v.equal_memory or _mem_key(v) in out["lengths"]:
            continue
        xl = Variant(True, v.encoding, v.loss)
        half = v.loss == "half"
        target = EM.training_step_bytes(variant_config(base, xl, tgt_len), batch_size, half_loss=half,
                                        device=device, method=method)

        def measure(n: int, v: Variant = v, half: bool = half) -> int:
            cfg = variant_config(base, v, tgt_len, train_len=n)
            return EM.training_step_bytes(cfg, batch_size, half_loss=half, device=device, method=method)["bytes"]

        length, tried = EM.longest_within(measure, target["bytes"], start=tgt_len)
        out["lengths"][_mem_key(v)] = {"length": length, "bytes": dict(tried)[length], "target_variant": xl.name,
                                       "target_bytes": target["bytes"], "target": target, "tried": tried}
    return out


def _equal_memory(out: Path, base: TXLConfig, variants: Sequence[Variant], *, tgt_len: int, batch_size: int,
                  device: str, log: Callable[[str], None] | None) -> dict[str, Any] | None:
    """The equal-memory lengths of this run: measured once, kept in ``OUT/equal-memory.json`` for every seed."""
    if not any(v.equal_memory for v in variants):
        return None
    path = out / "equal-memory.json"
    key = {"model": base.to_dict(), "tgt_len": tgt_len, "batch_size": batch_size,
           "method": EM.default_method(device)}
    if path.is_file():
        doc = read_json(path, f"equal-memory lengths {path}")
        if doc["key"] != key:
            raise ConfigError(f"{path} was measured for another model, T, batch or memory method; use a new --out")
        missing = [v for v in variants if v.equal_memory and _mem_key(v) not in doc["lengths"]]
        if not missing:
            return doc
    if log is not None:
        log(f"measuring peak training memory ({key['method']} on {device}) for the equal-memory lengths")
    doc = {"key": key, **equal_memory_lengths(base, variants, tgt_len=tgt_len, batch_size=batch_size, device=device)}
    write_json(path, doc, sort_keys=False)
    if log is not None:
        for name, e in doc["lengths"].items():
            log(f"{name}: tgt_len {e['length']} ({e['bytes'] / 2**20:.1f} MiB) within {e['target_variant']}'s "
                f"{e['target_bytes'] / 2**20:.1f} MiB")
    return doc


def read_equal_memory(out_dir: str | Path) -> dict[str, Any] | None:
    """``OUT/equal-memory.json`` (the measured lengths of a run), or None when the run measured none."""
    path = Path(out_dir) / "equal-memory.json"
    return read_json(path, f"equal-memory lengths {path}") if path.is_file() else None


# ---------------------------------------------------------------------------------------------- the experiment
def run_ablation(base: TXLConfig, corpus: Corpus, out_dir: str | Path, variants: Sequence[Variant] = TABLE6, *,
                 tgt_len: int, steps: int, search: AttnSearch, seeds: Sequence[int] = (0,), batch_size: int = 16,
                 lr: float = 1e-3, warmup: int = 50, eval_tokens: int | None = None, max_minutes: float | None = None,
                 device: str = "cpu", log: Callable[[str], None] | None = None,
                 progress: bool = True) -> list[dict[str, Any]]:
    """Train and evaluate (on ``corpus``'s valid split) every variant of every seed not yet finished under
    ``out_dir`` (``OUT/seed<k>/<variant>/``); returns all rows, seed by seed (resumable). SIGTERM or Ctrl-C stop a
    variant's training at a checkpoint and raise ``KeyboardInterrupt``; ``max_minutes`` stops each variant's
    training and evaluates it as it is. With ``log``, each training shows its progress (a bar on a terminal
    when ``progress``, else a line every ``log_interval``)."""
    check_int("steps", steps, 1)
    if not seeds:
        raise ConfigError("at least one seed is needed")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    eqmem = _equal_memory(out, base, variants, tgt_len=tgt_len, batch_size=batch_size, device=device, log=log)

    def lengths(v: Variant) -> tuple[TXLConfig, dict[str, Any] | None]:
        mem = eqmem["lengths"][_mem_key(v)] if v.equal_memory and eqmem else None
        return variant_config(base, v, tgt_len, train_len=mem["length"] if mem else None), mem

    def train(seed: int, v: Variant, run_dir: Path, label: str) -> tuple[TransformerXLLM, dict[str, Any]]:
        cfg = lengths(v)[0]
        n_steps = variant_steps(v, steps, tgt_len, cfg.tgt_len)
        if log is not None:
            log(f"{label}: training {n_steps} steps on {device} (tgt_len {cfg.tgt_len}, mem_len {cfg.mem_len}, "
                f"attn_type {cfg.attn_type}, {v.loss} loss)")
        return train_variant(cfg, corpus, run_dir, steps=n_steps, batch_size=batch_size, lr=lr, warmup=warmup,
                             half_loss=v.loss == "half", seed=seed, max_minutes=max_minutes, eval_tokens=eval_tokens,
                             device=device, progress=log is not None and progress)

    def row(seed: int, v: Variant, model: TransformerXLLM, train_log: dict[str, Any]) -> dict[str, Any]:
        cfg, mem = lengths(v)
        ev = evaluate_variant(model, v, corpus.splits["valid"], search, max_tokens=eval_tokens)
        return {"variant": v.name, "seed": seed, "recurrence": v.recurrence, "encoding": v.encoding, "loss": v.loss,
                "train_tgt_len": cfg.tgt_len, "train_mem_len": cfg.mem_len, "params": model.num_parameters(),
                "train_steps": train_log["steps"], "train_batch_size": batch_size, "train_tokens": train_log["tokens"],
                "train_minutes": round(train_log["minutes"], 2), "device": device, **ev,
                "equal_memory": mem and {k: mem[k] for k in ("bytes", "target_variant", "target_bytes")},
                "train_history": train_log["history"]}

    def done(r: dict[str, Any]) -> str:
        window = f", window {r['ppl_window']:.3f} (L {r['window_len']})" if r["ppl_window"] else ""
        return (f"ppl init {r['ppl_init']:.3f} (attn {r['attn_len_init']}), best {r['ppl_best']:.3f} "
                f"(attn len {r['attn_len_best']}){window}")

    return run_seed_grid(out, variants, seeds, name=lambda v: v.name, train=train, evaluate=row, vocab=corpus.vocab,
                         done=done, log=log)
