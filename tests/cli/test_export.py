"""txl export onnx, and txl generate --backend onnxruntime from its output: the PyTorch backend's tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import WIKI_WORDS, damage_file, one_line_error, tiny_model, word_vocab
from transformer_xl.cli import main
from transformer_xl.data import Vocab

pytest.importorskip("onnxruntime")

PROMPT = "the game was well known , the game was"


def _generate(capsys, model: str, *extra: str) -> dict:
    assert main(["generate", model, "--prompt", PROMPT, "--max-new-tokens", "20", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("options", [["--greedy"], ["--seed", "4", "--top-k", "8", "--num-samples", "2"],
                                     ["--greedy", "--mem-len", "3", "--repetition-penalty", "1.3"]])
@pytest.mark.slow
def test_generate_on_onnxruntime_gives_the_torch_backends_tokens(onnx_export, capsys, options) -> None:
    _, model_dir, export = onnx_export()
    want = _generate(capsys, str(model_dir), *options)
    got = _generate(capsys, str(export), "--backend", "onnxruntime", *options)
    assert got["prompt_ids"] == want["prompt_ids"] and len(got["samples"]) == len(want["samples"])
    for g, w in zip(got["samples"], want["samples"]):
        assert g["token_ids"] == w["token_ids"] and g["text"] == w["text"] and len(g["token_ids"]) == 20
        assert max(abs(a - b) for a, b in zip(g["log_probs"], w["log_probs"])) <= 1e-4


def test_streamed_text_on_onnxruntime_equals_torch(onnx_export, capsys) -> None:
    _, model_dir, export = onnx_export()
    args = ["--prompt", "It was", "--max-new-tokens", "8", "--stream", "--greedy"]
    assert main(["generate", str(model_dir), *args]) == 0
    want = capsys.readouterr().out
    assert main(["generate", str(export), "--backend", "onnxruntime", *args]) == 0
    assert capsys.readouterr().out == want


@pytest.mark.parametrize(("overrides", "why"), [(dict(same_length=True), "same_length"),
                                                (dict(sample_softmax=4), "sampled softmax")])
def test_export_refuses_an_unsupported_model_in_one_line(tmp_path, capsys, overrides, why) -> None:
    vocab = word_vocab()
    tiny_model(n_token=len(vocab), **overrides).save_pretrained(tmp_path / "m", vocab=vocab)
    assert main(["export", "onnx", str(tmp_path / "m"), str(tmp_path / "out")]) == 2
    assert why in one_line_error(capsys, "txl export: error:")
    assert not (tmp_path / "out").exists()


def test_export_verifies_the_model_unless_told_not_to(tmp_path, capsys) -> None:
    """A model whose files changed after they were written is refused; ``--no-verify`` loads it (and the refusal
    is then the model's own: this one has same_length)."""
    vocab = word_vocab()
    tiny_model(n_token=len(vocab), same_length=True).save_pretrained(tmp_path / "m", vocab=vocab)
    damage_file(tmp_path / "m" / "model.safetensors", "bit-flip")
    assert main(["export", "onnx", str(tmp_path / "m"), str(tmp_path / "out")]) == 2
    assert "model.safetensors does not match its SHA-256" in one_line_error(capsys, "txl export: error:")
    assert main(["export", "onnx", str(tmp_path / "m"), str(tmp_path / "out"), "--no-verify"]) == 2
    assert "same_length" in one_line_error(capsys, "txl export: error:")
    assert not (tmp_path / "out").exists()


def test_a_vocabulary_given_is_the_one_exported(tmp_path, capsys) -> None:
    """``--vocab`` replaces the vocabulary beside the model: one that is missing, or of another size, is refused
    before anything is exported."""
    vocab = word_vocab()
    tiny_model(n_token=len(vocab)).save_pretrained(tmp_path / "m", vocab=vocab)
    out = str(tmp_path / "out")
    assert main(["export", "onnx", str(tmp_path / "m"), out, "--vocab", str(tmp_path / "missing.json")]) == 2
    assert str(tmp_path / "missing.json") in one_line_error(capsys, "txl export: error:")
    (tmp_path / "other.json").write_text(Vocab([*WIKI_WORDS, "extra"], special=["<eos>", "<unk>"], eos="<eos>",
                                               unk="<unk>").to_json())
    assert main(["export", "onnx", str(tmp_path / "m"), out, "--vocab", str(tmp_path / "other.json")]) == 2
    err = one_line_error(capsys, "txl export: error:")
    assert f"the vocabulary has {len(vocab) + 1} symbols but the model predicts n_token={len(vocab)}" in err
    assert not (tmp_path / "out").exists()


def test_a_run_without_its_vocabulary_or_tokenizer_is_told_in_order(tmp_path, capsys) -> None:
    """From a run directory: which model is used, then that no vocabulary is beside it (a warning), then the
    tokenizer the run recorded, which is missing: refused before anything is exported."""
    run, missing = tmp_path / "run", tmp_path / "tok.json"
    tiny_model().save_pretrained(run / "best")
    (run / "config.json").write_text(json.dumps({"train": {"tokenizer": str(missing), "level": "word"}}))
    assert main(["export", "onnx", str(run), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"txl export: using {run / 'best'} (the best validation model)",
        "txl export: warning: no vocabulary beside the model; generating from the export needs --vocab",
        f"txl export: error: the model's tokenizer {missing} (recorded by its run) is not found"]
    assert not (tmp_path / "out").exists()


@pytest.mark.exports
@pytest.mark.slow
def test_a_subword_model_is_exported_with_its_tokenizer_without_a_vocabulary(tmp_path, capsys) -> None:
    """A model of a run that recorded a tokenizer and has no vocabulary beside it: a warning, then an export with
    the tokenizer (recorded as how text is split) and no vocabulary or level."""
    run, tokenizer = tmp_path / "run", tmp_path / "tok.json"
    tokenizer.write_text('{"model": {"type": "BPE"}}')
    tiny_model().save_pretrained(run / "best")
    (run / "config.json").write_text(json.dumps({"train": {"tokenizer": str(tokenizer)}}))
    out = tmp_path / "out"
    assert main(["export", "onnx", str(run / "best"), str(out)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "txl export: warning: no vocabulary beside the model; generating from the export needs --vocab",
        f"txl export: wrote {out} (segment.onnx, step.onnx; see {out}/onnx_export.json)"]
    assert (out / "tokenizer.json").read_text() == tokenizer.read_text() and not (out / "vocab.json").exists()
    assert json.loads((out / "onnx_export.json").read_text())["text"] == {"tokenizer": "tokenizer.json"}


def test_export_names_its_format_and_arguments_when_missing(capsys) -> None:
    assert main(["export"]) == 2
    assert "{onnx}" in capsys.readouterr().err
    assert main(["export", "onnx"]) == 2
    assert "the following arguments are required: MODEL_OR_RUN_DIR, OUT_DIR" in capsys.readouterr().err


def test_help_describes_the_command_and_its_arguments(capsys, monkeypatch) -> None:
    """``txl export --help`` and ``txl export onnx --help``: what each does, its format, arguments and options (the
    command list names export with its one-line summary)."""
    from transformer_xl.cli import _build_parser
    from transformer_xl.cli.export import EXPORT_HELP, ONNX_HELP

    monkeypatch.setenv("COLUMNS", "400")  # one line per argument: the phrases below are not cut by wrapping
    helps = {}
    for argv in (["--help"], ["export", "--help"], ["export", "onnx", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        helps[" ".join(argv)] = " ".join(capsys.readouterr().out.split())
    summary, _, description = EXPORT_HELP.partition("\n\n")
    assert f"export {summary.strip()}" in helps["--help"]
    assert helps["export --help"].startswith("usage: txl export [-h] ") and " {onnx} ... " in helps["export --help"]
    assert " ".join(description.split()) in helps["export --help"]
    summary, _, description = ONNX_HELP.partition("\n\n")
    assert f"onnx {' '.join(summary.split())}" in helps["export --help"]
    out = helps["export onnx --help"]
    for text in (" ".join(description.split()),
                 "MODEL_OR_RUN_DIR txl model directory (config.json + model.safetensors), checkpoint step_* dir, or "
                 "run dir; a Hugging Face Hub id",
                 "OUT_DIR the export directory to write: new, empty or an earlier export (which is replaced)",
                 "--force write OUT_DIR even when it holds what txl export did not write (or the model): the old one "
                 "is moved aside to OUT_DIR.old-N, not deleted",
                 "--vocab VOCAB vocabulary JSON (default: MODEL_DIR/vocab.json, else the run's)",
                 "--no-verify load weights"):
        assert text in out, text
    args = _build_parser().parse_args(["export", "onnx", "m", "out"])
    assert (args.format, args.model_dir, args.out_dir, args.vocab, args.no_verify, args.force) == (
        "onnx", "m", "out", None, False, False)


def test_onnxruntime_backend_refusals_are_one_line(onnx_export, tmp_path, capsys) -> None:
    _, model_dir, export = onnx_export()
    assert main(["generate", str(tmp_path / "nowhere"), "--backend", "onnxruntime"]) == 2
    assert "not found" in one_line_error(capsys, "txl generate: error:")
    assert main(["generate", str(model_dir), "--backend", "onnxruntime"]) == 2
    assert "not an ONNX export" in one_line_error(capsys, "txl generate: error:")
    assert main(["generate", str(export), "--backend", "onnxruntime", "--captured"]) == 2
    assert "--captured" in one_line_error(capsys, "txl generate: error:")
    assert main(["export", "onnx", str(tmp_path / "nowhere"), str(tmp_path / "out")]) != 0
    one_line_error(capsys, "txl export: error:")


# ------------------------------------------------------------------------------------------ the output directory
def _run_dir(root: Path, **overrides) -> Path:
    """A training run's directory: its best model (with the vocabulary), a checkpoint, metrics and config."""
    vocab = word_vocab()
    run = root / "run"
    tiny_model(n_token=len(vocab), n_layer=1, **overrides).save_pretrained(run / "best", vocab=vocab)
    tiny_model(n_token=len(vocab), n_layer=1).save_pretrained(run / "checkpoints" / "step_00000002")
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "train_loss": 3.0}\n')
    (run / "config.json").write_text(json.dumps({"train": {"level": "word"}}))
    return run


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _last_error(capsys) -> str:
    """The command's one-line error: the last line of stderr (a note of the model used may come first)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.endswith("\n"), err
    last = err.splitlines()[-1]
    assert last.startswith("txl export: error: "), err
    return last


@pytest.mark.parametrize("where", ["the run", "its best model", "a parent of the run", "inside the model",
                                   "a folder of the user's"])
def test_export_refuses_the_model_its_parents_and_what_it_did_not_write(tmp_path, capsys, where) -> None:
    """``txl export onnx RUN RUN`` (and the model's directory, a parent of it, a folder inside it, a folder holding
    the user's files) is refused in one line naming --force, before anything is exported: every file stays."""
    run = _run_dir(tmp_path)
    out = {"the run": run, "its best model": run / "best", "a parent of the run": tmp_path,
           "inside the model": run / "best" / "onnx", "a folder of the user's": tmp_path / "mine"}[where]
    if where == "a folder of the user's":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    before = _tree(tmp_path)
    assert main(["export", "onnx", str(run), str(out)]) == 2
    err = _last_error(capsys)
    assert f"txl export: error: {out} " in err and "refusing to write there" in err and "--force" in err
    assert _tree(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"run", *(["mine"] if "user" in where else [])})


def test_an_earlier_export_is_replaceable_but_not_with_the_users_files_in_it(onnx_export, tmp_path, capsys) -> None:
    """An earlier export (its manifest says txl export onnx wrote it) passes the claim: the refusal that follows is
    the model's own (same_length), and the export is untouched; with a file of the user's in it, the claim refuses."""
    _, _, export = onnx_export()
    earlier = tmp_path / "earlier"
    shutil.copytree(export, earlier)
    vocab = word_vocab()
    tiny_model(n_token=len(vocab), same_length=True).save_pretrained(tmp_path / "m", vocab=vocab)
    before = _tree(earlier)
    assert main(["export", "onnx", str(tmp_path / "m"), str(earlier)]) == 2
    assert "same_length" in one_line_error(capsys, "txl export: error:")
    (earlier / "notes.txt").write_text("mine")
    assert main(["export", "onnx", str(tmp_path / "m"), str(earlier)]) == 2
    assert f"{earlier} holds what txl export onnx did not write (notes.txt)" in one_line_error(capsys, "txl export")
    assert _tree(earlier) == {**before, "notes.txt": b"mine"}


@pytest.mark.exports
@pytest.mark.slow
def test_force_exports_over_the_run_and_keeps_the_old_run_whole(tmp_path, capsys) -> None:
    """``txl export onnx RUN RUN --force``: the export takes RUN's place and the run, every file of it, is moved to
    RUN.old-1 (read from its old place while exporting); nothing is deleted."""
    from transformer_xl.interop.onnx_export import OUTPUT
    from transformer_xl.store.manifest import plain_files, verify_manifest

    run = _run_dir(tmp_path)
    before = _tree(run)
    assert main(["export", "onnx", str(run), str(run), "--force"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"txl export: using {run / 'best'} (the best validation model)",
        f"txl export: moved the old {run} aside to {tmp_path / 'run.old-1'} (--force)",
        f"txl export: wrote {run} (segment.onnx, step.onnx; see {run}/onnx_export.json)"]
    assert _tree(tmp_path / "run.old-1") == before
    manifest = verify_manifest(run, required=True)
    assert manifest["output"] == OUTPUT and set(manifest["files"]) == set(plain_files(run))
    assert {"segment.onnx", "step.onnx", "vocab.json", "config.json", "onnx_export.json"} == set(manifest["files"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run.old-1"]


# --------------------------------------------------------------------------- a changed export, on the CLI's path
def _generate_error(capsys, export: Path, *extra: str) -> str:
    assert main(["generate", str(export), "--backend", "onnxruntime", "--prompt", PROMPT, "--max-new-tokens", "3",
                 *extra]) == 2
    return one_line_error(capsys, "txl generate: error:")


def test_a_swapped_graph_is_a_one_line_error_even_unverified(onnx_export, tmp_path, capsys) -> None:
    """The graphs swapped for each other: refused by their SHA-256; with --no-verify, by their inputs (the segment
    graph reads one token), before ONNX Runtime runs it. No traceback either way."""
    _, _, export = onnx_export()
    swapped = tmp_path / "swapped"
    shutil.copytree(export, swapped)
    (swapped / "segment.onnx").write_bytes((export / "step.onnx").read_bytes())
    (swapped / "step.onnx").write_bytes((export / "segment.onnx").read_bytes())
    assert "segment.onnx does not match its SHA-256" in _generate_error(capsys, swapped)
    err = _generate_error(capsys, swapped, "--no-verify")
    assert f"{swapped / 'segment.onnx'} is not this export's segment graph" in err


def test_a_manifest_that_omits_a_graph_is_refused(onnx_export, tmp_path, capsys) -> None:
    """A manifest rewritten without segment.onnx (so that a graph swapped in is not checked) is refused: every file
    txl reads must be listed."""
    from transformer_xl.store.manifest import write_manifest

    _, _, export = onnx_export()
    partial = tmp_path / "partial"
    shutil.copytree(export, partial)
    write_manifest(partial, ["step.onnx", "onnx_export.json", "config.json", "vocab.json"])
    err = _generate_error(capsys, partial)
    assert f"{partial / 'MANIFEST.json'} does not list segment.onnx, which txl reads from the export" in err
