"""The ``torchrun`` cases of ``benchmarks/reliability_tour.py`` (README "Multi-process"): runs that lose a worker,
are preempted, stall, change their process count, and end cleanly, all with one unchanged command line that holds
``--resume auto``. A mix-in of the tour's ``Tour`` (its ``spawn``/``finish``/``record`` and rows)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the tests' process helpers
from tests.helpers import ended, workers

#: The torchrun cases' run: $TINY for 120 steps, a checkpoint every 4 (about 3 s of training at 2 processes).
STEPS = 120
JOB = ["train", "$TINY", "--max-step", str(STEPS), "--save-interval", "4", "--eval-interval", "1000000",
       "--resume", "auto"]


def launcher(nproc: int = 2, *extra: str) -> list[str]:
    return ["--standalone", "--nproc_per_node", str(nproc), "--monitor-interval", "0.1", *extra]


class TorchrunCases:
    """``case_14`` ... ``case_18``: each runs ``torchrun --nproc_per_node N -m transformer_xl train`` (gloo, CPU)."""

    root: Path
    clean_runs: int

    # ------------------------------------------------------------------ helpers
    def job(self, row: Any, out: str, nproc: int = 2, *extra: str, args: tuple[str, ...] = (), code: int | None = 0,
            expect: str = "done") -> Any:
        return self.record(row, self.finish(self.spawn([*JOB, *args, "--out-dir", out], launcher(nproc, *extra))),
                           code, expect)

    def until_checkpoint(self, out: str, job: Any) -> bool:
        return self.wait_for(lambda: bool(self.steps(out)), job)

    def losses(self, run: str) -> list[float]:
        return [r["train_loss"] for r in self.records(run, "train")]

    def weights(self, run: str) -> dict[str, Any]:
        from safetensors.torch import load_file

        return load_file(str(self.root / run / "final" / "model.safetensors"))

    def compare(self, row: Any, run: str, reference: str) -> None:
        """``run`` against the undisturbed ``reference``: every step's loss and the final weights, bit for bit (the
        tensors: a safetensors header's metadata order varies from file to file)."""
        import torch

        a, b = self.losses(run), self.losses(reference)
        same = a == b and len(a) == STEPS
        wa, wb = self.weights(run), self.weights(reference)
        equal = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
        resumed = [r["step"] for r in self.records(run, "event") if r.get("event") == "resume"]
        row.add(f"compare {run} with {reference}", "",
                f"resumed at steps {resumed}; {len(a)} train losses, {'all equal' if same else 'DIFFERENT'}; final "
                f"weights: {len(wa)} tensors, {'all equal' if equal else 'DIFFERENT'}")
        row.check(same and equal, f"{run} differs from {reference}")
        row.check(bool(resumed), f"{run} was never resumed")

    # ------------------------------------------------------------------ cases
    def case_14(self, row: Any) -> None:
        """14. torchrun: a worker SIGKILLed under `--max-restarts 1`"""
        self.job(row, "undisturbed")
        job = self.spawn([*JOB, "--out-dir", "elastic"], launcher(2, "--max-restarts", "1"))
        self.until_checkpoint("elastic", job)
        os.kill(workers(job.popen.pid)[1], signal.SIGKILL)
        p = self.record(row, self.finish(job), 0, "--resume auto: continuing")
        row.commands[-1] += " &; kill -KILL (rank 1) after the first checkpoint"
        row.seen[-1] += f"; then “{p.line('done')}”"
        row.check("terminate called" not in p.err, "a worker aborted")
        self.compare(row, "elastic", "undisturbed")

    def case_15(self, row: Any) -> None:
        """15. torchrun: preemption (SIGTERM to the agent and every worker)"""
        job = self.spawn([*JOB, "--out-dir", "preempted"], launcher())
        self.until_checkpoint("preempted", job)
        pids = workers(job.popen.pid)
        t0 = time.monotonic()
        for pid in (job.popen.pid, *pids.values()):
            os.kill(pid, signal.SIGTERM)
        p = self.finish(job, 120)
        seconds = time.monotonic() - t0
        failed = [r for r in pids if f"rank      : {r} (local_rank" in p.err]
        row.add(job.cmd + " &; kill -TERM (agent and both workers) after the first checkpoint", p.code,
                f"{p.line('stopped on a signal')} [{seconds:.1f} s after the signal; workers reported failed by "
                f"torchrun: {failed or 'none'}; the agent itself exits {p.code}]")
        row.check("checkpoint saved" in p.err and not failed, "the workers did not stop cleanly")
        row.check(seconds < 30, f"stopping took {seconds:.1f} s")
        self.job(row, "preempted", expect="--resume auto: continuing")
        self.compare(row, "preempted", "undisturbed")

    def case_16(self, row: Any) -> None:
        """16. torchrun: a stalled rank (SIGSTOP), `--dist-timeout 5`"""
        job = self.spawn([*JOB, "--dist-timeout", "5", "--out-dir", "stalled"], launcher())
        self.until_checkpoint("stalled", job)
        pids = workers(job.popen.pid)
        os.kill(pids[1], signal.SIGSTOP)
        t0 = time.monotonic()
        self.wait_for(lambda: ended(pids[0]), job, 60)
        seconds = time.monotonic() - t0
        time.sleep(1)
        p = self.record(row, self.finish(job, 120), None, "rank 1 did not answer")
        row.commands[-1] += " &; kill -STOP (rank 1) after the first checkpoint"
        row.seen[-1] += (f" [rank 0 ended {seconds:.1f} s after the stall; torchrun SIGKILLed the stalled rank after "
                         f"its 30 s grace; the job exits {p.code}]")
        row.check(seconds < 5 + 10, f"rank 0 ended {seconds:.1f} s after the stall")

    def case_17(self, row: Any) -> None:
        """17. torchrun: another process count on relaunch"""
        half = ("--max-step", str(STEPS // 2))
        self.job(row, "count", 2, args=half)
        before = self.snapshot("count")
        self.job(row, "count", 3, args=half, code=None, expect="must be divisible by world_size x batch_chunk")
        row.add("sha256 of every file of count but .lock (before, after)", "",
                "unchanged" if self.snapshot("count") == before else "CHANGED")
        row.check(self.snapshot("count") == before, "count changed")
        self.job(row, "count", 1, expect=f"continuing count from step {STEPS // 2}")
        tokens = [r["tokens"] for r in self.records("count", "train")]
        ref = [r["tokens"] for r in self.records("undisturbed", "train")]
        gap = max(abs(x - y) for x, y in zip(self.losses("count"), self.losses("undisturbed")))
        row.add("compare count/metrics.jsonl with undisturbed's", "", f"steps {len(tokens)}, training tokens by step "
                f"{'equal' if tokens == ref else 'DIFFERENT'} (the data position kept); largest loss difference "
                f"{gap:.2g} (1 process sums the gradient in another order than 2)")
        row.check(tokens == ref, "the data position was not kept")

    def case_18(self, row: Any) -> None:
        """18. torchrun: consecutive 2-process runs exit 0"""
        codes, aborted, t0 = [], 0, time.monotonic()
        for i in range(self.clean_runs):
            p = self.finish(self.spawn(["train", "$TINY", "--max-step", "8", "--out-dir", f"clean{i}"], launcher()))
            codes.append(p.code)
            aborted += "terminate called" in p.err
        clean = sum(c == 0 for c in codes)
        seconds = time.monotonic() - t0
        row.add(f"torchrun {' '.join(launcher())} -m transformer_xl train $TINY --max-step 8 --out-dir cleanN, "
                f"N = 0..{self.clean_runs - 1}", ",".join(sorted({str(c) for c in codes})),
                f"{clean} of {self.clean_runs} exited 0; 'terminate called' in {aborted} [{seconds:.0f} s]")
        row.check(clean == self.clean_runs and not aborted, f"{self.clean_runs - clean} runs failed")


#: What the page says about rows 14-18 beside the table (report() appends it).
NOTES = """## Multi-process runs (rows 14-18)

Rows 14-18 launch `torchrun` (gloo, CPU) with one command line that never changes, `--resume auto` included.

**Why `--resume auto`, and not `TORCHELASTIC_RESTART_COUNT` alone.** `torchrun --max-restarts N` relaunches the
same command line, so the command must both start a run and continue it. The restart count would say "this is a
restart", but (a) a preempted job is relaunched by its scheduler as a new `torchrun` whose count is 0 again, so the
count cannot serve preemption; (b) a count above 0 cannot tell this job's directory from an older run at the same
path: an attempt refused because `--out-dir` held another run would be relaunched and would then continue that
other run. `--resume auto` is explicit in the job script, serves both, and keeps the old protection: it continues
`--out-dir` only when it holds a run that passes every `--resume` check (another dataset, architecture, optimizer,
seed... is refused in one line, the directory untouched), and starts it when it is empty or absent. Without it, a
directory that holds a run is refused as before (the user at a terminal), and under a torchrun restart the refusal
says to add `--resume auto`.

**Guarantees.** A worker that dies (row 14) makes the others fail at once (gloo sees the closed connection); under
`--max-restarts` the relaunch continues from the newest checkpoint and ends with the same losses and final weights as
an undisturbed run (bit for bit on a CPU with the same thread count). SIGTERM to the agent and to every worker (row
15, what SLURM or Kubernetes do before a preemption) makes every rank finish its step, save one checkpoint and exit
0 within a step and a save; torchrun's agent itself then exits 1 (it re-raises the signal: the scheduler sees a
killed job, as it should), and the next launch continues exactly. A repeated SIGTERM never cuts the save short
(torchrun forwards its own to workers that got the scheduler's). A rank that stalls (row 16) fails the others after
`--dist-timeout` seconds (the process group's timeout, default 1800) plus 3 s in which every failing rank reports
itself in the group's store; the error names the ranks that did not report; torchrun then kills the stalled one
after its own 30 s shutdown grace. Another process count on relaunch (row 17) continues the global batch split
anew with the data position kept (not bit for bit: another summation order), or is refused in one line before
anything is written when `batch_size` does not split. The process group is torn down in order (a barrier, then
`destroy_process_group` on every rank, before rank 0's final evaluation), and a run that fails leaves it at once.
"""
