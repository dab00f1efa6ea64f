"""The lm-evaluation-harness's own HTTP client (its ``local-completions`` backend, harness 0.4.13) against a live
``txl serve``: no wrapper of ours in between. The harness finds the server's tokenizer through ``/tokenizer_info``
and ``/tokenize``, sends token ids with ``echo`` and ``logprobs``, and must report what ``txl score`` reports on the
same text: each document's log-likelihood, the word perplexity, each choice's log-likelihood."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

from tests.harness_tasks import samples, txl_score, wiki_model, write_tasks
from tests.helpers import REPO
from tests.serve.conftest import start_server
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.inference.loading import load_model
from transformer_xl.inference.score import score_ids

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _lm_eval(url: str, tasks, out, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "HF_DATASETS_CACHE": str(out.parent / "datasets"), "PYTHONPATH": str(REPO / "src"),
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "OPENAI_API_KEY": "unused"}
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
           f"base_url={url}/completions,model=tiny,max_length=4096,tokenized_requests=True,max_retries=1",
           "--tasks", "txl_wikitext_rolling,txl_continuation_choice", "--include_path", str(tasks),
           "--output_path", str(out), "--log_samples", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_the_harness_local_completions_client_reports_txl_scores(tmp_path, capsys) -> None:
    pytest.importorskip("lm_eval")
    model_dir, docs = wiki_model(tmp_path)
    tasks = write_tasks(tmp_path, docs)
    server = start_server(model_dir, mem_len=24)
    served = next(server)
    try:
        run = _lm_eval(served.url, tasks, tmp_path / "out")
    finally:
        server.close()
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Using remote tokenizer" in run.stderr or "remote tokenizer" in run.stderr.lower()
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]

    # perplexity: each document's log-likelihood is the sum of txl score's log-probabilities of its tokens after the
    # <eos> it starts from -- all but the <eos> that txl score also reads at its end (the harness's rolling windows
    # score the document's text: /tokenize of "a b" ends no line)
    (tmp_path / "docs.txt").write_text("\n\n".join(docs) + "\n")
    scored = txl_score([str(model_dir), str(tmp_path / "docs.txt"), "--documents", "--mem-len", "24"], capsys)
    want = [math.fsum(r["log_probs"][:-1]) for r in scored]
    logged = [float(s["resps"][0][0]) for s in samples(tmp_path / "out", "txl_wikitext_rolling")]
    assert len(logged) == len(want) == len(docs)
    for got, total, rec in zip(logged, want, scored):
        # to float32 rounding of each token's log-probability (the server reads a prompt in its own segments)
        assert got == pytest.approx(total, rel=0, abs=1e-5 * rec["n_tokens"])
    words = sum(len(re.split(r"\s+", d)) for d in docs)
    assert math.isclose(results["txl_wikitext_rolling"]["word_perplexity,none"], math.exp(-sum(want) / words),
                        rel_tol=1e-5)

    # two choices: the harness sends the context's ids and the continuation's after them, with no start symbol
    # before the context (its own convention); a choice's log-likelihood is what txl score's scoring of that very
    # stream gives its continuation's ids
    model, _ = load_model(model_dir)
    lines = LineEncoder.for_model(model_dir)
    for s in samples(tmp_path / "out", "txl_continuation_choice"):
        for choice, resp in zip(s["doc"]["choices"], s["resps"]):
            ctx, whole = lines.string_ids(s["doc"]["context"]), lines.string_ids(s["doc"]["context"] + " " + choice)
            assert whole[:len(ctx)] == ctx and len(whole) == len(ctx) + len(choice.split())
            scores = score_ids(model, [whole], mem_len=24)[0].log_probs.tolist()  # every id but the first
            assert float(resp[0][0]) == pytest.approx(math.fsum(scores[len(ctx) - 1:]), rel=1e-5, abs=1e-5)
