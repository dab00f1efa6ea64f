"""The training memory estimate: its parts, how they grow, and the one-line refusal of a run that cannot fit."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_config
from transformer_xl.errors import ConfigError
from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.train.footprint import check_fits, estimate_training_bytes, softmax_columns

BASE = TXLConfig(n_token=10000, n_layer=4, n_head=8, d_model=256, d_head=32, d_inner=1024, tgt_len=128, mem_len=128)


def _total(cfg: TXLConfig = BASE, batch: int = 16, chunk: int = 1, optim: str = "adam", precision: str = "fp32",
           **kw) -> int:
    return estimate_training_bytes(cfg, batch, chunk, optim, precision, **kw)["total"]


def test_the_parts_add_up_and_the_weights_parts_follow_the_parameter_count() -> None:
    cfg = tiny_config(tie_weight=False)
    est = estimate_training_bytes(cfg, 8, 1, "adam", "fp32")
    assert set(est) == {"parameters", "gradients", "optimizer", "activations", "memories", "logits", "total"}
    assert est["total"] == sum(v for k, v in est.items() if k != "total") and min(est.values()) > 0
    n = TransformerXLLM(cfg).num_parameters()
    assert est["parameters"] == est["gradients"] == 4 * n and est["optimizer"] == 3 * 4 * n  # 2 moments + update
    assert estimate_training_bytes(cfg, 8, 1, "sgd", "fp32")["optimizer"] == 2 * 4 * n
    assert estimate_training_bytes(cfg, 8, 1, "adagrad", "fp32")["optimizer"] == 2 * 4 * n
    assert estimate_training_bytes(cfg.replace(mem_len=0), 8)["memories"] == 0


def test_the_estimate_grows_with_every_size_and_shrinks_with_every_saving() -> None:
    base = _total()
    for bigger in (dict(batch=32), dict(cfg=BASE.replace(tgt_len=256)), dict(cfg=BASE.replace(mem_len=512)),
                   dict(cfg=BASE.replace(n_layer=8)), dict(cfg=BASE.replace(d_inner=4096)),
                   dict(cfg=BASE.replace(n_token=50000)), dict(cfg=BASE.replace(dropatt=0.1))):
        assert _total(**bigger) > base, bigger
    for smaller in (dict(chunk=4), dict(optim="sgd"), dict(precision="bf16"), dict(recompute=True),
                    dict(cfg=BASE.replace(n_token=50000, cutoffs=(2000, 10000), tie_projs=(False,)))):
        assert _total(**smaller) < (base if "cfg" not in smaller else _total(cfg=BASE.replace(n_token=50000))), smaller
    # the attention scores grow with the square of the segment: quadrupling tgt_len and mem_len costs > 4x
    long = BASE.replace(tgt_len=512, mem_len=512)
    assert estimate_training_bytes(long, 16)["activations"] > 8 * estimate_training_bytes(BASE, 16)["activations"]


def test_softmax_columns_full_adaptive_and_sampled() -> None:
    assert softmax_columns(BASE) == 10000
    adaptive = BASE.replace(n_token=267735, cutoffs=(20000, 40000, 200000), tie_projs=(False,))
    assert 20003 < softmax_columns(adaptive) < 50000  # the rare tails cost a fraction of their 247732 columns
    assert softmax_columns(BASE.replace(sample_softmax=100)) == 1 + 100 + 256


def test_bad_arguments_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="optim must be one of adam, sgd, adagrad, got 'adamw'"):
        estimate_training_bytes(BASE, 4, 1, "adamw")
    with pytest.raises(ConfigError, match="precision must be one of"):
        estimate_training_bytes(BASE, 4, 1, "adam", "fp8")
    with pytest.raises(ConfigError, match="batch_chunk must be a positive integer"):
        estimate_training_bytes(BASE, 4, 0)


def test_a_run_that_cannot_fit_this_machine_is_refused_in_one_line() -> None:
    check_fits(estimate_training_bytes(tiny_config(), 4), "cpu")  # a tiny run fits
    check_fits(1000, "cpu")
    huge = estimate_training_bytes(BASE.replace(tgt_len=100_000_000), 16)
    with pytest.raises(ConfigError) as exc:
        check_fits(huge, "cpu")
    message = str(exc.value)
    assert message.startswith("training needs about ") and "activations" in message and "\n" not in message
    assert " but cpu has " in message and message.endswith("(--force tries anyway)")
    with pytest.raises(ConfigError, match=r"estimated\) but cpu has .* GB available"):
        check_fits(huge["total"], "cpu")


def test_a_cuda_device_is_checked_against_its_free_memory(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 << 30, 80 << 30))
    with pytest.raises(ConfigError, match=r"but cuda:0 has 3\.2 GB available"):
        check_fits(4 << 30, "cuda:0")
    check_fits(2 << 30, "cuda:0")
    check_fits(10**15, "meta")  # an unknown amount: nothing to compare with
