"""The GPU check's Markdown summary, rendered from its JSON report alone (every figure is one of the report's): the
environment, a line per part (status, seconds, cap, error), the checks out of tolerance, then each part's table.
A part this module has no table for (or whose result is missing) gets its scalar values as a list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _num(v: Any, fmt: str = ",.0f", unit: str = "") -> str:
    """``v`` formatted, or an en dash where it is missing."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return "–" if v is None else str(v)
    return format(v, fmt) + unit


def _pct(v: Any) -> str:
    return _num(None if v is None else v * 100, ".1f", " %")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _ok(flag: Any) -> str:
    return "yes" if flag else "**NO**"


# ---------------------------------------------------------------------------------------------- parts
def correctness_md(res: dict[str, Any]) -> list[str]:
    tol = res["tolerances"]
    out = [f"Relative error = {tol['relative_error']}; fp32 tolerance {tol['fp32_rel']:g}, bf16 loss tolerance "
           f"{tol['bf16_loss_rel']:g}, gradient tolerance {tol['grad_rel']:g}.", ""]
    out += _table(["case", "against", "fp32 loss", "fp32 log-probs", "bf16 loss", "within"],
                  [[r["case"], r["against"], _num(r["fp32_loss_rel"], ".1e"), _num(r["fp32_logprob_rel"], ".1e"),
                    _num(r["bf16_loss_rel"], ".1e"), _ok(r["ok"])] for r in res["forward"]])
    out += ["", *_table(["case", "paths", "worst parameter", "gradient error", "within"],
                        [[r["case"], r["paths"], f"`{r['worst_param']}`", _num(r["worst_rel"], ".1e"), _ok(r["ok"])]
                         for r in res["gradients"]])]
    out += ["", *_table(["training", "steps", "first loss", "last loss", "scaler scale", "ok"],
                        [[r["precision"], str(r["steps"]), _num(r["losses"][0], ".4f"), _num(r["losses"][-1], ".4f"),
                          _num(r["scale"], "g"), _ok(r["ok"])] for r in res["amp_training"]])]
    t = res["gpu_tests"]
    counts = ", ".join(f"{t[k]} {k}" for k in ("passed", "failed", "errors", "skipped") if k in t)
    out += ["", f"`pytest -m gpu` ({len(t.get('files', []))} files): {t['status']}" + (f", {counts}" if counts else "")
            + "."]
    out += [f"- failed: `{name}`" for name in t.get("failures", [])]
    return out


def training_md(res: dict[str, Any]) -> list[str]:
    pk = res["peaks_flop_per_s"]
    out = [f"GEMM peaks measured in this run: bf16 {_num(pk['bf16'] / 1e12, '.1f')}, fp32 "
           f"{_num(pk['fp32'] / 1e12, '.1f')}, TF32 {_num(pk['tf32'] / 1e12, '.1f')} TFLOP/s. NVIDIA's figures: "
           f"{res['nvidia_a100']['source']}; goals on one H100 in bf16: "
           + ", ".join(f"{k} ≥ {v:,} tok/s" for k, v in res["goals_h100_bf16"].items()) + ".", ""]
    rows = []
    for r in res["rows"]:
        if r.get("status") != "ok":
            rows.append([r["model"], r["mode"], r.get("status", "?"), "–", "–", "–", "–", "–", "–",
                         str(r.get("error") or "")])
            continue
        goal = "–" if "goal_tok_per_s" not in r else \
            f"{r['goal_tok_per_s']:,} ({'met' if r['meets_goal'] else 'not met'})"
        rows.append([r["model"], r["mode"] + ("" if r["compiled"] or r["mode"] != "bf16-compile" else " (eager)"),
                     "ok", _num(r["tok_per_s"]), _num(r["step_s"] * 1e3, ".1f"), _pct(r["mfu"]),
                     _num(r.get("nvidia_a100_tok_per_s")), goal, _num(r.get("compile_s"), ".1f"),
                     f"batch {r['batch']}, tgt = mem = {r['tgt_len']}"])
    return out + _table(["model", "mode", "status", "tok/s", "ms/step", "MFU", "NVIDIA A100 tok/s", "goal tok/s",
                         "compile s", "notes"], rows)


