"""The lm-evaluation-harness backend: its three requests against txl score and the model, then the harness's own
command line (in a subprocess, offline) on local tasks over the embedded WikiText-2 valid text, with the numbers it
reports equal to txl score's."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.harness_tasks import GENERATE_TASK, txl_score, wiki_model, write_tasks
from tests.harness_tasks import samples as logged_samples
from tests.helpers import REPO
from transformer_xl.data import Vocab
from transformer_xl.errors import TXLError
from transformer_xl.inference.evaluate import evaluate
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.inference.score import score_text
from transformer_xl.integrations.harness import TransformerXLHarness


def _req(*args):
    return SimpleNamespace(args=args)


@pytest.fixture(scope="module")
def wiki(tmp_path_factory) -> tuple[Path, list[str]]:
    """A tiny random model over the words of the first lines of the embedded WikiText-2 valid text (a tenth of them
    left out, so that some words are <unk>), saved to a directory; and that text's documents."""
    return wiki_model(tmp_path_factory.mktemp("harness"))


def test_loglikelihood_reads_long_contexts_segment_by_segment_with_memory(wiki) -> None:
    model_dir, docs = wiki
    lm = TransformerXLHarness(str(model_dir), batch_size=3)
    enc = lm.encoder
    context, continuation = " ".join(docs[1].split()[:90]), " " + " ".join(docs[1].split()[90:95])
    (ll, _), *_ = lm.loglikelihood([_req(context, continuation), _req("", "Homarus"), _req("a b", " c")])
    stream = np.asarray(enc.start_ids() + enc.string_ids(context + continuation))
    assert len(stream) > 5 * lm.model.config.tgt_len  # the context spans several segments
    ref = evaluate(lm.model, stream, batch_size=1, return_nll=True)  # the official reading, memory carried
    assert math.isclose(ll, -ref.nll[-5:].sum(), rel_tol=0, abs_tol=1e-5)
    alone = TransformerXLHarness(str(model_dir), batch_size=1).loglikelihood([_req(context, continuation)])[0][0]
    assert math.isclose(ll, alone, rel_tol=0, abs_tol=1e-5)


def test_is_greedy_and_a_word_cut_in_two(wiki) -> None:
    model_dir, _ = wiki
    lm = TransformerXLHarness(str(model_dir))
    enc = lm.encoder
    ids = enc.start_ids() + enc.string_ids("The game")
    out = lm.model.generate(torch.tensor([ids]), max_new_tokens=3)
    greedy = " " + " ".join(enc.vocab.decode(out.sequences[0, len(ids):].tolist()))
    (_, hit), (_, miss) = lm.loglikelihood([_req("The game", greedy), _req("The game", " , , ,")])
    assert hit is True and (miss is False or greedy == " , , ,")
    assert lm.split_pair("Homarus", " gammarus") == (enc.string_ids("Homarus"), enc.string_ids("gammarus"))
    assert lm.split_pair("Homarus\n", "gammarus") == (enc.string_ids("Homarus\n"), enc.string_ids("gammarus"))
    assert enc.string_ids("Homarus\n")[-1] == enc.vocab.eos_idx
    assert lm.split_pair("Homa", "rus gammarus") == (enc.string_ids("Homa"), enc.string_ids("rus gammarus"))


def test_rolling_equals_txl_score_documents(wiki) -> None:
    model_dir, docs = wiki
    lm = TransformerXLHarness(str(model_dir), batch_size=4, mem_len=24, same_length="true")
    rolling = lm.loglikelihood_rolling([_req(d) for d in docs])
    scored = score_text(lm.model, LineEncoder.for_model(model_dir), "\n\n".join(docs), documents=True,
                        mem_len=24, same_length=True)
    assert rolling == pytest.approx([s.total_log_prob for s in scored], rel=0, abs=1e-5)


