"""A soak and abuse run of ``txl serve``: honest streaming clients with sessions beside a client that cycles through
hostile requests, on 127.0.0.1, bounded in time.

The server is a real ``txl serve`` process (``python -m transformer_xl serve``) over a model with random weights and
the WikiText-2 vocabulary (33,278 words, from the embedded training text). Three phases:

1. **alone**: every honest client runs its script by itself, one after another (a session of ``--turns`` greedy,
   streamed completions after a few words of WikiText-2), and its texts are kept;
2. **soak**: all honest clients repeat their scripts at once (a fresh session id each round) while the abusive client
   cycles through the attacks below and a prober asks ``/health`` every 50 ms, for ``--duration`` seconds and on
   until the abusive client has made every attack once (a slow CPU takes longer over one cycle), but never past
   ``--max-duration``: an attack the soak ended before is reported under ``attacks_not_run`` with the reason;
3. **after**: the server is left idle and its RSS read again.

Verdicts: every honest round equals its text alone; ``/health`` under 100 ms at the 99th percentile; every attack
made at least once, and answered as it should be (its status; an attack that raised counts its exception); the
server's peak RSS within ``--rss-bound-mib`` of its RSS before the soak, and its RSS after within 10 % of it
(before: after the alone phase and one round of every honest client at once, when the server has run its full
batch); no log line forged by what a client sent.

Usage (the committed figures; ``--duration 8 --clients 4`` is the test's quick form)::

    python benchmarks/serve_soak.py --clients 16 --duration 60 --json benchmarks/results/serve_soak.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import lzma
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "src" / "transformer_xl" / "assets" / "wikitext-2" / "wiki.train.tokens.xz"
MAX_BODY = 1 << 20  # the server's --max-body-bytes in this run
BODY_TIMEOUT = 2.0  # its --body-timeout
HEADER_TIMEOUT = 2.0  # its --header-timeout


# ------------------------------------------------------------------------------------------------ the server
def model_dir(root: Path, layers: int, d_model: int) -> tuple[Path, list[str]]:
    """A random model over the WikiText-2 vocabulary saved to ``root/model``; the training text's words."""
    import torch

    from transformer_xl import TransformerXLLM, TXLConfig
    from transformer_xl.data import Vocab

    words = lzma.decompress(TRAIN.read_bytes()).decode("utf-8").split()
    vocab = Vocab(["<eos>", *sorted(set(words) - {"<unk>"}), "<unk>"], special=["<eos>", "<unk>"], eos="<eos>",
                  unk="<unk>")
    torch.manual_seed(0)
    cfg = TXLConfig(n_token=len(vocab), n_layer=layers, n_head=4, d_model=d_model, d_head=d_model // 4,
                    d_inner=4 * d_model, tgt_len=64, mem_len=64, cutoffs=[2000, 10000], div_val=2,
                    tie_projs=[False, True, True], init_std=0.05)
    TransformerXLLM(cfg).eval().save_pretrained(root / "model", vocab=vocab)
    return root / "model", words


class Server:
    """``txl serve`` in a subprocess: its port, its PID, its log lines, its RSS."""

    def __init__(self, model: Path, log: Path, extra: list[str], src: Path, *, limits: bool = True) -> None:
        cmd = [sys.executable, "-m", "transformer_xl", "serve", str(model), "--port", "0", "--threads", "1", *extra]
        if limits:  # a server from before these flags existed (--src of an older checkout) runs without them
            cmd += ["--max-body-bytes", str(MAX_BODY), "--body-timeout", str(BODY_TIMEOUT), "--header-timeout",
                    str(HEADER_TIMEOUT)]
        env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     errors="replace")
        self.command = cmd
        started = threading.Event()

        def tee() -> None:  # its log to a file, and the port from the line that says where it listens
            with log.open("w") as out:
                for line in self.proc.stdout:  # type: ignore[union-attr]
                    out.write(line)
                    out.flush()
                    found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
                    if found and not started.is_set():
                        self.port = int(found.group(1))
                        started.set()

        threading.Thread(target=tee, daemon=True).start()
        if not started.wait(120):
            self.proc.kill()
            raise RuntimeError(f"txl serve did not start: {log.read_text()[-2000:]}")

    def rss(self) -> int:
        """Resident bytes now."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


# ------------------------------------------------------------------------------------------------ raw HTTP
def http(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
         timeout: float = 120.0) -> tuple[int, bytes]:
    """One request on its own connection, as raw bytes on a socket; ``(status, body)`` (0: no answer)."""
    head = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json", "Connection": "close",
            "Content-Length": str(len(body)), **(headers or {})}
    head = {k: v for k, v in head.items() if v is not None}
    raw = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(OSError):  # the server may answer 413 and close before the whole body is sent
            s.sendall(raw.encode("latin-1") + body)
        return read_answer(s)


def read_answer(s: socket.socket) -> tuple[int, bytes]:
    data = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            data += chunk
    m = re.match(rb"HTTP/1\.1 (\d+)", data)
    return (int(m.group(1)) if m else 0), data.partition(b"\r\n\r\n")[2]


def completion(port: int, doc: dict, **kw: Any) -> tuple[int, bytes]:
    return http(port, "POST", "/v1/completions", json.dumps(doc).encode(), **kw)


def stream_text(port: int, doc: dict) -> str:
    """A streamed completion's whole text (through the SSE events)."""
    status, body = completion(port, {**doc, "stream": True})
    if status != 200:
        raise RuntimeError(f"honest request answered {status}: {body[:200]!r}")
    text = ""
    for line in body.decode().splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            text += "".join(c["text"] for c in event.get("choices", []))
    return text


