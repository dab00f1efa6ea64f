"""A tour of txl's reliability guarantees (README "Reliability") through the real command line.

Every case runs ``python -m transformer_xl ...`` in subprocesses (``OMP_NUM_THREADS=1``, umask 022, a private
``TXL_CACHE_DIR`` and work directory under a temporary root, removed at the end) and prints one Markdown row
of what it observed. Each command declares its expected exit code and a substring expected in its output; a
refusal must be one error line without a traceback. A case that does not behave so keeps its row, marked
FAILED, and the script exits 1. Regenerate the page with::

    .venv/bin/python benchmarks/reliability_tour.py --out docs/reliability-tour.md
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from tour_torchrun import NOTES, TorchrunCases

REPO = Path(__file__).resolve().parents[1]
#: The tiny run the cases train (a 1-layer d_model 16 model on a 640-word corpus: seconds on one CPU thread).
TINY = ["--preset", "tiny", "--dataset", "corpus", "--n-layer", "1", "--d-model", "16", "--d-head", "8", "--n-head",
        "2", "--d-inner", "32", "--tgt-len", "8", "--mem-len", "8", "--scheduler", "constant", "--no-progress",
        "--no-final-eval", "--eval-max-tokens", "200", "--eval-interval", "2", "--save-interval",
        "2", "--log-interval", "1"]
WORDS = ["the", "cat", "dog", "sat", "ran", "on", "under", "a", "mat", "log", "big", "small", "red", "blue", "one",
         "two", "three", "and", "then", "it", "was", "very"]


@dataclass
class Job:
    """A running ``txl`` subprocess; its stdout and stderr go to ``log.out`` and ``log.err``."""
    cmd: str
    popen: subprocess.Popen
    log: Path
    start: float = field(default_factory=time.perf_counter)


@dataclass
class Proc:
    """A finished ``txl`` subprocess: exit code, output, wall time and peak RSS (from its own ``wait4``)."""
    cmd: str
    code: int
    out: str
    err: str
    seconds: float
    rss_mib: float

    def line(self, words: str = "") -> str:
        """The first stderr (else stdout) line holding ``words``, else the last stderr (else stdout) line."""
        lines = self.err.strip().splitlines() + self.out.strip().splitlines()
        found = next((ln for ln in lines if words and words in ln), None)
        return found or (self.err.strip() or self.out.strip() or "(no output)").splitlines()[-1]


@dataclass
class Row:
    """One case: its commands, their exit codes, what was observed and every expectation that failed."""
    case: str
    commands: list[str] = field(default_factory=list)
    exits: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, cmd: str, code: int | str, seen: str) -> None:
        self.commands, self.exits, self.seen = [*self.commands, cmd], [*self.exits, str(code)], [*self.seen, seen]

    def check(self, ok: bool, what: str) -> None:
        self.failures += [] if ok else [what]


class Tour(TorchrunCases):
    """The temporary root (work directory, data cache, logs) and the cases (``case_NN`` methods, in order)."""

    def __init__(self, root: Path, clean_runs: int = 50) -> None:
        self.root, self.rows, self.ids, self.clean_runs = root, [], itertools.count(), clean_runs
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TXL_CACHE_DIR": str(root / "cache"),
                    "PYTHONPATH": str(REPO / "src")}
        self.env.pop("TXL_DEBUG", None)
        (root / "logs").mkdir()

    def short(self, text: str) -> str:
        return text.replace(str(self.root), "$TMP")

    def spawn(self, args: list[str], launcher: list[str] | None = None) -> Job:
        """``txl ARGS`` in a subprocess; with ``launcher`` (``torchrun`` flags) under
        ``torchrun ... -m transformer_xl``."""
        argv = [a for arg in args for a in (TINY if arg == "$TINY" else [arg])]
        log = self.root / "logs" / str(next(self.ids))
        head = ["-m", "torch.distributed.run", *launcher] if launcher is not None else []
        with open(log.with_suffix(".out"), "wb") as out, open(log.with_suffix(".err"), "wb") as err:
            popen = subprocess.Popen([sys.executable, *head, "-m", "transformer_xl", *argv], cwd=self.root,
                                     env=self.env, stdout=out, stderr=err, umask=0o022)
        shown = "txl " if launcher is None else f"torchrun {' '.join(launcher)} -m transformer_xl "
        return Job(shown + " ".join(args), popen, log)

    def finish(self, job: Job, timeout: float = 300) -> Proc:
        timer = threading.Timer(timeout, job.popen.kill)
        timer.start()
        _, status, usage = os.wait4(job.popen.pid, 0)
        timer.cancel()
        job.popen.returncode = code = os.waitstatus_to_exitcode(status)
        out, err = (self.short(job.log.with_suffix(s).read_bytes().decode(errors="replace")) for s in (".out", ".err"))
        return Proc(job.cmd, code, out, err, time.perf_counter() - job.start, usage.ru_maxrss / 1024)

    def record(self, row: Row, p: Proc, code: int | None, expect: str) -> Proc:
        """Add ``p`` to ``row``: expect exit ``code`` (None: non-zero) and ``expect`` in its output."""
        lines = p.err.strip().splitlines()
        seen = p.line(expect)
        if code != 0 and len(lines) > 1 and "Traceback" not in p.err:
            seen += f" (after {len(lines) - 1} line(s) before it: “{lines[0]}”)"
        row.add(p.cmd, p.code, seen)
        row.check(p.code == code if code is not None else p.code != 0, f"`{p.cmd}` exited {p.code}, expected "
                  f"{code if code is not None else 'non-zero'}")
        row.check(expect in p.err + p.out, f"`{p.cmd}`: {expect!r} not in its output")
        if code not in (0, None):
            errors = [ln for ln in lines if " error: " in ln or "interrupted" in ln]
            row.check(len(errors) == 1 and "Traceback" not in p.err, f"`{p.cmd}` is not one error line")
        return p

    def txl(self, row: Row, args: list[str], code: int | None, expect: str) -> Proc:
        return self.record(row, self.finish(self.spawn(args)), code, expect)

    def batch(self, row: Row, specs: list[tuple[list[str], int | None, str]]) -> None:
        """Independent commands, two at a time (this is a 2-core machine), recorded in order."""
        with ThreadPoolExecutor(2) as pool:
            procs = list(pool.map(lambda spec: self.finish(self.spawn(spec[0])), specs))
        for p, (_, code, expect) in zip(procs, specs):
            self.record(row, p, code, expect)

    def wait_for(self, test: Callable[[], bool], job: Job, seconds: float = 120) -> bool:
        deadline = time.monotonic() + seconds
        while not test() and time.monotonic() < deadline and not os.waitid(  # (not reaped: finish() waits)
                os.P_PID, job.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
            time.sleep(0.05)
        return test()

    def corpus(self, name: str) -> None:
        rng, d = random.Random(0), self.root / name
        d.mkdir()
        for split, n in (("train", 400), ("valid", 120), ("test", 120)):
            lines = [f"the {a} {b} sat on the {b} {a}" for a, b in (rng.sample(WORDS, 2) for _ in range(n // 8))]
            (d / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def snapshot(self, run: str) -> dict[str, str]:
        d = self.root / run
        return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(d.rglob("*")) if p.is_file() and p.name != ".lock"}

    def records(self, run: str, kind: str) -> list[dict]:
        lines = (self.root / run / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r.get("kind") == kind]

    def steps(self, run: str) -> list[int]:
        return sorted(int(p.name[5:]) for p in (self.root / run / "checkpoints").glob("step_*"))

    def copy(self, src: str, dst: str) -> Path:
        return Path(shutil.copytree(self.root / src, self.root / dst))

    def case_00(self, row: Row) -> None:
        """setup: the run the cases share"""
        self.corpus("corpus")
        self.txl(row, ["train", "$TINY", "--max-step", "4", "--out-dir", "run"], 0, "done")

    def case_01(self, row: Row) -> None:
        """1. two `txl train` on one run directory"""
        job = self.spawn(["train", "$TINY", "--max-step", "100000", "--eval-interval", "100000", "--save-interval",
                          "3", "--out-dir", "busy"])
        ok = self.wait_for(lambda: bool(self.steps("busy")), job)
        row.add(job.cmd + " &", "", f"first checkpoint after {time.perf_counter() - job.start:.1f} s" if ok else
                "no checkpoint appeared")
        self.batch(row, [(["train", "$TINY", "--out-dir", "busy"], 2, f"is in use by pid {job.popen.pid}"),
                         (["train", "--resume", "busy"], 2, f"is in use by pid {job.popen.pid}")])
        job.popen.send_signal(signal.SIGTERM)
        self.record(row, self.finish(job, 60), 0, "checkpoint saved")
        row.commands[-1] = f"kill -TERM {job.popen.pid} (the first run)"
        step = self.steps("busy")[-1]
        self.txl(row, ["train", "--resume", "busy", "--max-step", str(step + 2)], 0, "done")
        row.seen[-1] += f"; checkpoints now {self.steps('busy')} (--keep-checkpoints 2)"
        row.check(len(self.steps("busy")) <= 2 and self.steps("busy")[-1] == step + 2, "checkpoints not kept to 2")

    def case_02(self, row: Row) -> None:
        """2. a fixed field on `--resume` (optim)"""
        before = (self.root / "run" / "config.json").read_bytes()
        self.txl(row, ["train", "--resume", "run", "--optim", "sgd"], 2, "cannot change optim on --resume: run was "
                 "trained with optim='adam'")
        same = (self.root / "run" / "config.json").read_bytes() == before
        row.add("cmp run/config.json (before, after)", "", "byte-identical" if same else "CHANGED")
        row.check(same, "config.json changed")
        self.txl(row, ["train", "--resume", "run", "--max-step", "6"], 0, "done")

    def case_03(self, row: Row) -> None:
        """3. a new `--lr` on `--resume`"""
        self.txl(row, ["train", "--resume", "run", "--lr", "0.1", "--max-step", "8"], 0, "done")
        row.commands.append("read run/metrics.jsonl")
        lrs = {r["step"]: r["lr"] for r in self.records("run", "train")}
        event = [r for r in self.records("run", "event") if r.get("event") == "resume"][-1]
        row.seen.append(f"lr of the train records by step: {lrs}; resume event: {json.dumps(event['changes'])}")
        row.check([lrs[s] for s in (6, 7, 8)] == [1e-3, 0.1, 0.1], "the lr of steps 7-8 is not 0.1")
        row.check(event["changes"].get("lr") == [1e-3, 0.1], "the resume event does not list lr [0.001, 0.1]")

    def case_04(self, row: Row) -> None:
        """4. a torn last line of metrics.jsonl"""
        with open(self.root / "run" / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write('{"kind": "train", "step": 9, "train_lo')
        row.add("""printf '{"kind": "train", "step": 9, "train_lo' >> run/metrics.jsonl""", "", "")
        p = self.txl(row, ["train", "--resume", "run", "--max-step", "10"], 0, "torn last line")
        steps = [r["step"] for r in self.records("run", "train")]
        row.seen[-1] = f"{p.err.count('torn last line')}× “{row.seen[-1]}”; train steps in metrics.jsonl: {steps}"
        row.check(p.err.count("torn last line") == 1 and steps == list(range(1, 11)), "torn line not handled once")

    def case_05(self, row: Row) -> None:
        """5. killed before the first checkpoint"""
        job = self.spawn(["train", "$TINY", "--save-interval", "100000", "--eval-interval", "100000", "--max-step",
                          "100000", "--out-dir", "killed"])
        metrics = self.root / "killed" / "metrics.jsonl"
        self.wait_for(lambda: metrics.is_file() and b"\n" in metrics.read_bytes(), job)
        job.popen.kill()
        p = self.finish(job)
        row.add(job.cmd + " &; kill -KILL at its first metrics line", p.code, f"killed; metrics.jsonl lines: "
                f"{len(metrics.read_text().splitlines())}, checkpoints: {self.steps('killed')}")
        row.check(p.code == -9, "the run was not SIGKILLed")
        self.txl(row, ["train", "$TINY", "--out-dir", "killed"], 2, "already holds a run")
        p = self.txl(row, ["train", "--resume", "killed", "--max-step", "3"], 0, "starting it again from step 0")
        steps = [r["step"] for r in self.records("killed", "train")]
        row.seen[-1] += f"; then “{p.out.strip().splitlines()[-1]}”; train steps in metrics.jsonl: {steps}"
        row.check(steps == [1, 2, 3], f"train steps {steps}")

    def case_06(self, row: Row) -> None:
        """6. a user corpus edited before `--resume`"""
        self.copy("corpus", "corpus6")
        self.txl(row, ["train", "$TINY", "--dataset", "corpus6", "--max-step", "2", "--out-dir", "run6"], 0, "done")
        with open(self.root / "corpus6" / "train.txt", "a", encoding="utf-8") as f:
            f.write("a brand new word appears\n")
        row.add("echo 'a brand new word appears' >> corpus6/train.txt", "", "")
        before = self.snapshot("run6")
        self.txl(row, ["train", "--resume", "run6", "--max-step", "4"], 2, "vocabulary of dataset 'corpus6' differs")
        same = self.snapshot("run6") == before
        row.add("sha256 of every file of run6 but .lock (before, after)", "", "unchanged" if same else "CHANGED")
        row.check(same, "run6 changed")

    def case_07(self, row: Row) -> None:
        """7. flipped weight bits in best/"""
        weights = self.copy("run", "run7") / "best" / "model.safetensors"
        blob = bytearray(weights.read_bytes())
        blob[-2] ^= 0x01  # a low mantissa bit of the last float32: still finite, only the SHA-256 tells
        weights.write_bytes(bytes(blob))
        row.add("cp -r run run7; flip the low bit of byte -2 of run7/best/model.safetensors", "", "")
        self.batch(row, [(["eval", "run7", "--dataset", "corpus"], 2, "does not match its SHA-256"),
                         (["generate", "run7", "--max-new-tokens", "5"], 2, "does not match its SHA-256"),
                         (["convert", "run7/best", "--to", "hf", "--out", "hf7"], 2, "does not match its SHA-256"),
                         (["eval", "run7", "--dataset", "corpus", "--no-verify"], 0, "ppl")])

    def case_08(self, row: Row) -> None:
        """8. a MANIFEST.json naming `../x`"""
        path = self.copy("run", "run8") / "best" / "MANIFEST.json"
        doc = json.loads(path.read_text())
        doc["files"]["../x"] = doc["files"]["model.safetensors"]
        path.write_text(json.dumps(doc))
        row.add("cp -r run run8; add \"../x\" to run8/best/MANIFEST.json", "", "")
        self.txl(row, ["eval", "run8", "--dataset", "corpus"], 2, "not a plain file name")

    def case_09(self, row: Row) -> None:
        """9. a config far larger than its weights"""
        for name, key, value in (("n9a", "n_layer", 100000), ("n9b", "d_model", 10**7), ("n9c", "n_token", 10**9)):
            d = self.copy("run/best", name)
            (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()), key: value}))
            row.add(f"cp -r run/best {name}; set {key}={value} in {name}/config.json", "", "")
            p = self.txl(row, ["eval", name, "--dataset", "corpus", "--no-verify"], 2, "does not belong to these "
                         "weights")
            row.seen[-1] += f" [{p.seconds:.1f} s, peak RSS {p.rss_mib:.0f} MiB]"
            row.check(p.rss_mib < 1024, f"{name}: peak RSS {p.rss_mib:.0f} MiB")

    def case_10(self, row: Row) -> None:
        """10. a config that cannot fit in memory"""
        p = self.txl(row, ["train", "$TINY", "--tgt-len", "100000000", "--out-dir", "run10"], 2, "training needs about")
        left = (self.root / "run10").exists()
        row.seen[-1] += f" [{p.seconds:.1f} s, peak RSS {p.rss_mib:.0f} MiB; run10 {'left' if left else 'not created'}]"
        row.check(not left, "run10 was left behind")

    def case_11(self, row: Row) -> None:
        """11. one line, non-zero exit"""
        for name, blob in {"afile": b"x", "cut.toml": b'cutoffs = ["a"]\n', "latin1.toml": b"lr = 1e-3 # \xe9t\xe9\n",
                           "latin1.json": b'{"idx2sym": ["\xe9"]}'}.items():
            (self.root / name).write_bytes(blob)
        cfg, ev = ["train", "--preset", "tiny", "--print-config"], ["eval", "run", "--dataset", "corpus"]
        self.batch(row, [
            (["train", "$TINY", "--out-dir", "afile"], 2, "is a file, not a directory"),
            (["train", "$TINY", "--out-dir", "/proc/txl-run"], 1, "/proc/txl-run"),
            ([*ev, "--device", "cuda"], 2, "CUDA is not available"),
            (["generate", "run", "--device", "cuda"], 2, "CUDA is not available"),
            ([*cfg, "--seed", "-1"], 2, "seed must be in [0, 2**32 - 1]"), ([*cfg, "--seed", "1e20"], 2, "got '1e20'"),
            (["train", "--config", "cut.toml", "--print-config"], 2, "cutoffs must be a list of integers"),
            (["train", "--config", "latin1.toml", "--print-config"], 2, "latin1.toml cannot be read"),
            (["generate", "run", "--vocab", "latin1.json"], 2, "codec can't decode"),
            (["generate", "run", "--level", "byte"], 2, "does not fit this vocabulary"),
            ([*cfg, "--clip", "nan"], 2, "clip must be a finite number"), ([*cfg, "--lr", "inf"], 2, "lr must be a"),
            ([*cfg, "--clamp-len", "-100"], 2, "clamp_len must be an integer >= -1"),
            ([*ev, "--max-tokens", "-10"], 2, "--max-tokens"),
            (["data", "prepare", "corpus", "--max-size", "-1"], 2, "--max-size")])
        self.data_cache(row)
        job = self.spawn(["train", "$TINY", "--out-dir", "run11"])
        time.sleep(0.3)
        job.popen.send_signal(signal.SIGINT)
        self.record(row, self.finish(job), 130, "interrupted")
        row.commands[-1] += "; kill -INT 0.3 s after it started"
        tests = {"tests/train/test_resume.py": "test_a_full_disk_during_a_checkpoint_loses_nothing",
                 "tests/cli/test_main.py": "test_a_full_disk_while_training_names_the_file"}
        found = all(f"def {t}(" in (REPO / f).read_text() for f, t in tests.items())
        row.add("a full disk (ENOSPC)", "—", "not run here (no tmpfs to fill); tested in " + ", ".join(
            f"{f}::{t}" for f, t in tests.items()) + ("" if found else ": TEST NOT FOUND"))
        row.check(found, "the full-disk tests are missing")
        row.add("a read-only --out-dir", "—", "not run here: this machine runs as root, which no chmod binds (the "
                "OS-error path is the /proc row above)")

    def data_cache(self, row: Row) -> None:
        import numpy as np

        self.copy("corpus", "dc")
        p = self.txl(row, ["data", "prepare", "dc"], 0, "cache")
        cache = Path(p.out.split("cache ")[-1].strip().replace("$TMP", str(self.root)))
        good = {f.name: f.read_bytes() for f in cache.iterdir()}

        def bad_token(npy: Path) -> None:
            arr = np.load(npy)
            arr[3] = json.loads((cache / "manifest.json").read_text())["vocab"]["size"]
            np.save(npy, arr)

        header = b"{'descr': '<u1', 'fortran_order': False, 'shape': ("
        for name, how, damage, expect in (
                ("manifest.json", "not UTF-8", lambda f: f.write_bytes(b"\xff\xfe{}"), "is unreadable"),
                ("manifest.json", "a JSON list", lambda f: f.write_bytes(b"[1, 2]"), "is not a JSON object"),
                ("train.npy", "a corrupt .npy header", lambda f: f.write_bytes(
                    good["train.npy"][:10] + header + good["train.npy"][60:]), "unreadable cache array"),
                ("train.npy", "a token id = the vocabulary size", bad_token, "holds token id")):
            for f, blob in good.items():
                (cache / f).write_bytes(blob)
            damage(cache / name)
            row.add(f"make {self.short(str(cache))}/{name} {how}", "", "")
            self.txl(row, ["data", "prepare", "dc"], 2, expect)

    def case_12(self, row: Row) -> None:
        """12. files follow the umask"""
        ckpt = f"checkpoints/step_{self.steps('run')[-1]:08d}"
        paths = ["config.json", "best", ckpt, f"{ckpt}/model.safetensors"]
        modes = {p: f"0{(self.root / 'run' / p).stat().st_mode & 0o777:o}" for p in paths}
        row.add("stat -c %a (run written under umask 022)", "", ", ".join(f"run/{p}: {m}" for p, m in modes.items()))
        row.check(list(modes.values()) == ["0644", "0755", "0755", "0644"], f"modes {modes}")

    def case_13(self, row: Row) -> None:
        """13. `--debug` shows the traceback"""
        p = self.txl(row, ["--debug", "eval", "/nonexistent", "--dataset", "wt2"], None, "Traceback")
        row.seen[-1] = f"{len(p.err.strip().splitlines())} lines: a traceback ending in “{p.line()}”"
        self.txl(row, ["eval", "/nonexistent", "--dataset", "wt2"], 2, "no such model or run directory")

    def run(self, cases: list[str] | None = None) -> None:
        for name in sorted(n for n in dir(self) if n.startswith("case_") and (not cases or n[5:] in cases)):
            method = getattr(self, name)
            row, t0 = Row(method.__doc__), time.perf_counter()
            try:
                method(row)
            except Exception as exc:  # the tour itself met the unexpected: keep the row, marked FAILED
                row.failures.append(f"the tour raised {type(exc).__name__}: {self.short(str(exc))}")
            print(f"{row.case}: {time.perf_counter() - t0:.1f} s{' FAILED' if row.failures else ''}", file=sys.stderr)
            self.rows.append(row)


def report(rows: list[Row], seconds: float, command: str) -> str:
    """The Markdown page: intro, header line, one table row per case, the count of rows as expected."""
    sys.path.insert(0, str(REPO / "src"))
    from transformer_xl.version import __version__

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Reliability tour", "",
        "What the [Reliability](reliability.md) page promises, observed through the real `txl` command line by "
        "`benchmarks/reliability_tour.py`: each row runs `python -m transformer_xl` in subprocesses "
        "(`OMP_NUM_THREADS=1`, umask 022, a private `TXL_CACHE_DIR` and work directory under a temporary root, "
        "shown as `$TMP`) and shows "
        "the exit codes and the line txl printed that matters (the one with the expected words, else the last), or "
        "what the tour observed. A row whose expectation (exit code, expected words, a refusal in one error line "
        "without a traceback) does not hold is marked **FAILED** and the script exits 1. Regenerate this page "
        "with `.venv/bin/python benchmarks/reliability_tour.py --out docs/reliability-tour.md` (or `> FILE`).",
        "", f"{now} · txl {__version__} · torch {metadata.version('torch')} · Python {sys.version.split()[0]} · "
        f"{os.cpu_count()} CPUs · `{command}` · {seconds:.0f} s", "",
        f"`$TINY` = `{' '.join(TINY)}`; `corpus` is a folder of `train.txt`, `valid.txt` and `test.txt` (640 words "
        "of simple sentences) that the tour writes.", "",
        "| case | command | exit | what txl printed (stderr last line, or the observed outcome) |", "|---|---|---|---|"]
    for row in rows:
        cells = [("**FAILED** " if row.failures else "") + row.case, "<br>".join(f"`{c}`" for c in row.commands),
                 "<br>".join(e or "·" for e in row.exits),
                 "<br>".join(s or "·" for s in row.seen) + "".join(f"<br>**FAILED:** {f}" for f in row.failures)]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    failed = [r.case for r in rows if r.failures]
    lines += ["", f"{len(rows) - len(failed)} of {len(rows)} rows as expected"
              + (f"; FAILED: {', '.join(failed)}" if failed else "") + "."]
    if any(r.case.startswith("14.") for r in rows):
        lines += ["", NOTES.rstrip("\n")]
    return "\n".join(lines) + "\n"


FUZZ_SECTION = "## Every reader fuzzed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the Markdown page here instead of to stdout")
    parser.add_argument("--cases", help="only these cases, e.g. 00,14 (00 writes the corpus the others use)")
    parser.add_argument("--clean-runs", type=int, default=50, help="consecutive 2-process runs of the clean-exit case")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # started in the background (SIGINT ignored), the
    t0 = time.perf_counter()  # children would inherit that and case 11's Ctrl-C would not reach them
    root = Path(tempfile.mkdtemp(prefix="txl-tour-")).resolve()
    try:
        tour = Tour(root, args.clean_runs)
        tour.run(args.cases.split(",") if args.cases else None)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    command = shlex.join([".venv/bin/python", "benchmarks/reliability_tour.py", *(sys.argv[1:] if argv is None
                                                                                 else argv)])
    text = report(tour.rows, time.perf_counter() - t0, command)
    if args.out:
        # the fuzz campaign's section (tests/fuzz/campaign.py writes its counts by hand) survives a regeneration
        old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        kept = old[old.index(FUZZ_SECTION):] if FUZZ_SECTION in old else ""
        args.out.write_text(text.rstrip("\n") + "\n\n" + kept if kept else text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    print(f"total {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 1 if any(r.failures for r in tour.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
