"""Part f of the GPU check (:func:`serve_concurrent`): a real ``txl serve`` answering clients at once.

A small model with random weights (peaked distributions: the biases and LayerNorms moved off their initial values
too, so that greedy decoding has no near ties) is saved as ``save_pretrained`` saves one, with a word vocabulary, and
served by ``python -m transformer_xl serve`` on a free port of 127.0.0.1. Every request is first answered alone, one
after the other; then :data:`CLIENTS` threads, each over its own HTTP connections, send theirs at once, each
client two requests in a row of different lengths, so that requests join and leave the server's decoding batch
while others run. Every greedy answer given under load must equal the one given alone (the text, the finish reason,
the number of tokens); the largest difference of the tokens' log-probabilities is reported beside (a batch of other
rows may round differently on a GPU). The server is stopped (SIGTERM, then SIGKILL) whatever happens.

Without ``fastapi`` and ``uvicorn`` (the ``serve`` extra) the part is ``skipped``, saying which are missing.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from transformer_xl.experiments.gpucheck.options import CheckOptions
from transformer_xl.experiments.gpucheck.processes import last_line, stop, txl_command, txl_env

#: Concurrent clients, and the requests each sends in a row.
CLIENTS, PER_CLIENT = 8, 2
#: Seconds kept back from the part's cap, to stop the server and report.
MARGIN_S = 4.0
#: The served model: ``tiny`` (CPU) and the GPU's (both small: the part checks serving, not the model).
TINY_MODEL = dict(n_layer=2, n_head=2, d_model=32, d_head=16, d_inner=64, tgt_len=8, mem_len=16)
GPU_MODEL = dict(n_layer=4, n_head=4, d_model=256, d_head=64, d_inner=1024, tgt_len=32, mem_len=64)


def missing_packages() -> list[str]:
    """The packages ``txl serve`` needs that this Python lacks."""
    return [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]


def save_model(root: Path, *, tiny: bool, seed: int) -> tuple[Path, list[str]]:
    """A random model over a word vocabulary saved as ``root/check``: the directory and the vocabulary's words."""
    import torch

    from transformer_xl.data import Vocab
    from transformer_xl.model import TransformerXLLM, TXLConfig

    words = [f"w{i}" for i in range(60 if tiny else 1000)]
    vocab = Vocab(["<eos>", "<unk>", *words], special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>")
    torch.manual_seed(seed)
    shape = TINY_MODEL if tiny else GPU_MODEL
    model = TransformerXLLM(TXLConfig(n_token=len(vocab), dropout=0.0, init_std=0.15, proj_init_std=0.15, **shape))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval().save_pretrained(root / "check", vocab=vocab), words


def requests_to_send(words: list[str], seed: int) -> list[dict[str, Any]]:
    """``CLIENTS * PER_CLIENT`` greedy completion requests, each of another prompt (1 to 12 words) and length."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(CLIENTS * PER_CLIENT):
        prompt = " ".join(rng.choice(words) for _ in range(1 + i % 12))
        out.append({"model": "check", "prompt": prompt, "max_tokens": 6 + 3 * (i % 7), "temperature": 0,
                    "logprobs": 0})
    return out


def complete(port: int, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """POST ``body`` to ``/v1/completions`` over a fresh connection: the first choice's text, finish reason, token
    log-probabilities and token count, and the seconds the answer took (an HTTP error: ``RuntimeError``)."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"POST /v1/completions answered {resp.status}: {data[:200]!r}")
    doc = json.loads(data)
    choice = doc["choices"][0]
    return {"text": choice["text"], "finish_reason": choice["finish_reason"],
            "tokens": doc["usage"]["completion_tokens"],
            "logprobs": (choice.get("logprobs") or {}).get("token_logprobs") or [],
            "seconds": time.perf_counter() - start}


def _listening(log: Path, proc: subprocess.Popen, deadline: float) -> int:
    """The port ``txl serve`` says it listens on (its ``serving ... on http://HOST:PORT`` line)."""
    while time.monotonic() < deadline:
        found = re.search(r"serving .* on http://[^\s]*?:(\d+)", log.read_text(encoding="utf-8", errors="replace"))
        if found:
            return int(found.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"txl serve ended with status {proc.returncode} before listening{last_line(log)}")
        time.sleep(0.05)
    raise RuntimeError(f"txl serve did not listen before the part's cap{last_line(log)}")


def _wait_health(port: int, deadline: float) -> None:
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            if resp.status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        if time.monotonic() > deadline:
            raise RuntimeError("GET /health did not answer 200 before the part's cap")
        time.sleep(0.05)


def _concurrently(port: int, bodies: list[dict[str, Any]], timeout: float) -> list[dict[str, Any] | BaseException]:
    """``CLIENTS`` threads started together, client ``c`` sending bodies ``c, c + CLIENTS, ...`` one after the other;
    each answer (or the error it met) at its body's index."""
    answers: list[dict[str, Any] | BaseException] = [RuntimeError("not sent")] * len(bodies)
    gate = threading.Barrier(CLIENTS)

    def client(c: int) -> None:
        gate.wait()
        for i in range(c, len(bodies), CLIENTS):
            try:
                answers[i] = complete(port, bodies[i], timeout)
            except BaseException as exc:  # reported with the request, not lost in a thread
                answers[i] = exc

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return answers


def compare_answers(alone: list[dict[str, Any]], loaded: list[dict[str, Any] | BaseException]) -> dict[str, Any]:
    """Which answers under load differ from the same requests' alone (text, finish reason, token count), the errors,
    and the largest |difference| of the tokens' log-probabilities where the texts agree."""
    wrong, errors, lp_diff = [], [], 0.0
    for i, (a, b) in enumerate(zip(alone, loaded, strict=True)):
        if isinstance(b, BaseException):
            errors.append(f"request {i}: {type(b).__name__}: {b}"[:200])
            continue
        if (a["text"], a["finish_reason"], a["tokens"]) != (b["text"], b["finish_reason"], b["tokens"]):
            wrong.append(i)
        elif len(a["logprobs"]) == len(b["logprobs"]):
            lp_diff = max([lp_diff, *(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True))])
    return {"all_correct": not wrong and not errors, "wrong": wrong, "errors": errors[:5],
            "max_logprob_diff": lp_diff}