def evaluation_md(res: dict[str, Any]) -> list[str]:
    rows = []
    for r in res["rows"]:
        if r.get("status") != "ok":
            rows.append([r["model"], _num(r.get("batch")), "–", "–", r.get("status", "?") + f" ({r.get('error')})",
                         "–"])
            continue
        rows.append([r["model"], str(r["batch"]), f"{r['tgt_len']} / {r['mem_len']}", _num(r["tok_per_s"]), "ok",
                     _num(r.get("nvidia_a100_tok_per_s"))])
    return [f"Scoring segments without a gradient, {res['precision']}; NVIDIA's figures: "
            f"{res['nvidia_a100']['eval_note']}.", "",
            *_table(["model", "batch", "tgt / mem", "tok/s", "status", "NVIDIA A100 tok/s"], rows)]


def decoding_md(res: dict[str, Any]) -> list[str]:
    rate = res["read_rate"]
    rows = [[str(r["mem_len"]), "CUDA graphs" if r["cuda_graphs"] else ("compiled" if r["compiled"] else "eager"),
             _num(r["tok_per_s"]), _num(r["plain_tok_per_s"]), _num(r["step_bytes"]["total"] / 1e6, ".1f"),
             _num(r["limit_tok_per_s"]),
             _pct(r["share"]) + ("" if r["meets_goal"] else f" (goal {_pct(r['goal_share'])})"),
             r["same_tokens"], _num(r["logprob_max_abs_diff"], ".1e"), _num(r["compile_s"], ".1f")]
            for r in res["rows"]]
    out = [f"Batch-1 greedy decoding of the {res['model']} model ({res['n_token']:,} words); read rate "
           f"{_num(rate['bytes_per_s'] / 1e9, '.1f')} GB/s ({rate['method']}).", ""]
    out += _table(["mem", "step", "tok/s", "plain tok/s", "MB/step", "limit tok/s", "share of limit",
                   "same tokens", "log-prob diff", "compile s"], rows)
    if res.get("skipped_mem_lens"):
        out += ["", f"Not run for lack of time: mem {', '.join(map(str, res['skipped_mem_lens']))}."]
    return out


def generic_md(res: dict[str, Any]) -> list[str]:
    """The scalar values of a part's result (and of its dicts one level down) as a list."""
    out = []
    for k, v in res.items():
        if k == "checks":
            continue
        if isinstance(v, dict):
            inner = ", ".join(f"{ik} {_num(iv, 'g')}" for ik, iv in v.items()
                              if isinstance(iv, (int, float, str, bool)) or iv is None)
            if inner:
                out.append(f"- {k}: {inner}")
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out.append(f"- {k}: {_num(v, 'g')}")
    return out


RENDERERS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "a": correctness_md, "b": training_md, "c": evaluation_md, "d": decoding_md}


def to_markdown(report: dict[str, Any]) -> str:
    """The summary of ``report`` (the JSON :func:`~transformer_xl.experiments.gpucheck.runner.run_check` writes)."""
    env = report["environment"]
    tf = env.get("tf32", {})
    lines = ["# txl GPU check", "",
             f"`{env['command']}` on **{env['device_name']}** ({env['device']}), torch {env['torch']}, CUDA "
             f"{env['cuda']}, Python {env['python']}, {env['date']}; TF32 at start: matmul "
             f"{tf.get('cuda_matmul_tf32')}, cuDNN {tf.get('cudnn_tf32')}; "
             f"{'tiny sizes' if env['tiny'] else 'full sizes'}; {report.get('total_s', '–')} s in all "
             f"(budget {env['budget_s']:.0f} s).", "",
             "**Result: " + ("all parts ok, every check within tolerance**" if report.get("ok") else
                             "NOT OK** - " + "; ".join(report.get("problems", []))), ""]
    lines += _table(["part", "title", "status", "seconds", "cap s", "error"],
                    [[name, p["title"], p["status"], _num(p["seconds"], ".1f"), _num(p["cap_s"], ".0f"),
                      str(p.get("error") or "")] for name, p in report["parts"].items()])
    for name, p in report["parts"].items():
        lines += ["", f"## {name}. {p['title']}", ""]
        res = p.get("result")
        if not isinstance(res, dict) or not res:
            lines.append(f"No result ({p['status']})." if not res else f"Result: {res!r:.500}")
            continue
        try:
            lines += RENDERERS.get(name, generic_md)(res)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # an unexpected shape: still a summary
            lines += [f"(table not rendered: {type(exc).__name__}: {exc})", *generic_md(res)]
        failed = [c for c in res.get("checks", []) if isinstance(c, dict) and not c.get("ok")]
        if failed:
            lines += ["", "Out of tolerance or failed:"] + [f"- {c.get('name', '?')}" + (
                f": {_num(c['value'], '.2e')}" if isinstance(c.get("value"), float) else "") for c in failed]
    return "\n".join(lines)
