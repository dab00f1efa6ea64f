"""Ablations of paper Table 6 (recurrence x encoding x loss) and Table 10 (equal GPU memory), at a chosen scale.

Every variant is the same model size trained the same way on the same data; what changes:

* **recurrence**: memories carried between training segments (``mem_len = tgt_len``) or not (``mem_len = 0``);
* **encoding**: ``ours`` (attn_type 0), ``shaw`` (1, Shaw et al. 2018), ``vaswani`` (2, absolute sinusoid),
  ``alrfou`` (3, learned absolute per layer, Al-Rfou et al. 2018);
* **loss**: ``full`` (cross entropy on every position of the segment) or ``half`` (only on the second half,
  as Al-Rfou et al.: "half losses exclude positions with very short attention lengths during training").
  Implemented here by averaging the per-token NLL over the last ``tgt_len // 2`` positions.

Table 6 (first two blocks) is :data:`TABLE6`. Table 7 (One Billion Word, a corpus without long-range
dependency, so that only the context fragmentation within a sentence stream is tested: Ours, with Shaw et
al. encodings, without recurrence) is :data:`TABLE7`. The paper's memory-constrained comparison (its Table 10,
Appendix A: XL with backprop length 128 against no recurrence with 176 / 172 at the same GPU memory) is
:data:`TABLE10`: at our scale the no-recurrence rows train with ``tgt_len = round(T * 176 / 128)`` (full) and
``round(T * 172 / 128)`` (half) where XL trains with ``tgt_len = mem_len = T``. We match the paper's
length ratios rather than measured memory: on a CPU the peak activation memory of a segment grows with the
keys per query, which is ``2T`` for XL (``T`` of them in memory, without gradient) and ``~1.37 T`` for the
baseline, so the baseline uses less memory than XL here, never more.

Evaluation of each variant on the validation split (batch 10, the official ``eval.py`` scoring):

* **PPL init**: the training lengths. Recurrence: ``tgt_len = mem_len = T``. No recurrence, full loss:
  ``tgt_len = T``, no memory. No recurrence, half loss: ``tgt_len = T/2`` with ``ext_len = T/2`` (each scored
  token sees between ``T/2`` and ``T`` earlier tokens, the positions it was trained on).
* **PPL best**: the best over evaluation attention lengths ``A`` in the grid (``A = mem_len + tgt_len`` keys
  for the last query of a segment, ``tgt_len = T``), where the encoding allows a memory at evaluation
  (attn_type 3 only up to its learned positions); **Attn Len** is the ``A`` of that best value (``T`` or
  ``T/2 + T/2`` for the init setting, ``2T`` for XL init).

Training is :class:`txl.train.Trainer` (the loop of ``txl train``: Adam, the official linear warm-up then
cosine schedule, gradient clipping 0.25, memories carried; ``half_loss`` for the Half rows) into
``OUT/<variant>/run/``, checkpointed so that an interrupted variant resumes where it stopped. Each finished
variant leaves ``OUT/<variant>/`` (``config.json``, ``model.safetensors``, ``result.json``); a re-run skips
finished variants.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from txl.data import Corpus
from txl.errors import ConfigError, check_int
from txl.inference.evaluate import evaluate
from txl.model import TransformerXLLM, TXLConfig
from txl.store.checkpoint import list_checkpoints
from txl.store.files import read_json, write_json
from txl.store.layout import RunDir
from txl.train import TrainConfig, Trainer
from txl.train.plot import read_metrics

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

    @property
    def name(self) -> str:
        scale = "" if self.length_scale == 1.0 else f"-x{self.length_scale:g}"
        return f"{'rec' if self.recurrence else 'norec'}-{self.encoding}-{self.loss}{scale}"


TABLE6 = (
    Variant(True, "ours", "full"), Variant(True, "shaw", "full"), Variant(True, "ours", "half"),
    Variant(False, "ours", "full"), Variant(False, "ours", "half"), Variant(False, "shaw", "full"),
    Variant(False, "shaw", "half"), Variant(False, "vaswani", "half"), Variant(False, "alrfou", "half"),
)
TABLE7 = (Variant(True, "ours", "full"), Variant(True, "shaw", "full"), Variant(False, "ours", "full"))
TABLE10 = (
    Variant(True, "ours", "full"), Variant(True, "ours", "half"),
    Variant(False, "ours", "full", 176 / 128), Variant(False, "ours", "half", 172 / 128),
)


def parse_variant(text: str) -> Variant:
    """``rec-ours-full``, ``norec-alrfou-half``, ``norec-ours-full-x1.375`` -> :class:`Variant`."""
    parts = text.split("-")
    try:
        rec, enc, loss = parts[:3]
        scale = float(parts[3][1:]) if len(parts) > 3 else 1.0
        if rec not in ("rec", "norec") or enc not in ENCODINGS or loss not in ("full", "half") or len(parts) > 4:
            raise ValueError
    except (ValueError, IndexError):
        raise ConfigError(f"bad variant {text!r}: expected rec|norec-{'|'.join(ENCODINGS)}-full|half[-xSCALE], "
                          "e.g. norec-alrfou-half") from None
    return Variant(rec == "rec", enc, loss, scale)


def variant_config(base: TXLConfig, v: Variant, tgt_len: int) -> TXLConfig:
    """The model config of a variant: ``base`` size, the variant's encoding and lengths."""
    tgt = max(2, round(tgt_len * v.length_scale))
    return base.replace(attn_type=ENCODINGS[v.encoding], tgt_len=tgt, mem_len=tgt if v.recurrence else 0, ext_len=0,
                        same_length=False, untie_r=base.untie_r and v.encoding == "ours")


