"""``txl bench decode``: the captured step's time by group, each group's bytes adding up to the step's, its shares
of the read rate measured in the same process, the machine and the forms recorded, and the command end to end."""

from __future__ import annotations

import json

import pytest
import torch

from transformer_xl.experiments.bench import decode_profile
from transformer_xl.experiments.bench.decode_profile import profile_decode, profile_markdown
from transformer_xl.inference.packing import Linear
from transformer_xl.model import TXLConfig, native

TINY = TXLConfig(n_token=300, n_layer=2, n_head=2, d_model=32, d_head=16, d_inner=64, mem_len=20, tgt_len=8,
                 cutoffs=(100,), div_val=2)


def _small_read_rate(monkeypatch) -> None:
    """A read-rate buffer of 8 MiB (the real one is 256 MiB or more: a fraction of a second a pass on a slow
    machine)."""
    real = decode_profile.read_buffer
    monkeypatch.setattr(decode_profile, "read_buffer", lambda: real(nbytes=8 * 2**20))


@pytest.mark.parametrize("int8", [False, True])
def test_the_groups_bytes_add_up_to_the_steps_and_every_part_is_reported(monkeypatch, int8) -> None:
    """Run eagerly on a tiny shape: every group present with its bytes; the groups' bytes plus the layers' small
    vectors (norms, the biases u and v) are the bytes of the step (the yardstick's count); the report is JSON."""
    _small_read_rate(monkeypatch)
    lines: list[str] = []
    rep = profile_decode(TINY, shape="tiny", mem_len=20, batch=2, int8=int8, steps=2, compile=False,
                         log=lines.append)
    names = [g["group"] for g in rep["groups"]]
    assert names[:4] == [f"matrices {f} (2 layers)" for f in ("qkv", "o", "ff1", "ff2")]
    assert {"softmax matrix (head and tails)", "attention over the memory", "log-softmax over the vocabulary",
            "input embedding"} <= set(names)
    assert names[-2:] == ["beyond the groups (norms, residuals, launches, fusion)",
                          "the decoder's wrapper (step less the graph)"]
    # the parts a group does not read: each layer's norms and its u, v
    w = decode_profile.CapturedDecoder(decode_profile.TransformerXLLM(TINY), batch=2, mem_len=20, int8=int8,
                                       compile=False).weights
    small = sum(t.nbytes for layer in w["layers"] for k in ("ln1", "ln2", "u", "v")
                for t in (layer[k] if isinstance(layer[k], tuple) else (layer[k],)))
    read = sum(g["bytes"] for g in rep["groups"] if g["bytes"] is not None and not g["group"].startswith("log-"))
    assert abs(read + small - rep["step_bytes"]["total"]) <= 0.01 * rep["step_bytes"]["total"]
    assert all(g["ms"] > 0 for g in rep["groups"][:-2])
    assert all(s is None or 0 < s <= 1.02 for s in (g["read_share"] for g in rep["groups"]))
    assert rep["forms"]["products"] == native.products() and rep["weights"] == ("int8" if int8 else "float32")
    assert rep["forms"]["int8_form"] == (w["layers"][0]["qkv"].form if int8 else None)
    assert rep["machine"]["cpu"] and "caches" in rep["machine"] and rep["machine"]["threads"] == torch.get_num_threads()
    assert len(rep["read_rates_gb_per_s"]) == 2 and rep["read_rate_gb_per_s"] == max(rep["read_rates_gb_per_s"])
    assert rep["steps"] == 2  # rounds: each part and a read pass once per round
    json.dumps(rep)
    table = profile_markdown(rep)
    assert rep["machine"]["cpu"] in table and all(f"| {n} |" in table for n in names)
    assert "not compiled (eager)" in table and lines and "products" in lines[0]
    assert isinstance(w["layers"][0]["qkv"], Linear)


def test_a_group_faster_than_the_read_rate_gets_no_share(monkeypatch) -> None:
    """A group that stayed in a cache reads faster than memory: no share (a dash), never a share above 100 %."""
    slow = type("Buffer", (), {"nbytes": 1, "sum": lambda self: None})()  # 1 byte a pass: a limit every group passes
    monkeypatch.setattr(decode_profile, "read_buffer", lambda: slow)
    rep = profile_decode(TINY, shape="tiny", mem_len=20, steps=1, compile=False)
    assert all(g["read_share"] is None for g in rep["groups"]) and rep["step_read_share"] is None
    assert "| — |" in profile_markdown(rep)


def test_bad_steps_are_one_line() -> None:
    from transformer_xl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^steps must be at least 1, got 0$"):
        profile_decode(TINY, steps=0, compile=False)


@pytest.mark.slow
def test_the_command_profiles_every_form_compiled_and_writes_json_and_markdown(tmp_path, capsys) -> None:
    """``txl bench decode --shape tiny --products all``: the compiled step of every form that runs here, its table
    on stdout, JSON and markdown files."""
    from transformer_xl.cli import main

    out, md = tmp_path / "p.json", tmp_path / "p.md"
    assert main(["bench", "decode", "--shape", "tiny", "--mem-len", "32", "--steps", "3", "--products", "all",
                 "--json", str(out), "--markdown", str(md)]) == 0
    doc = json.loads(out.read_text())
    forms = ["compiled"] + ([] if native.unavailable() else ["native"])
    profiles = doc["profiles"] if len(forms) > 1 else [doc]
    assert [p["forms"]["products"] for p in profiles] == forms
    assert all(p["compiled"] and p["first_step_s"] > 0 and p["command"]
               for p in profiles)
    text = capsys.readouterr().out
    assert text.count("| **generation step (step + argmax)** |") == len(forms)
    assert md.read_text().count("| part | ms | MiB | GB/s | share of the read rate |") == len(forms)
    assert main(["bench", "decode", "--products", "fastest"]) == 2
    assert "unknown --products 'fastest'" in capsys.readouterr().err
