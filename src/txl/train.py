"""A compact single-process training loop (Adam, warmup + cosine, clipping, memory carried across segments).

This is the loop behind ``txl train``. Each step feeds the next segment of every stream with the
memories of the previous step (paper Sec. 3.2), so training sees the same recurrence as evaluation.
Evaluation scores every token of a split exactly once, with memory, and reports perplexity or, for
character/byte-level corpora, bits per character (``loss / ln 2``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from txl.config import TXLConfig
from txl.errors import ConfigError
from txl.io import atomic_write
from txl.model import TransformerXLLM
from txl.presets import model_preset


@dataclass
class TrainConfig:
    """Options of ``txl train`` (official ``train.py`` names where one exists)."""

    dataset: str = "wt2"
    data_dir: str | None = None
    model: str = "cpu-small"
    out_dir: str = "runs/txl"
    batch_size: int = 16
    tgt_len: int | None = None  # None: the model preset's
    mem_len: int | None = None
    eval_tgt_len: int | None = None
    lr: float = 2.5e-4
    warmup_step: int = 0
    max_step: int = 1000
    max_minutes: float | None = None
    clip: float = 0.25
    eval_interval: int = 200
    eval_max_tokens: int | None = None  # score only the first N tokens of valid during training
    log_interval: int = 20
    seed: int = 1111
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_step", "eval_interval", "log_interval"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("tgt_len", "eval_tgt_len", "eval_max_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.mem_len is not None and self.mem_len < 0:
            raise ConfigError(f"mem_len must be >= 0, got {self.mem_len}")
        if not (self.lr > 0 and self.clip > 0 and self.warmup_step >= 0):
            raise ConfigError("lr and clip must be > 0 and warmup_step >= 0")


def lr_lambda(step: int, *, warmup_step: int, max_step: int) -> float:
    """Official default schedule: linear warmup, then cosine from the peak to 0 over ``max_step``."""
    if warmup_step and step < warmup_step:
        return step / warmup_step
    return 0.5 * (1.0 + math.cos(math.pi * min(step, max_step) / max_step))


@torch.no_grad()
def evaluate(model: TransformerXLLM, data: np.ndarray, *, batch_size: int, tgt_len: int,
             max_tokens: int | None = None, device: str = "cpu") -> dict[str, float]:
    """Mean NLL over the split (each token scored once, memory carried), with tokens counted."""
    from txl.data import LMOrderedIterator

    if max_tokens is not None:
        data = data[: max_tokens + 1]
    was_training = model.training
    model.eval()
    total, count, mems = 0.0, 0, None
    for batch in LMOrderedIterator(data, batch_size, tgt_len, device=device):
        x, y = batch[0], batch[1]
        out = model(x, y, mems)
        mems = out.mems
        total += out.nll.sum().item()
        count += out.nll.numel()
    model.train(was_training)
    loss = total / max(count, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50)), "bpc": loss / math.log(2), "tokens": count}


def train(cfg: TrainConfig, *, model_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train a model on ``cfg.dataset`` and write ``cfg.out_dir``; returns the final metrics."""
    from txl.data import LMOrderedIterator, load_corpus

    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    corpus = load_corpus(cfg.dataset, cfg.data_dir)
    overrides = dict(model_overrides or {})
    if cfg.tgt_len is not None:
        overrides["tgt_len"] = cfg.tgt_len
    if cfg.mem_len is not None:
        overrides["mem_len"] = cfg.mem_len
    model_cfg: TXLConfig = model_preset(cfg.model, len(corpus.vocab), **overrides)
    model = TransformerXLLM(model_cfg).to(cfg.device)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"train": dataclasses.asdict(cfg), "model": model_cfg.to_dict()}, indent=2) + "\n"
    atomic_write(out_dir / "run_config.json", lambda f: f.write(text), binary=False)

    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, warmup_step=cfg.warmup_step, max_step=cfg.max_step))
    metric = "bpc" if corpus.char_level else "ppl"
    eval_tgt = cfg.eval_tgt_len or model_cfg.tgt_len
    print(f"txl train: {cfg.dataset} ({len(corpus.vocab):,} symbols, {len(corpus.splits['train']):,} "
          f"training tokens), model {cfg.model} with {model.num_parameters():,} parameters")

    log = (out_dir / "metrics.jsonl").open("a", encoding="utf-8")
    start, step, mems, best = time.monotonic(), 0, None, math.inf
    tokens_seen, result = 0, {}
    bar = tqdm(total=cfg.max_step, desc="train", unit="step", dynamic_ncols=True, mininterval=1.0)
    model.train()
    try:
        while step < cfg.max_step:
            for batch in LMOrderedIterator(corpus.splits["train"], cfg.batch_size, model_cfg.tgt_len,
                                           device=cfg.device):
                x, y = batch[0], batch[1]
                out = model(x, y, mems)
                mems = out.mems
                optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
                optimizer.step()
                scheduler.step()
                step += 1
                tokens_seen += y.numel()
                elapsed = time.monotonic() - start
                loss = out.loss.item()
                shown = loss / math.log(2) if corpus.char_level else math.exp(min(loss, 50))
                bar.set_postfix(loss=f"{loss:.3f}", **{metric: f"{shown:.2f}"},
                                lr=f"{scheduler.get_last_lr()[0]:.2e}", tok_s=f"{tokens_seen / elapsed:.0f}")
                bar.update()
                record: dict[str, Any] = {"step": step, "time": round(elapsed, 2), "train_loss": loss,
                                          "lr": scheduler.get_last_lr()[0]}
                timed_out = cfg.max_minutes is not None and elapsed > cfg.max_minutes * 60
                if step % cfg.eval_interval == 0 or step == cfg.max_step or timed_out:
                    val = evaluate(model, corpus.splits["valid"], batch_size=10, tgt_len=eval_tgt,
                                   max_tokens=cfg.eval_max_tokens, device=cfg.device)
                    record.update(valid_loss=val["loss"], **{f"valid_{metric}": val[metric]})
                    tqdm.write(f"step {step}: valid loss {val['loss']:.4f}, {metric} {val[metric]:.3f}")
                    if val["loss"] < best:
                        best = val["loss"]
                        model.save_pretrained(out_dir / "best")
                    result = record
                if step % cfg.log_interval == 0 or "valid_loss" in record:
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                if step >= cfg.max_step or timed_out:
                    step = cfg.max_step
                    break
    finally:
        bar.close()
        log.close()
    model.save_pretrained(out_dir / "final")
    result["minutes"] = round((time.monotonic() - start) / 60, 2)
    print(f"txl train: done in {result['minutes']} min; final valid {metric} "
          f"{result.get(f'valid_{metric}', float('nan')):.3f}; model in {out_dir / 'final'}")
    return result