# ---------------------------------------------------------------------------------------------- training
def train_variant(cfg: TXLConfig, corpus: Corpus, run_dir: str | Path, *, steps: int, batch_size: int = 16,
                  lr: float = 1e-3, warmup: int = 50, half_loss: bool = False, clip: float = 0.25, seed: int = 0,
                  max_minutes: float | None = None, eval_tokens: int | None = None,
                  progress: bool = False) -> tuple[TransformerXLLM, dict[str, Any]]:
    """Train ``cfg`` on ``corpus`` with :class:`txl.train.Trainer` into ``run_dir`` (resumed when it holds a
    checkpoint). Returns the model (eval mode) and a log: steps, minutes, why it stopped, the loss every 50 steps."""
    run = RunDir(run_dir)
    resume = run.root if list_checkpoints(run.checkpoints) else None
    if resume is None and run.root.exists():  # started but stopped before its first checkpoint: nothing to keep
        shutil.rmtree(run.root)
    overrides = {k: v for k, v in cfg.to_dict().items() if k != "n_token"}
    tc = TrainConfig(dataset=corpus.name, model="tiny", model_overrides=overrides, out_dir=str(run.root),
                     batch_size=batch_size, lr=lr, warmup_step=warmup, max_step=steps, clip=clip, seed=seed,
                     half_loss=half_loss, max_minutes=max_minutes, eval_interval=steps, eval_max_tokens=eval_tokens,
                     save_interval=max(1, steps // 10), keep_checkpoints=1, log_interval=min(50, steps),
                     final_eval=False, progress=progress, tensorboard=False)
    trainer = Trainer(tc, resume=resume, corpus=corpus)
    summary = trainer.fit()
    history = [{"step": r["step"], "loss": r["train_loss"], "minutes": r["time"] / 60}
               for r in read_metrics(run.root) if r.get("kind") == "train"]
    return trainer.model.eval(), {"steps": summary["step"], "minutes": summary["minutes"],
                                  "stopped": summary["stopped"], "history": history}


# ---------------------------------------------------------------------------------------------- evaluation
def _init_lengths(v: Variant, cfg: TXLConfig) -> dict[str, Any]:
    T = cfg.tgt_len
    if v.recurrence:
        return dict(tgt_len=T, mem_len=T, ext_len=0, attn_len=2 * T)
    if v.loss == "half":
        return dict(tgt_len=T - T // 2, mem_len=0, ext_len=T // 2, attn_len=T)
    return dict(tgt_len=T, mem_len=0, ext_len=0, attn_len=T)


def evaluate_variant(model: TransformerXLLM, v: Variant, data: np.ndarray, attn_grid: Sequence[int], *,
                     batch_size: int = 10, max_tokens: int | None = None) -> dict[str, Any]:
    """PPL init and PPL best over ``attn_grid`` (module docstring)."""
    cfg = model.config
    T = cfg.tgt_len
    init = _init_lengths(v, cfg)
    lengths = {k: init[k] for k in ("tgt_len", "mem_len", "ext_len")}
    res = evaluate(model, data, batch_size=batch_size, max_tokens=max_tokens, **lengths)
    tried = [{"attn_len": init["attn_len"], **lengths, "loss": res.loss}]
    cap = cfg.max_context
    for A in attn_grid:
        mem = A - T
        if mem <= 0 or (init["attn_len"] == A and mem == init["mem_len"]) or (cap is not None and cap < A):
            continue
        r = evaluate(model, data, batch_size=batch_size, max_tokens=max_tokens, tgt_len=T, mem_len=mem, ext_len=0)
        tried.append({"attn_len": A, "tgt_len": T, "mem_len": mem, "ext_len": 0, "loss": r.loss})
    best = min(tried, key=lambda d: (round(d["loss"], 6), d["attn_len"]))
    return {"ppl_init": math.exp(res.loss), "attn_len_init": init["attn_len"], "ppl_best": math.exp(best["loss"]),
            "attn_len_best": best["attn_len"], "tokens": res.tokens, "tried": tried}


# ---------------------------------------------------------------------------------------------- the experiment
def run_ablation(base: TXLConfig, corpus: Corpus, out_dir: str | Path, variants: Sequence[Variant] = TABLE6, *,
                 tgt_len: int, steps: int, attn_grid: Sequence[int], batch_size: int = 16, lr: float = 1e-3,
                 warmup: int = 50, seed: int = 0, eval_tokens: int | None = None, max_minutes: float | None = None,
                 log: Callable[[str], None] | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Train and evaluate (on ``corpus``'s valid split) every variant not yet finished under ``out_dir``;
    returns all rows (resumable). SIGTERM or Ctrl-C stop a variant's training at a checkpoint and raise
    ``KeyboardInterrupt``; ``max_minutes`` stops each variant's training and evaluates it as it is. With ``log``,
    each training shows its progress (a bar on a terminal when ``progress``, else a line every ``log_interval``)."""
    check_int("steps", steps, 1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for v in variants:
        vdir = out / v.name
        result_path = vdir / "result.json"
        if result_path.is_file():
            rows.append(read_json(result_path, f"finished variant {result_path}"))
            if log is not None:
                log(f"{v.name}: done before, skipped")
            continue
        cfg = variant_config(base, v, tgt_len)
        if log is not None:
            log(f"{v.name}: training {steps} steps (tgt_len {cfg.tgt_len}, mem_len {cfg.mem_len}, "
                f"attn_type {cfg.attn_type}, {v.loss} loss)")
        model, train_log = train_variant(cfg, corpus, vdir / "run", steps=steps, batch_size=batch_size, lr=lr,
                                         warmup=warmup, half_loss=v.loss == "half", seed=seed,
                                         max_minutes=max_minutes, eval_tokens=eval_tokens,
                                         progress=log is not None and progress)
        if train_log["stopped"] == "signal":  # not finished: no result; the next run resumes from the checkpoint
            if log is not None:
                log(f"{v.name}: stopped on a signal at step {train_log['steps']} (checkpoint saved); run the same "
                    "command again to continue")
            raise KeyboardInterrupt
        t0 = time.monotonic()
        ev = evaluate_variant(model, v, corpus.splits["valid"], attn_grid, max_tokens=eval_tokens)
        row = {"variant": v.name, "recurrence": v.recurrence, "encoding": v.encoding, "loss": v.loss,
               "train_tgt_len": cfg.tgt_len, "train_mem_len": cfg.mem_len, "params": model.num_parameters(),
               "train_steps": train_log["steps"], "train_minutes": round(train_log["minutes"], 2),
               "eval_minutes": round((time.monotonic() - t0) / 60, 2), **ev, "train_history": train_log["history"]}
        model.save_pretrained(vdir, vocab=corpus.vocab)
        write_json(result_path, row, sort_keys=False)
        rows.append(row)
        if log is not None:
            log(f"{v.name}: ppl init {ev['ppl_init']:.3f} (attn {ev['attn_len_init']}), best {ev['ppl_best']:.3f} "
                f"(attn {ev['attn_len_best']})")
    return rows


def ablation_table(rows: Sequence[dict[str, Any]], *, char_level: bool = False) -> str:
    """Table 6 layout (plus training lengths and parameter counts). ``char_level`` adds bpc columns."""
    from txl.experiments.tables import markdown_table

    body = []
    for r in rows:
        cells = ["✓" if r["recurrence"] else "✗", ENCODING_NAMES[r["encoding"]], r["loss"].capitalize(),
                 f"{r['ppl_init']:.3f}", f"{r['ppl_best']:.3f}", r["attn_len_best"],
                 f"{r['train_tgt_len']}/{r['train_mem_len']}", f"{r['params']:,}", r["train_minutes"]]
        if char_level:
            cells[3:5] = [f"{math.log2(r['ppl_init']):.4f}", f"{math.log2(r['ppl_best']):.4f}"]
        body.append(cells)
    metric = "bpc" if char_level else "PPL"
    return markdown_table(["Recurrence", "Encoding", "Loss", f"{metric} init", f"{metric} best", "Attn Len",
                           "train tgt/mem", "params", "train min"], body)