def serve_concurrent(opts: CheckOptions) -> dict[str, Any]:
    """Part f (module docstring)."""
    missing = missing_packages()
    if missing:
        why = (f"{' and '.join(missing)} not installed (txl serve's 'serve' extra): carry their wheels to the "
               "machine and install them to run this part")
        opts.log(f"skipped: {why}")
        return {"status": "skipped", "reason": why, "checks": []}
    start = time.monotonic()
    deadline = start + min(opts.cap("f"), opts.time_left()) - MARGIN_S
    result: dict[str, Any] = {"status": "failed", "device": opts.device, "clients": CLIENTS,
                              "requests": CLIENTS * PER_CLIENT, "checks": []}
    tmp = Path(tempfile.mkdtemp(prefix="txl-check-f-"))
    keep = opts.out_dir / "f"
    keep.mkdir(parents=True, exist_ok=True)
    log = keep / "serve.log"
    proc = None
    try:
        model_dir, words = save_model(tmp, tiny=opts.tiny, seed=opts.seed)
        cmd = txl_command("serve", str(model_dir), "--port", "0", "--model-name", "check", "--device", opts.device,
                          "--max-batch", str(CLIENTS), *(["--threads", "1"] if opts.tiny else []))
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=txl_env(opts))
        port = _listening(log, proc, deadline)
        _wait_health(port, deadline)
        result["startup_s"] = round(time.monotonic() - start, 2)
        opts.log(f"txl serve listening on port {port} after {result['startup_s']} s; requests alone first")
        timeout = max(deadline - time.monotonic(), 1.0)
        bodies = requests_to_send(words, opts.seed)
        alone = [complete(port, body, timeout) for body in bodies]
        t0 = time.perf_counter()
        loaded = _concurrently(port, bodies, max(deadline - time.monotonic(), 1.0))
        seconds = time.perf_counter() - t0
        verdict = compare_answers(alone, loaded)
        latencies = sorted(b["seconds"] for b in loaded if isinstance(b, dict))
        tokens = sum(b["tokens"] for b in loaded if isinstance(b, dict))
        result.update(verdict, latency_p50_s=round(statistics.median(latencies), 4) if latencies else None,
                      latency_max_s=round(latencies[-1], 4) if latencies else None,
                      alone_latency_p50_s=round(statistics.median(a["seconds"] for a in alone), 4),
                      concurrent_s=round(seconds, 3), tokens_per_s=round(tokens / seconds, 1),
                      completion_tokens=tokens)
        result["checks"] = [{"name": f"{CLIENTS} concurrent clients get the answers given alone (greedy)",
                             "ok": verdict["all_correct"], "wrong": verdict["wrong"], "errors": verdict["errors"]}]
        result["status"] = "ok" if verdict["all_correct"] else "failed"
        opts.log(f"{len(latencies)} answers under load, all correct: {verdict['all_correct']}; latency p50 "
                 f"{result['latency_p50_s']} s, max {result['latency_max_s']} s")
    except Exception as exc:  # the part's result says what went wrong; the server is stopped below
        result["error"] = f"{type(exc).__name__}: {exc}"[:300]
        result["checks"] = [{"name": "txl serve answered concurrent clients", "ok": False, "error": result["error"]}]
    finally:
        if proc is not None:
            code = stop(proc)  # uvicorn re-raises the SIGTERM it handled once its graceful shutdown is done
            result["server_exit"] = code
            result["clean_shutdown"] = code in (0, -signal.SIGTERM)
        shutil.rmtree(tmp, ignore_errors=True)
        result["wall_s"] = round(time.monotonic() - start, 2)
    return result