def test_generate_until_stops_at_strings_and_lengths(wiki) -> None:
    model_dir, _ = wiki
    lm = TransformerXLHarness(str(model_dir))
    full = lm.generate_until([_req("The game", {"max_gen_toks": 6})])[0]
    ids = lm.encoder.start_ids() + lm.encoder.string_ids("The game")
    new = lm.model.generate(torch.tensor([ids]), max_new_tokens=6).sequences[0, len(ids):].tolist()
    assert full == lm.encoder.codec.decoder(ids).feed(new)
    stop = full.split()[2]
    cut = lm.generate_until([_req("The game", {"until": [stop], "max_gen_toks": 6})])[0]
    assert cut == full[:full.index(stop)] and stop not in cut


def test_model_arguments(wiki) -> None:
    model_dir, _ = wiki
    lm = TransformerXLHarness(str(model_dir), mem_len="32", clamp_len=8, same_length="True", batch_size="auto")
    assert lm.lengths == dict(tgt_len=None, mem_len=32, clamp_len=8, same_length=True) and lm.batch_size == 16
    from transformer_xl.errors import ConfigError

    with pytest.raises(ConfigError, match="same_length must be true or false"):
        TransformerXLHarness(str(model_dir), same_length="maybe")


def test_model_arguments_as_the_harness_passes_them(wiki, capsys) -> None:
    """``--model_args`` text and the harness's own ``--batch_size``/``--device``: flags in any spelling, numbers as
    text, bounds refused in one line, a CUDA device falling back to the CPU with a note where CUDA is missing."""
    from transformer_xl.errors import ConfigError

    model_dir, _ = wiki
    lm = TransformerXLHarness.create_from_arg_string(
        f"pretrained={model_dir},mem_len=0,tgt_len=4,same_length=no,clamp_len=-1",
        {"batch_size": 5, "device": "cpu", "max_length": None})
    assert lm.lengths == dict(tgt_len=4, mem_len=0, clamp_len=-1, same_length=False) and lm.batch_size == 5
    obj = TransformerXLHarness.create_from_arg_obj({"pretrained": str(model_dir), "batch_size": "2",
                                                    "same_length": "YES"}, {"batch_size": 7, "device": None})
    assert obj.batch_size == 2 and obj.lengths["same_length"] is True
    assert TransformerXLHarness(str(model_dir), same_length=0).lengths["same_length"] is False
    assert TransformerXLHarness(str(model_dir), same_length=" 1 ").lengths["same_length"] is True
    assert TransformerXLHarness(str(model_dir), batch_size=None).batch_size == 1
    for args, message in ((dict(mem_len=-1), "^mem_len must be >= 0, got -1$"),
                          (dict(tgt_len="0"), "^tgt_len must be >= 1, got 0$"),
                          (dict(clamp_len=-2), "^clamp_len must be >= -1, got -2$"),
                          (dict(batch_size=0), "^batch_size must be >= 1, got 0$"),
                          (dict(mem_len="many"), "^mem_len must be an integer, got 'many'$")):
        with pytest.raises(ConfigError, match=message):
            TransformerXLHarness(str(model_dir), **args)
    if not torch.cuda.is_available():
        capsys.readouterr()
        assert next(TransformerXLHarness(str(model_dir), device="cuda:0").model.parameters()).device.type == "cpu"
        assert capsys.readouterr().err == ("transformer-xl: device cuda:0 asked for but CUDA is not available; using "
                                           "the CPU\n")
        assert next(TransformerXLHarness(str(model_dir)).model.parameters()).device.type == "cpu"
        assert capsys.readouterr().err == ""


