"""txl generate: text, streams, JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import (
    MODEL_ARG_KINDS,
    assert_cli_refuses_damage,
    assert_model_note,
    model_arg,
    model_dirs,
    one_line_error,
)
from tests.helpers import model_dir_with_vocab as _tiny
from tests.helpers import word_vocab as _word_vocab
from transformer_xl.cli import main


def test_cli_generate_text_json_stream_and_errors(tmp_path, capsys) -> None:
    _, model_dir = _tiny(tmp_path, _word_vocab())
    assert main(["generate", str(model_dir), "--prompt", "the game", "--max-new-tokens", "12", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the game") and len(out) > len("the game\n")
    assert main(["generate", str(model_dir), "--prompt", "the game zzz", "--max-new-tokens", "6", "--json",
                 "--num-samples", "3", "--top-k", "5", "--stop-token", "<eos>"]) == 0
    cap = capsys.readouterr()
    assert "zzz" in cap.err and "warning" in cap.err
    doc = json.loads(cap.out)
    assert len(doc["samples"]) == 3 and doc["prompt_ids"][-1] == 1  # zzz -> <unk>
    for s in doc["samples"]:
        assert len(s["token_ids"]) == len(s["log_probs"]) == len(s["tokens"]) <= 6
        assert all(lp <= 0 for lp in s["log_probs"])
    assert main(["generate", str(model_dir), "--max-new-tokens", "5", "--stream", "--greedy"]) == 0
    streamed = capsys.readouterr().out
    assert main(["generate", str(model_dir), "--max-new-tokens", "5", "--greedy"]) == 0
    assert capsys.readouterr().out == streamed
    for argv, msg in [(["--top-p", "0"], "top_p"), (["--max-new-tokens", "-3"], "--max-new-tokens"),
                      (["--stream", "--num-samples", "2"], "--stream"), (["--vocab", str(tmp_path / "no.json")],
                                                                          "cannot read vocabulary")]:
        assert main(["generate", str(model_dir), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("txl generate: error:") and msg in err and err.count("\n") == 1
    (model_dir / "vocab.json").unlink()
    assert main(["generate", str(model_dir)]) == 2
    assert "--vocab" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncate", "bit-flip"])
def test_cli_generate_refuses_damaged_weights_of_every_kind_of_directory(tmp_path, capsys, damage) -> None:
    model, _ = _tiny(tmp_path, _word_vocab())
    dirs = model_dirs(tmp_path / "kinds", model, _word_vocab())
    assert_cli_refuses_damage(lambda d: ["generate", str(d), "--max-new-tokens", "3"], dirs, damage, capsys)


def test_cli_generate_refuses_non_finite_weights_in_one_line(tmp_path, capsys) -> None:
    model, model_dir = _tiny(tmp_path, _word_vocab())
    with torch.no_grad():
        model.layers[0].dec_attn.o_net.weight[0, 0] = float("nan")
    model.save_pretrained(model_dir)
    for extra in ([], ["--no-verify"]):
        assert main(["generate", str(model_dir), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "tensor 'layers.0.dec_attn.o_net.weight' holds non-finite values" in err


def test_a_damaged_run_is_one_line_on_stderr_without_a_traceback(tmp_path) -> None:
    import subprocess
    import sys

    from tests.helpers import damage_file, subprocess_env

    model, _ = _tiny(tmp_path, _word_vocab())
    dirs = model_dirs(tmp_path / "kinds", model, _word_vocab())
    damage_file(dirs["best"] / "model.safetensors", "bit-flip")
    run = subprocess.run([sys.executable, "-m", "transformer_xl", "generate", str(tmp_path / "kinds" / "run")],
                         capture_output=True, text=True, env=subprocess_env(tmp_path), timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith("txl generate: error: ") and run.stderr.count("\n") == 1, run.stderr
    assert "best/model.safetensors does not match its SHA-256 in MANIFEST.json" in run.stderr


def test_cli_generate_refuses_impossible_options_in_one_line(tmp_path, capsys) -> None:
    _, model_dir = _tiny(tmp_path, _word_vocab())
    (tmp_path / "latin1.json").write_bytes(b'{"idx2sym": ["\xe9"]}')
    cases = [(["--level", "byte"], "level 'byte' does not fit this vocabulary of word-level symbols"),
             (["--vocab", str(tmp_path / "latin1.json")], "latin1.json: 'utf-8' codec can't decode"),
             (["--num-samples", "0"], "argument --num-samples: expected a positive integer"),
             (["--mem-len=-3"], "argument --mem-len: expected an integer >= 0"),
             (["--clamp-len=-100"], "argument --clamp-len: expected an integer >= -1"),
             (["--temperature", "nan"], "argument --temperature: expected a finite number"),
             (["--seed=-1"], "argument --seed: expected a seed in [0, 2**32 - 1]")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "device 'cuda' requested but CUDA is not available"))
    for argv, message in cases:
        assert main(["generate", str(model_dir), "--max-new-tokens", "2", *argv]) == 2
        assert message in one_line_error(capsys, "txl generate: error: ")


@pytest.mark.parametrize("kind", MODEL_ARG_KINDS)
def test_cli_generate_takes_a_model_checkpoint_or_run_directory(trained_run, tmp_path, capsys, kind) -> None:
    run, _ = trained_run
    path = model_arg(run, kind, tmp_path)
    argv = ["generate", str(path), "--prompt", "the cat", "--max-new-tokens", "4", "--greedy"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith("the cat") and len(out.split()) == 6, out
    assert_model_note(err, "txl generate", run, kind)
    if kind == "model":  # a copied best/ alone is enough: the vocabulary travels with it, in its manifest
        assert "vocab.json" in json.loads((path / "MANIFEST.json").read_text())["files"]
        assert not (path.parent / "vocab.json").exists()
        (path / "vocab.json").unlink()
        assert main(argv) == 2
        assert "lacks vocab.json, which its MANIFEST.json lists" in one_line_error(capsys, "txl generate: error: ")
        assert main([*argv, "--no-verify"]) == 2
        assert "pass --vocab PATH" in one_line_error(capsys, "txl generate: error: no vocabulary for ")


def test_a_model_trained_with_a_tokenizer_generates_through_it(tmp_path, capsys) -> None:
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<eos>", "the", "cat", "sat", "on", "mat"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tok.json"))
    (tmp_path / "text").mkdir()
    for split, n in (("train", 60), ("valid", 10), ("test", 10)):
        (tmp_path / "text" / f"{split}.txt").write_text("the cat sat on the mat\n" * n)
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--dataset", str(tmp_path / "text"), "--tokenizer",
                 str(tmp_path / "tok.json"), "--max-step", "2", "--no-final-eval", "--no-progress",
                 "--out-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "the cat", "--max-new-tokens", "6", "--greedy"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the cat") and set(out.split()) <= set(words)  # the run's tokenizer, found by itself
    assert main(["generate", str(run), "--tokenizer", str(tmp_path / "tok.json"), "--level", "word"]) == 2
    assert "exclude each other" in one_line_error(capsys, "txl generate: error: ")


def test_cli_generate_quantize_int8(tmp_path, capsys, monkeypatch) -> None:
    """int8 weights in the plain step; its kernel's speed probed for the samples' rows and said in one line where it
    does not pay (the probe faked: 0.61x, a small matrix at one row on AVX2)."""
    from transformer_xl.model import int8

    asked: list[int] = []
    monkeypatch.setattr(int8, "int8_speedup", lambda n_out, n_in, rows: asked.append(rows) or 0.61)
    _, model_dir = _tiny(tmp_path, _word_vocab())
    assert main(["generate", str(model_dir), "--prompt", "the game", "--max-new-tokens", "8", "--greedy",
                 "--quantize", "int8", "--json", "--num-samples", "2"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert len(doc["samples"][0]["token_ids"]) == 8 and all(lp <= 0 for lp in doc["samples"][0]["log_probs"])
    assert asked == [2] and "txl generate: int8 weights measured 0.61x the speed of float32" in captured.err


def test_generate_from_a_hub_id(tmp_path, hub_cache, capsys) -> None:
    """`txl generate ORG/NAME` reads the model and its vocabulary from the Hub cache (offline)."""
    from tests.helpers import txl_repo

    txl_repo(tmp_path, hub_cache)
    assert main(["generate", "org/tiny", "--prompt", "the game", "--max-new-tokens", "5", "--greedy", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["samples"][0]["token_ids"]) == 5 and doc["prompt_ids"] == [2, 3]


@pytest.mark.integration
def test_generate_from_the_hub_cache_named_by_the_environment(tmp_path) -> None:
    """A fresh process honours HF_HUB_CACHE and HF_HUB_OFFLINE as huggingface_hub reads them; a missing id is one
    line on stderr and exit status 2."""
    import subprocess
    import sys

    from tests.helpers import subprocess_env, txl_repo

    txl_repo(tmp_path, tmp_path / "hub")
    env = subprocess_env(tmp_path, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    run = [sys.executable, "-m", "transformer_xl", "generate", "--prompt", "the", "--max-new-tokens", "3", "--greedy"]
    ok = subprocess.run([*run, "org/tiny"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.startswith("the "), ok.stderr
    bad = subprocess.run([*run, "org/missing"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("txl generate: error: org/missing: no local directory of that name")


def test_cli_generate_captured_gives_the_plain_tokens(tmp_path, capsys, monkeypatch) -> None:
    """``--captured`` (run eagerly here: its compiled graph is tested in tests/inference/test_captured.py), alone
    and with ``--quantize int8`` (the captured step's own int8 weights)."""
    from transformer_xl.inference import captured, decode

    monkeypatch.setattr(captured, "_compiled", lambda device, batch, **kw: decode.step)
    _, model_dir = _tiny(tmp_path, _word_vocab())
    runs = {}
    for extra in ([], ["--captured"], ["--captured", "--quantize", "int8"]):
        assert main(["generate", str(model_dir), "--prompt", "the game", "--max-new-tokens", "8", "--greedy",
                     "--num-samples", "2", "--json", *extra]) == 0
        runs[" ".join(extra)] = json.loads(capsys.readouterr().out)["samples"]
    plain, cap = runs[""], runs["--captured"]
    assert [s["token_ids"] for s in cap] == [s["token_ids"] for s in plain]
    assert max(abs(a - b) for s, t in zip(cap, plain) for a, b in zip(s["log_probs"], t["log_probs"])) <= 1e-5
    assert all(len(s["token_ids"]) == 8 for s in runs["--captured --quantize int8"])


@pytest.mark.parametrize("products, speedup, said", [("native", 0.7, True), ("native", 2.5, False),
                                                    ("compiled", 0.7, False)])
def test_captured_int8_says_in_one_line_when_its_products_do_not_pay(tmp_path, capsys, monkeypatch, products, speedup,
                                                                    said) -> None:
    """``--captured --quantize int8``: txl's kernels probed (int8 against float32, the samples' rows) and a ratio
    below 1 said in one line; inductor's forms (AVX-512 CPUs) not probed. The tokens come either way."""
    from transformer_xl.inference import captured, decode
    from transformer_xl.model import native

    monkeypatch.setattr(captured, "_compiled", lambda device, batch, **kw: decode.step)
    monkeypatch.setattr(native, "products", lambda device="cpu": products)
    asked: list[tuple] = []
    monkeypatch.setattr(native, "int8_speedup", lambda n_in, rows: asked.append((n_in, rows)) or speedup)
    _, model_dir = _tiny(tmp_path, _word_vocab())
    assert main(["generate", str(model_dir), "--prompt", "the game", "--max-new-tokens", "4", "--greedy",
                 "--num-samples", "2", "--json", "--captured", "--quantize", "int8"]) == 0
    out = capsys.readouterr()
    assert all(len(s["token_ids"]) == 4 for s in json.loads(out.out)["samples"])
    assert asked == ([(16, 2)] if products == "native" else [])  # d_model 16, 2 samples
    line = (f"txl generate: int8 weights measured {speedup:.2f}x the speed of float32 in the captured step's products "
            "on this CPU (2 rows): --quantize int8 saves memory here, not time\n")
    assert (line in out.err) == said


def test_cli_generate_chooses_the_captured_step_and_notes_its_compilation(tmp_path, capsys, monkeypatch) -> None:
    """By default the library's rule chooses (here made to say yes): the captured step, its first step noted on
    stderr, the plain step's tokens; ``--no-captured`` keeps the plain step; the two flags exclude each other."""
    from transformer_xl.inference import captured, decode
    from transformer_xl.inference import generate as gen

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(captured, "_DONE", set())
    monkeypatch.setattr(captured, "_compiled", lambda device, batch, **kw: lambda *a: decode.step(*a))  # eager
    monkeypatch.setattr(gen, "pays", lambda *a: True)
    _, model_dir = _tiny(tmp_path, _word_vocab())
    runs = {}
    for extra in ([], ["--no-captured"]):
        assert main(["generate", str(model_dir), "--prompt", "the game", "--max-new-tokens", "8", "--greedy",
                     "--json", *extra]) == 0
        out = capsys.readouterr()
        runs[" ".join(extra)] = json.loads(out.out)["samples"][0]["token_ids"], out.err
    assert runs[""][0] == runs["--no-captured"][0]
    assert "txl generate: captured decode step: compiling (expected about" in runs[""][1]
    assert "txl generate: captured decode step: first step" in runs[""][1]
    assert "captured" not in runs["--no-captured"][1]
    assert main(["generate", str(model_dir), "--captured", "--no-captured"]) == 2
    assert "not allowed with argument" in one_line_error(capsys, "txl generate: error: ")


def test_cli_generate_penalties_change_greedy_output(tmp_path, capsys) -> None:
    _, model_dir = _tiny(tmp_path, _word_vocab())
    runs = {}
    for name, extra in [("plain", []), ("ngram", ["--no-repeat-ngram-size", "1"]),
                        ("minp", ["--min-p", "0.5"])]:
        assert main(["generate", str(model_dir), "--prompt", "the game", "--max-new-tokens", "8", "--greedy",
                     "--json", *extra]) == 0
        runs[name] = json.loads(capsys.readouterr().out)["samples"][0]["token_ids"]
    assert len(set(runs["ngram"])) == 8 and not {2, 3} & set(runs["ngram"])  # no word of the text twice
    assert runs["minp"] == runs["plain"]  # min-p never removes the most likely token
    for argv, msg in [(["--repetition-penalty", "0"], "--repetition-penalty"), (["--min-p", "2"], "min_p")]:
        assert main(["generate", str(model_dir), *argv]) == 2
        assert msg in one_line_error(capsys, "txl generate: error: ")
