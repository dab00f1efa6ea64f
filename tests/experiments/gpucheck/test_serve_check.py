"""Part f of the GPU check on the CPU (``--tiny``): a real ``txl serve`` gives 8 concurrent clients the answers it
gives each alone; the comparison on its own catches an answer that differs."""

from __future__ import annotations

import json

import pytest

from transformer_xl.experiments.gpucheck import serve_check
from transformer_xl.experiments.gpucheck.options import CheckOptions
from transformer_xl.experiments.gpucheck.serve_check import serve_concurrent


def _opts(tmp_path, device: str = "cpu") -> CheckOptions:
    return CheckOptions(device=device, tiny=True, out_dir=tmp_path / "out", log=lambda msg: None)


# ---------------------------------------------------------------------------------------------- part f
@pytest.mark.integration
def test_a_real_txl_serve_gives_8_concurrent_clients_the_answers_given_alone(tmp_path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    r = serve_concurrent(_opts(tmp_path))
    assert r["status"] == "ok", r
    assert r["all_correct"] and r["requests"] == 16 and not r["wrong"] and not r["errors"]
    assert 0 < r["latency_p50_s"] <= r["latency_max_s"] and r["completion_tokens"] > 16
    assert r["clean_shutdown"], r["server_exit"]
    assert "POST /v1/completions 200" in (tmp_path / "out" / "f" / "serve.log").read_text()
    json.dumps(r, allow_nan=False)


def test_without_the_serve_extra_part_f_is_skipped_in_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(serve_check, "missing_packages", lambda: ["fastapi", "uvicorn"])
    r = serve_concurrent(_opts(tmp_path))
    assert r["status"] == "skipped" and r["checks"] == []
    assert "fastapi and uvicorn not installed" in r["reason"] and "wheels" in r["reason"] and "\n" not in r["reason"]


def test_compare_answers_flags_a_different_answer_and_a_failed_request() -> None:
    def answer(text: str, lp: float = -1.0) -> dict:
        return {"text": text, "finish_reason": "length", "tokens": 2, "logprobs": [lp, -2.0], "seconds": 0.1}

    alone = [answer(" w1 w2"), answer(" w3 w4"), answer(" w5 w6")]
    same = serve_check.compare_answers(alone, [answer(" w1 w2", -1.25), answer(" w3 w4"), answer(" w5 w6")])
    assert same == {"all_correct": True, "wrong": [], "errors": [], "max_logprob_diff": 0.25}
    bad = serve_check.compare_answers(alone, [answer(" w1 w2"), answer(" w3 w9"), RuntimeError("answered 500")])
    assert not bad["all_correct"] and bad["wrong"] == [1] and bad["errors"] == ["request 2: RuntimeError: answered 500"]
    cut = {**answer(" w5 w6"), "finish_reason": "stop"}  # the same text, ended for another reason
    assert serve_check.compare_answers(alone[2:], [cut])["wrong"] == [0]


def test_the_requests_differ_in_prompt_and_length(tmp_path) -> None:
    bodies = serve_check.requests_to_send([f"w{i}" for i in range(60)], seed=0)
    assert len(bodies) == serve_check.CLIENTS * serve_check.PER_CLIENT == 16
    assert len({b["prompt"] for b in bodies}) == 16 and len({b["max_tokens"] for b in bodies}) > 1
    assert all(b["temperature"] == 0 for b in bodies)