def test_generate_until_a_single_string_and_sampling_at_temperature_zero(wiki) -> None:
    model_dir, docs = wiki
    lm = TransformerXLHarness(str(model_dir), mem_len=2)
    full = lm.generate_until([_req("The game", {"max_gen_toks": 8})])[0]
    stop = full.split()[3]
    assert lm.generate_until([_req("The game", {"until": stop, "max_gen_toks": 8})])[0] == full[:full.index(stop)]
    greedy_at_zero = {"max_gen_toks": 8, "do_sample": True, "temperature": 0}
    assert lm.generate_until([_req("The game", greedy_at_zero)])[0] == full
    ids = lm.encoder.start_ids() + lm.encoder.string_ids("The game")
    new = lm.model.generate(torch.tensor([ids]), max_new_tokens=8, mem_len=2).sequences[0, len(ids):].tolist()
    assert full == lm.encoder.codec.decoder(ids).feed(new)
    sampled = lm.generate_until([_req("The game", {"max_gen_toks": 8, "do_sample": True, "temperature": 5.0,
                                                   "seed": 3})] * 2)
    assert sampled[0] == sampled[1] != full  # a seeded sample at a high temperature: reproducible, not greedy
    context = " ".join(docs[1].split()[:40])
    kw = {"max_gen_toks": 8, "do_sample": True, "temperature": 1.0, "seed": 3}
    mem_2, mem_16 = lm.generate_until([_req(context, kw)])[0], TransformerXLHarness(str(model_dir)).generate_until(
        [_req(context, kw)])[0]
    assert mem_2 != mem_16  # mem_len=2 was used, not the model's 16


@pytest.mark.integration
@pytest.mark.slow
def test_the_harness_command_line_reports_txl_scores(wiki, tmp_path, capsys) -> None:
    pytest.importorskip("lm_eval")
    model_dir, docs = wiki
    tasks = write_tasks(tmp_path, docs)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "transformer_xl.integrations.harness", "--model", "transformer-xl",
           "--model_args", f"pretrained={model_dir},mem_len=24,batch_size=4", "--device", "cpu",
           "--tasks", "txl_wikitext_rolling,txl_continuation_choice,txl_generate", "--include_path", str(tasks),
           "--output_path", str(tmp_path / "out"), "--log_samples"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]

    def samples(task: str) -> list[dict]:
        return logged_samples(tmp_path / "out", task)

    # perplexity: each document's log-likelihood is txl score's total for it
    (tmp_path / "docs.txt").write_text("\n\n".join(docs) + "\n")
    scored = txl_score([str(model_dir), str(tmp_path / "docs.txt"), "--documents", "--mem-len", "24"], capsys)
    logged = [float(s["resps"][0][0]) for s in samples("txl_wikitext_rolling")]
    # to float32 rounding of each token's log-probability (batches of 4 against 16: on AVX2 and AMX kernels a row's
    # product depends on its batch, by a unit or two in the last place); a token scored wrongly is off by far more
    assert len(logged) == len(scored)
    for got, want in zip(logged, scored):
        assert got == pytest.approx(want["total_log_prob"], rel=0, abs=1e-6 * want["n_tokens"])
    words = sum(len(re.split(r"\s+", d)) for d in docs)
    ppl = math.exp(-sum(r["total_log_prob"] for r in scored) / words)
    # from the totals above, to their float rounding
    assert math.isclose(results["txl_wikitext_rolling"]["word_perplexity,none"], ppl, rel_tol=1e-6)
    # two choices: a choice's log-likelihood is the sum of txl score's log-probabilities of its words
    chosen = []
    for s in samples("txl_continuation_choice"):
        lls = []
        for choice, resp in zip(s["doc"]["choices"], s["resps"]):
            (tmp_path / "pair.txt").write_text(s["doc"]["context"] + " " + choice + "\n")
            rec = txl_score([str(model_dir), str(tmp_path / "pair.txt"), "--mem-len", "24"], capsys)[0]
            n = len(choice.split())
            lls.append(math.fsum(rec["log_probs"][-n - 1:-1]))  # the choice's words, before the line's <eos>
            assert float(resp[0][0]) == pytest.approx(lls[-1], rel=1e-6, abs=0)  # batched with padding: float32
        chosen.append(int(np.argmax(lls)) == s["doc"]["label"])
    assert results["txl_continuation_choice"]["acc,none"] == pytest.approx(np.mean(chosen), abs=1e-12)
    # generation: the backend's text for each context, cut before the "until" string
    lm = TransformerXLHarness(str(model_dir), mem_len=24)
    generated = samples("txl_generate")
    want = lm.generate_until([_req(s["doc"]["context"], {"until": [","], "max_gen_toks": 6}) for s in generated])
    assert [s["resps"][0][0] for s in generated] == want and all("," not in w for w in want)