# ------------------------------------------------------------------------------------------------ honest clients
def honest_script(port: int, client: int, prompts: list[str], session: str, turns: int) -> list[str]:
    """A session of ``turns`` greedy streamed completions, deleted at its end; its texts."""
    texts = [stream_text(port, {"prompt": prompts[(client + t) % len(prompts)], "max_tokens": 16,
                                "temperature": 0, "session": session}) for t in range(turns)]
    http(port, "DELETE", f"/v1/sessions/{session}")
    return texts


def together(port: int, prompts: list[str], turns: int, tag: str) -> list[list[str]]:
    """Every honest client's script at once (threads); their texts."""
    out: list[list[str]] = [[] for _ in prompts]

    def one(c: int) -> None:
        out[c] = honest_script(port, c, prompts, f"{tag}-{c}", turns)

    threads = [threading.Thread(target=one, args=(c,)) for c in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# ------------------------------------------------------------------------------------------------ attacks
def attacks(port: int, words: list[str]) -> dict[str, tuple[Any, set[int]]]:
    """Each attack: a function doing it (returning a status) and the statuses that are right. Nothing is sent
    before an attack is made (``attacks(0, [])`` lists them)."""
    huge = {"prompt": "the", "pad": "x" * (MAX_BODY + 10)}
    long_prompt: list = []  # asked of the server once, at the first echo

    def long_echo() -> int:
        if not long_prompt:
            body = http(port, "POST", "/tokenize", json.dumps({"prompt": " ".join(words[:9000])}).encode())[1]
            # the longest prompt allowed, in the model's own tokens (a server without /tokenize: 7,000 words of text)
            tokens = json.loads(body).get("tokens", [])[:8192] if body.startswith(b"{") else []
            long_prompt.append(tokens or " ".join(words[:7000]))
        return completion(port, {"prompt": long_prompt[0], "echo": True, "logprobs": 5, "max_tokens": 0})[0]

    def chunked_body() -> int:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
                      "\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode())
            with contextlib.suppress(OSError):
                for _ in range(2 * MAX_BODY // 65536 + 2):
                    s.sendall(b"10000\r\n" + b" " * 65536 + b"\r\n")
                s.sendall(b"0\r\n\r\n")  # the last chunk: a server that takes it all reads 2 MiB of spaces
            return read_answer(s)[0]

    def slow_body() -> int:
        with socket.create_connection(("127.0.0.1", port), timeout=BODY_TIMEOUT + 10) as s:  # 0: never answered
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
                      "\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n{\"prompt\"".encode())
            return read_answer(s)[0]  # the server gives up after --body-timeout

    def disconnect() -> int:
        """499 when the server counted the request cancelled within a second of its client leaving, else 200."""
        cancelled = json.loads(http(port, "GET", "/health")[1])["cancelled"]
        s = socket.create_connection(("127.0.0.1", port))
        body = json.dumps({"prompt": "the", "max_tokens": 2048, "n": 8}).encode()
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.3)
        s.close()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if json.loads(http(port, "GET", "/health")[1])["cancelled"] > cancelled:
                return 499
            time.sleep(0.05)
        return 200

    def busy_session() -> int:
        out: list[int] = []
        doc = {"prompt": "the", "max_tokens": 64, "session": "abuse-busy"}
        threads = [threading.Thread(target=lambda: out.append(completion(port, doc)[0])) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        http(port, "DELETE", "/v1/sessions/abuse-busy")
        return 409 if sorted(out) == [200, 409] else max(out)

    def idle_sockets() -> int:
        """200 when 32 connections that send nothing were closed by the server after --header-timeout, else 0."""
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
        time.sleep(HEADER_TIMEOUT + 1.0)
        closed = 0
        for s in held:
            s.settimeout(0.05)
            with contextlib.suppress(OSError):  # a timeout: still open
                closed += s.recv(1) == b""
            s.close()
        return http(port, "GET", "/health")[0] if closed == len(held) else 0

    return {
        "body over the cap (Content-Length)": (lambda: completion(port, huge)[0], {413}),
        "a 64 MiB prompt": (lambda: completion(port, {"prompt": "the " * (16 << 20)})[0], {413}),
        "body over the cap (chunked)": (chunked_body, {413}),
        "body sent too slowly": (slow_body, {408}),
        "JSON nested 100,000 deep": (lambda: http(port, "POST", "/v1/completions", b"[" * 100_000)[0], {400}),
        "body not UTF-8": (lambda: http(port, "POST", "/v1/completions", b'{"prompt": "\xff\xfe"}')[0], {400}),
        "text/plain body (no CORS preflight)": (
            lambda: completion(port, {"prompt": "the"}, headers={"Content-Type": "text/plain"})[0], {415}),
        "Host of another site (DNS rebinding)": (
            lambda: completion(port, {"prompt": "the"}, headers={"Host": "evil.example"})[0], {400, 421}),
        "Origin of another site": (
            lambda: completion(port, {"prompt": "the"}, headers={"Origin": "http://evil.example"})[0], {403}),
        "prompt over --max-prompt-chars": (
            lambda: completion(port, {"prompt": "a" * 300_000}, headers=None)[0], {400, 413}),
        "echo + logprobs on 8,192 tokens": (long_echo, {200}),
        "n=8 x 2,048 tokens, client gone after 0.3 s": (disconnect, {499}),
        "4 stop strings at the length cap": (
            lambda: completion(port, {"prompt": "the", "max_tokens": 64, "stop": ["q" * 256] * 4})[0], {200}),
        "a stop string over the cap": (
            lambda: completion(port, {"prompt": "the", "stop": ["q" * 10_000]})[0], {400}),
        "log line forged by %0a and ANSI escapes": (
            lambda: http(port, "GET", "/v1/x%0aFORGED%20200%20GET%20/%1b[31m")[0], {404}),
        "session id with /": (lambda: completion(port, {"prompt": "the", "session": "a/../b"})[0], {400}),
        "one session used twice at once": (busy_session, {409}),
        "wrong types": (lambda: completion(port, {"prompt": 5, "max_tokens": "many"})[0], {400}),
        "32 connections that send nothing": (idle_sockets, {200}),
    }


# ------------------------------------------------------------------------------------------------ the run
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, words = model_dir(root, args.layers, args.d_model)
        server = Server(model, root / "server.log", ["--max-batch", str(max(16, args.clients))], args.src,
                        limits=not args.no_limit_flags)
        try:
            return soak(server, words, args, root)
        finally:
            server.stop()


def soak(server: Server, words: list[str], args: argparse.Namespace, root: Path) -> dict[str, Any]:
    port = server.port
    prompts = [" ".join(words[i * 40:i * 40 + 12]) for i in range(args.clients)]
    alone = [honest_script(port, c, prompts, f"alone-{c}", args.turns) for c in range(args.clients)]
    warm = together(port, prompts, args.turns, "warm")  # the server at its full batch once before RSS is read
    time.sleep(1.0)
    rss_before = server.rss()
    stop = threading.Event()
    rss: list[int] = []
    health: list[float] = []
    failed = [0]
    rounds: Counter[str] = Counter()
    outcomes: dict[str, Counter[str]] = {}
    errors: list[str] = []
    cycled = threading.Event()  # the abusive client has made every attack once

    def prober() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                status, _ = http(port, "GET", "/health", timeout=30)
            except OSError:
                status = 0
            health.append(time.perf_counter() - t0)  # an unanswered probe counts its whole wait
            failed[0] += status != 200
            rss.append(server.rss())
            time.sleep(0.05)

    def honest(c: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                got = honest_script(port, c, prompts, f"honest-{c}-{n}", args.turns)
                rounds["equal" if got == alone[c] else "different"] += 1
            except (OSError, RuntimeError) as exc:
                errors.append(f"client {c}: {exc}")
                rounds["failed"] += 1
            n += 1

    def abuser() -> None:
        todo = attacks(port, words)
        while not stop.is_set():
            for name, (attack, right) in todo.items():
                if stop.is_set():
                    break
                t0 = time.perf_counter()
                try:
                    status: int | str = attack()
                except OSError:
                    status = 0
                except Exception as exc:  # an attack that raised is a wrong answer, and the cycle goes on
                    status = f"{type(exc).__name__}: {str(exc)[:80]}"
                seen = outcomes.setdefault(name, Counter())
                seen["right" if status in right else f"status {status}"] += 1
                seen["seconds"] += time.perf_counter() - t0
            else:
                cycled.set()

    threads = [threading.Thread(target=prober), threading.Thread(target=abuser),
               *(threading.Thread(target=honest, args=(c,)) for c in range(args.clients))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(min(args.duration, args.max_duration))
    cycled.wait(max(0.0, args.max_duration - (time.perf_counter() - t0)))
    stop.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stats = json.loads(http(port, "GET", "/health")[1])
        if stats["running"] == 0 and stats["waiting"] == 0:
            break
        time.sleep(0.2)
    time.sleep(2.0)
    rss_after = server.rss()
    log = server.log.read_text(errors="replace")
    forged = [line for line in log.splitlines() if line.startswith("FORGED") or "\x1b" in line]
    return {
        "command": args.command,
        "server_command": " ".join(server.command[1:]).replace(str(root), "TMP"),
        "machine": {"cpu": cpu(), "cores": os.cpu_count(), "load_avg_before": os.getloadavg()[0]},
        "rss_bound_mib": args.rss_bound_mib, "clients": args.clients, "turns": args.turns,
        "duration_s": args.duration, "wall_s": wall,
        "honest_rounds": dict(rounds), "warm_round_equal": warm == alone, "honest_errors": errors[:10],
        "health": {"probes": len(health), "unanswered": failed[0], "p50_ms": 1000 * percentile(health, 0.5),
                   "p99_ms": 1000 * percentile(health, 0.99), "max_ms": 1000 * max(health)},
        "rss": {"before_bytes": rss_before, "peak_bytes": max([rss_before, *rss]), "after_bytes": rss_after},
        "max_duration_s": args.max_duration,
        "attacks": {name: dict(seen) for name, seen in outcomes.items()},
        "attacks_not_run": {name: f"the soak ended at its --max-duration of {args.max_duration:g} s before the "
                            "abusive client reached it" for name in attacks(0, []) if name not in outcomes},
        "forged_log_lines": forged[:5],
        "server_stats": stats,
    }


def cpu() -> str:
    """The CPU, its vector flags and class, as every result file of txl names them."""
    from transformer_xl.experiments.bench.yardstick import machine

    m = machine()
    return f"{m['cpu']} ({' '.join(m['cpu_flags'])}; class {m['cpu_class']})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=16, help="honest streaming clients")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of soak (at least; it goes on until every "
                   "attack has been made once)")
    p.add_argument("--max-duration", type=float, default=600.0, help="seconds after which the soak ends even if "
                   "attacks were not made yet (they are reported as not run, and the run fails; default: 600)")
    p.add_argument("--turns", type=int, default=3, help="completions per honest session")
    p.add_argument("--rss-bound-mib", type=int, default=256, help="the most the server's RSS may rise above its "
                   "level before the soak (default: 256)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--json", dest="out", help="write the report here")
    p.add_argument("--src", type=Path, default=REPO / "src", help="the package's source to serve from (another "
                   "checkout's src/ measures that version; default: this one's)")
    p.add_argument("--no-limit-flags", action="store_true", help="leave out --max-body-bytes, --body-timeout and "
                   "--header-timeout (a version without them)")
    args = p.parse_args(argv)
    from transformer_xl.experiments.bench.soak import soak_verdicts

    args.command = shlex.join(["python", "benchmarks/serve_soak.py", *(sys.argv[1:] if argv is None else argv)])
    report = run(args)
    report["verdicts"] = soak_verdicts(report)
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0 if all(report["verdicts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