@pytest.mark.slow
def test_the_harness_command_line_refuses_a_missing_model_in_one_line(tmp_path, capsys, monkeypatch) -> None:
    """``txl-lm-eval`` with ``pretrained=`` a path that holds no model: one line and exit 2, no traceback."""
    pytest.importorskip("lm_eval")
    from transformer_xl.integrations.harness import main

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("TXL_DEBUG", raising=False)
    (tmp_path / "choice.jsonl").write_text(json.dumps({"context": "a b", "choices": ["c", "d"], "label": 0}) + "\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    task = GENERATE_TASK.format(data=tmp_path / "choice.jsonl").replace("answer", "label")
    (tasks / "generate.yaml").write_text(task)
    missing = tmp_path / "missing"
    with pytest.raises(SystemExit) as stop:
        main(["--model", "transformer-xl", "--model_args", f"pretrained={missing}", "--tasks", "txl_generate",
              "--include_path", str(tasks), "--device", "cpu"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"txl-lm-eval: error: no such model or run directory: {missing}"
    assert not any("Traceback" in line for line in err)
    monkeypatch.setenv("TXL_DEBUG", "1")  # the error itself, for a traceback
    with pytest.raises(TXLError, match="no such model or run directory"):
        main(["--model", "transformer-xl", "--model_args", f"pretrained={missing}", "--tasks", "txl_generate",
              "--include_path", str(tasks), "--device", "cpu"])


def test_progress_lines_unless_the_harness_turns_them_off(wiki, capsys, monkeypatch) -> None:
    """The harness's ``disable_tqdm``: lines ``transformer-xl N/M`` on stderr when False (its default), none when
    True. A clock that moves 10 s per reading makes every line due at once."""
    import transformer_xl.data.progress as progress

    ticks = iter(range(0, 10**6, 10))
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: float(next(ticks))))
    model_dir, docs = wiki
    lm = TransformerXLHarness(str(model_dir), batch_size=2)
    pairs, documents = [_req("The game", " began"), _req("a b", " c")], [_req(d) for d in docs[:2]]
    capsys.readouterr()
    for ask in (lambda **kw: lm.loglikelihood(pairs, **kw), lambda **kw: lm.loglikelihood_rolling(documents, **kw)):
        ask(disable_tqdm=True)
        assert capsys.readouterr().err == ""
        ask()
        lines = capsys.readouterr().err.splitlines()
        assert lines and all(ln.startswith("transformer-xl ") for ln in lines) and "(100%)" in lines[-1]


def test_requests_are_scored_batch_size_at_a_time(wiki) -> None:
    """``batch_size`` (default 1) is the batch the model reads: each forward call's rows counted by a hook."""
    model_dir, docs = wiki
    requests = [_req("The game", " began"), _req("It was", " well received"), _req("a b", " c")]
    for kw, rows in (({}, 1), ({"batch_size": 2}, 2), ({"batch_size": "3"}, 3)):
        lm = TransformerXLHarness(str(model_dir), **kw)
        seen: list[int] = []
        lm.model.register_forward_pre_hook(lambda module, args, seen=seen: seen.append(args[0].shape[0]))
        lm.loglikelihood(requests, disable_tqdm=True)
        assert max(seen) == rows
        seen.clear()
        lm.loglikelihood_rolling([_req(d) for d in docs[:3]], disable_tqdm=True)
        assert max(seen) == rows


def test_results_go_to_the_harness_cache(wiki) -> None:
    """``--use_cache``: each result is handed to the harness's cache hook under the request's kind and arguments."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.model import CacheHook, hash_args

    model_dir, docs = wiki
    lm = TransformerXLHarness(str(model_dir))
    assert isinstance(lm.cache_hook, CacheHook) and (lm.rank, lm.world_size) == (0, 1)  # the harness's LM set up
    hook = CacheHook(None)
    hook.dbdict = {}  # what a CachingLM gives it: its store
    lm.set_cache_hook(hook)
    pairs, documents = [_req("The game", " began"), _req("a b", " c")], [_req(d) for d in docs[:2]]
    lls, rolling = lm.loglikelihood(pairs, disable_tqdm=True), lm.loglikelihood_rolling(documents, disable_tqdm=True)
    want = {hash_args("loglikelihood", r.args): v for r, v in zip(pairs, lls)}
    want |= {hash_args("loglikelihood_rolling", r.args): v for r, v in zip(documents, rolling)}
    assert hook.dbdict == want and len(want) == 4
    del lm.cache_hook  # as the plain class is without the harness installed: no hook, the same answers
    assert lm.loglikelihood(pairs, disable_tqdm=True) == lls


def test_the_device_is_cuda_where_available_else_the_cpu_with_a_note(monkeypatch, capsys) -> None:
    from transformer_xl.integrations.harness import _device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert (_device(None), _device("cuda:1"), _device("cpu")) == ("cuda", "cuda:1", "cpu")
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert (_device(None), _device("cpu")) == ("cpu", "cpu")
    assert capsys.readouterr().err == ""
    assert _device("cuda:1") == "cpu"
    assert capsys.readouterr().err == ("transformer-xl: device cuda:1 asked for but CUDA is not available; using the "
                                       "CPU\n")


def test_vocab_level_and_tokenizer_arguments_reach_the_encoder(wiki, tmp_path) -> None:
    from transformer_xl.errors import ConfigError

    model_dir, _ = wiki
    lm = TransformerXLHarness(str(model_dir), same_length="False")
    assert lm.encoder.level == "word" and lm.lengths["same_length"] is False
    Vocab(["<eos>", "<unk>", "a"], special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>").save(tmp_path / "v.json")
    with pytest.raises(ConfigError, match=rf"^the vocabulary has 3 symbols but the model predicts "
                                          rf"{lm.model.config.n_token}$"):
        TransformerXLHarness(str(model_dir), vocab=str(tmp_path / "v.json"))
    char = TransformerXLHarness(str(model_dir), level="char")
    assert char.encoder.level == "char" and char.encoder.string_ids("The") == [char.encoder.vocab.unk_idx] * 3
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = lm.encoder.vocab.idx2sym
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tok.json"))
    sub = TransformerXLHarness(str(model_dir), tokenizer=str(tmp_path / "tok.json"))
    assert sub.encoder.level == "subword" and sub.encoder.string_ids("The game") == lm.encoder.string_ids("The game")


def test_generation_defaults_and_options(wiki) -> None:
    """``max_gen_toks`` 256, greedy, ``seed`` 0 and ``temperature`` 1 unless given; ``clamp_len`` is the model
    argument's; a stop string is cut at its first place, even where one token brings it twice."""
    model_dir, docs = wiki
    lm = TransformerXLHarness(str(model_dir))
    ids = lm.encoder.start_ids() + lm.encoder.string_ids("The game")

    def gen(harness=lm, context="The game", **kw):
        return harness.generate_until([_req(context, kw)])[0]

    def model_text(n, **kw):
        new = lm.model.generate(torch.tensor([ids]), max_new_tokens=n, **kw).sequences[0, len(ids):].tolist()
        return lm.encoder.codec.decoder(ids).feed(new)

    assert gen() == model_text(256)
    full = gen(max_gen_toks=8)
    assert gen(max_gen_toks=8, temperature=-1) == full  # greedy: the temperature is not used (nor checked)
    sampled = gen(max_gen_toks=32, do_sample=True)  # long enough for seeds and temperatures to show
    assert sampled == gen(max_gen_toks=32, do_sample=True, seed=0, temperature=1.0) != gen(max_gen_toks=32)
    assert sampled != gen(max_gen_toks=32, do_sample=True, temperature=2.0)
    assert sampled != gen(max_gen_toks=32, do_sample=True, seed=1)
    context = " ".join(docs[1].split()[:60])
    clamped = TransformerXLHarness(str(model_dir), clamp_len=1)
    ctx_ids = lm.encoder.start_ids() + lm.encoder.string_ids(context)
    new = lm.model.generate(torch.tensor([ctx_ids]), max_new_tokens=8, clamp_len=1).sequences[0, len(ctx_ids):]
    assert gen(clamped, context, max_gen_toks=8) == lm.encoder.codec.decoder(ctx_ids).feed(new.tolist())
    assert gen(clamped, context, max_gen_toks=8) != gen(lm, context, max_gen_toks=8)
    for c in sorted(set(full)):  # at index 0 too, and where a word holds the character twice
        assert gen(max_gen_toks=8, until=[c]) == full[:full.index(c)]


def test_register_puts_the_backend_in_the_harness_registry(monkeypatch) -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.api import registry
    from lm_eval.api.model import LM

    from transformer_xl.integrations.harness import MODEL_NAME, register

    fresh = registry.Registry("model", base_cls=LM)
    monkeypatch.setattr(registry, "model_registry", fresh)
    register()
    register()  # twice: still one entry each
    assert fresh.get(MODEL_NAME) is TransformerXLHarness and list(fresh.keys()) == [MODEL_NAME, "txl"]
    assert fresh.get("txl") is TransformerXLHarness


def test_the_backend_is_declared_where_the_harness_looks_for_plugins() -> None:
    """The ``lm_eval.models`` entry points (lm-evaluation-harness's plugin discovery, 0.4.14 on), read through
    ``importlib.metadata`` as the harness reads them."""
    import importlib.metadata

    from transformer_xl.integrations.harness import MODEL_NAMES

    points = {e.name: e for e in importlib.metadata.entry_points(group="lm_eval.models")
              if e.value.startswith("transformer_xl.")}
    assert sorted(points) == sorted(MODEL_NAMES)
    for point in points.values():
        assert point.load() is TransformerXLHarness


def test_the_harness_finds_the_backend_by_its_entry_point_alone() -> None:
    """Where the installed harness has plugin discovery: its own registry resolves ``txl`` and ``transformer-xl`` in
    a fresh process that never imported txl."""
    import importlib.metadata

    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.api import registry

    if not hasattr(registry, "import_plugins"):
        pytest.skip(f"lm-evaluation-harness {importlib.metadata.version('lm_eval')} has no plugin discovery (0.4.14 "
                    "adds it): the entry points themselves are checked by the test before this one")
    code = ("import sys; from lm_eval.api.registry import get_model; assert 'transformer_xl' not in sys.modules; "
            "print(get_model('txl').__module__, get_model('transformer-xl').__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["transformer_xl.integrations.harness", "TransformerXLHarness"], lm_eval.__file__


def test_the_harness_command_line_without_the_harness_and_its_help(monkeypatch, capsys) -> None:
    pytest.importorskip("lm_eval")
    from transformer_xl.integrations.harness import main

    monkeypatch.setattr(sys, "argv", ["txl-lm-eval"])
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("usage: lm-eval")  # argv, not argv[0]
    monkeypatch.setitem(sys.modules, "lm_eval.__main__", None)  # as if not installed
    with pytest.raises(SystemExit) as stop:
        main(["--tasks", "x"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == ("txl-lm-eval: error: the evaluation harness is not installed: pip install -e "
                                       "'.[eval]' in the txl checkout (or its wheel with the extra: "
                                       "'transformer_xl-VERSION-py3-none-any.whl[eval]')\n")


def test_a_continuation_without_tokens_is_refused_not_certain(wiki) -> None:
    """A continuation that gives no token (empty, or spaces for a word model) has no probability to score: refused in
    one line naming the request, before any request is scored, where it was ``(0.0, True)``, certain, the best
    answer of any multiple choice (the harness's Hugging Face backend asserts continuations have tokens)."""
    from transformer_xl.errors import DataError

    model_dir, _ = wiki
    lm = TransformerXLHarness(str(model_dir))
    for n, blank in enumerate(["", "   ", "\t "]):
        requests = [_req("The game", " was")] * n + [_req("The game", blank), _req("The game", " was")]
        with pytest.raises(DataError, match=rf"^loglikelihood request {n}: the continuation {re.escape(repr(blank))} "
                                            "gives no token at the model's word level"):
            lm.loglikelihood(requests)
    (ll, _), = lm.loglikelihood([_req("The game", "\n")])  # a line end is a token (<eos>): scored
    assert ll < 0
