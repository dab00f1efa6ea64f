"""txl convert: official and Hugging Face checkpoints in and out, vocabularies, refusals before writing."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from tests.helpers import HF_SYMS as SYMS
from tests.helpers import (
    MODEL_ARG_KINDS,
    assert_cli_refuses_damage,
    assert_model_note,
    damage_file,
    model_arg,
    model_dirs,
)
from tests.helpers import HostilePickle as _Evil
from tests.helpers import hf_tokenizer_dict as _tokenizer_dict
from transformer_xl import TransformerXLLM, TXLConfig
from transformer_xl.cli import main
from transformer_xl.data import Vocab


def _hf_dir(tmp_path, vocab_obj) -> str:
    torch.manual_seed(0)
    model = TransformerXLLM(TXLConfig(n_token=len(SYMS), n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32))
    assert main(["convert", "--to", "hf", str(model.save_pretrained(tmp_path / "ours")), "--out",
                 str(tmp_path / "hf")]) == 0
    (tmp_path / "hf" / "vocab.pkl").write_bytes(pickle.dumps(vocab_obj))
    return str(tmp_path / "hf")


def test_convert_from_hf_writes_json_vocab(tmp_path, capsys) -> None:
    hf = _hf_dir(tmp_path, _tokenizer_dict())
    assert main(["convert", "--from", "hf", hf, "--out", str(tmp_path / "m")]) == 0
    assert "vocabulary (10 symbols)" in capsys.readouterr().out
    vocab = Vocab.load(tmp_path / "m" / "vocab.json")
    assert vocab.idx2sym == SYMS and json.loads((tmp_path / "m" / "vocab.json").read_text())["eos"] == "<eos>"


def test_convert_refuses_hostile_vocab_before_writing(tmp_path, capsys) -> None:
    marker = tmp_path / "pwned"
    hf = _hf_dir(tmp_path, {**_tokenizer_dict(), "x": _Evil(str(marker))})
    capsys.readouterr()
    assert main(["convert", "--from", "hf", hf, "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txl convert: error:") and "system" in err and err.count("\n") == 1
    assert not marker.exists() and not (tmp_path / "m").exists()


def _saved_model(tmp_path, **kw):
    base = dict(n_token=60, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=4, mem_len=4,
                cutoffs=[20, 40], div_val=2, tie_projs=[False, True, True], init_std=0.3, untie_r=True)
    base.update(kw)
    torch.manual_seed(0)
    model = TransformerXLLM(TXLConfig(**base)).eval()
    model.save_pretrained(tmp_path / "model")
    return model


def _nll(model, seed=0):
    x = torch.randint(0, 60, (2, 4), generator=torch.Generator().manual_seed(seed))
    return model(x, x).nll


@pytest.mark.hf4
@pytest.mark.parametrize("untie_r", [True, False])
def test_convert_hf_export_loads_in_transformers_and_back(tmp_path, untie_r) -> None:
    transfo = pytest.importorskip("transformers.models.deprecated.transfo_xl.modeling_transfo_xl")
    model = _saved_model(tmp_path, untie_r=untie_r)
    assert main(["convert", str(tmp_path / "model"), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    manifest = json.loads((tmp_path / "hf" / "MANIFEST.json").read_text())
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors"]
    hf = transfo.TransfoXLLMHeadModel.from_pretrained(tmp_path / "hf")  # the manifest beside does not disturb it
    ours_back = TransformerXLLM.from_pretrained(tmp_path / "model")
    assert main(["convert", str(tmp_path / "hf"), "--from", "hf", "--out", str(tmp_path / "again")]) == 0
    again = TransformerXLLM.from_pretrained(tmp_path / "again").eval()
    torch.testing.assert_close(_nll(again), _nll(ours_back))
    # HF's own weights equal ours (cluster rows in HF order)
    torch.testing.assert_close(hf.crit.cluster_weight.flip(0), model.crit.cluster_weight)
    torch.testing.assert_close(hf.transformer.layers[1].dec_attn.qkv_net.weight,
                               model.layers[1].dec_attn.qkv_net.weight)


def test_convert_official_round_trip(tmp_path) -> None:
    from safetensors.torch import load_file

    model = _saved_model(tmp_path, untie_r=False, attn_type=2)
    assert main(["convert", str(tmp_path / "model"), "--to", "official", "--out", str(tmp_path / "off")]) == 0
    state = load_file(str(tmp_path / "off" / "official_state.safetensors"))
    kwargs = json.loads((tmp_path / "off" / "official_kwargs.json").read_text())
    assert kwargs["attn_type"] == 2 and "layers.0.dec_attn.kv_net.weight" in state
    torch.save(state, tmp_path / "state.pt")  # an official state-dict checkpoint
    assert main(["convert", str(tmp_path / "state.pt"), "--from", "official", "--config",
                 str(tmp_path / "off" / "official_kwargs.json"), "--out", str(tmp_path / "back")]) == 0
    back = TransformerXLLM.from_pretrained(tmp_path / "back").eval()
    torch.testing.assert_close(_nll(back), _nll(model))


@pytest.mark.parametrize("damage", ["truncate", "bit-flip"])
def test_convert_refuses_damaged_weights_of_every_kind_of_directory(tmp_path, capsys, damage) -> None:
    dirs = model_dirs(tmp_path / "kinds", _saved_model(tmp_path, untie_r=False))
    hf = tmp_path / "kinds" / "hf"  # an export txl wrote, read back with --from hf
    assert sorted(json.loads((dirs["converted"] / "MANIFEST.json").read_text())["files"]) == [
        "config.json", "model.safetensors"]
    assert_cli_refuses_damage(lambda d: ["convert", str(d), "--to", "hf", "--out", str(tmp_path / "out")], dirs,
                              damage, capsys)
    assert_cli_refuses_damage(lambda d: ["convert", str(d), "--from", "hf", "--out", str(tmp_path / "out")],
                              {"hf": hf}, damage, capsys)


def test_convert_imports_refuse_a_damaged_official_export(tmp_path, capsys) -> None:
    # nothing tied: the export then holds no copies, whose disagreement would reveal the damage without a manifest
    _saved_model(tmp_path, untie_r=False, tie_weight=False, tie_projs=[False, False, False])
    off = tmp_path / "off"
    assert main(["convert", str(tmp_path / "model"), "--to", "official", "--out", str(off)]) == 0
    assert sorted(json.loads((off / "MANIFEST.json").read_text())["files"]) == [
        "official_kwargs.json", "official_state.safetensors"]
    argv = ["convert", str(off / "official_state.safetensors"), "--from", "official", "--config",
            str(off / "official_kwargs.json"), "--out", str(tmp_path / "back")]
    damage_file(off / "official_state.safetensors", "bit-flip")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "official_state.safetensors does not match its SHA-256" in err
    assert main([*argv, "--no-verify"]) == 0
    assert sorted(json.loads((tmp_path / "back" / "MANIFEST.json").read_text())["files"]) == [
        "config.json", "model.safetensors"]


def test_convert_import_refuses_a_config_far_larger_than_its_weights(tmp_path, capsys) -> None:
    _saved_model(tmp_path, untie_r=False)
    assert main(["convert", str(tmp_path / "model"), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**cfg, "d_model": 10**7}))
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "hf"), "--from", "hf", "--no-verify", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the config does not belong to these weights" in err


@pytest.mark.parametrize("kind", MODEL_ARG_KINDS)
@pytest.mark.parametrize("dst", ["official", "hf"])
def test_convert_exports_a_model_checkpoint_or_run_directory(trained_run, tmp_path, capsys, kind, dst) -> None:
    from transformer_xl.store.manifest import verify_manifest

    run, _ = trained_run
    assert main(["convert", str(model_arg(run, kind, tmp_path)), "--to", dst, "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert f"wrote {dst} weights of " in out
    assert_model_note(err, "txl convert", run, kind)
    tokenizer = {"vocab.txt", "tokenizer_config.json", "special_tokens_map.json"} if dst == "hf" else set()
    files = set(verify_manifest(tmp_path / "out", required=True)["files"])
    assert len(files) == 2 + len(tokenizer) and tokenizer <= files  # the run's vocabulary travels to HF


# ------------------------------------------------------------------ --to hf: the vocabulary as TransfoXLTokenizer files
#: A WikiText line (joiners, a clitic, brackets) with one word the vocabulary lacks ("sales").
WIKI_LINE = "It was the game 's 1 @,@ 000 sales ( well @-@ known ) , do n't ."


def _hf_tokenizer(export, monkeypatch):
    """``TransfoXLTokenizer.from_pretrained(export)``, with pickle made to fail: the files need none."""
    pytest.importorskip("sacremoses")  # what TransfoXLTokenizer itself tokenizes with
    tokenization = pytest.importorskip("transformers.models.deprecated.transfo_xl.tokenization_transfo_xl")

    def no_pickle(*args, **kwargs):
        raise AssertionError("the tokenizer unpickled something")

    monkeypatch.setattr(tokenization.pickle, "load", no_pickle)
    return tokenization.TransfoXLTokenizer.from_pretrained(export)


@pytest.mark.hf4
def test_convert_hf_export_writes_a_tokenizer_that_encodes_like_txl(tmp_path, capsys, monkeypatch) -> None:
    import warnings

    from tests.helpers import model_dir_with_vocab, word_vocab
    from transformer_xl.data.codec import TextCodec
    from transformer_xl.data.tokenize import word_tokens

    vocab = word_vocab()
    _, model_dir = model_dir_with_vocab(tmp_path, vocab)
    assert main(["convert", str(model_dir), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    out, err = capsys.readouterr()
    assert "TransfoXLTokenizer files" in out and err == ""
    files = sorted(json.loads((tmp_path / "hf" / "MANIFEST.json").read_text())["files"])
    assert files == ["config.json", "model.safetensors", "special_tokens_map.json", "tokenizer_config.json",
                     "vocab.txt"]
    tok = _hf_tokenizer(tmp_path / "hf", monkeypatch)
    assert len(tok) == len(vocab) and tok.unk_token_id == vocab.unk_idx and tok.eos_token_id == vocab.eos_idx
    tokens, _ = word_tokens(WIKI_LINE)  # how transformer_xl.data reads a corpus line
    expected = [int(i) for i in vocab.encode(tokens)]
    assert "sales" not in vocab and vocab.unk_idx in expected
    assert tok.encode(WIKI_LINE) == expected
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the <unk> of "sales"
        assert TextCodec(vocab).encode(WIKI_LINE) == expected  # and as a txl generate prompt
        raw = "It was the game's 1,000 sales (well-known), do"  # raw text: Moses and txl split it alike
        assert tok.encode(raw) == TextCodec(vocab).encode(raw)
    assert tok.decode(expected[:3]) == "It was the"
    # and back: --from hf reads the export's vocab.txt (no pickle) into the same vocabulary
    assert main(["convert", str(tmp_path / "hf"), "--from", "hf", "--out", str(tmp_path / "back")]) == 0
    from transformer_xl.data import Vocab

    assert Vocab.load(tmp_path / "back" / "vocab.json").sha256() == vocab.sha256()


def test_convert_hf_export_without_a_vocabulary_says_so(tmp_path, capsys) -> None:
    _saved_model(tmp_path, untie_r=False)
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "model"), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no tokenizer files were written" in err and "--vocab" in err
    assert sorted(json.loads((tmp_path / "hf" / "MANIFEST.json").read_text())["files"]) == [
        "config.json", "model.safetensors"]
    assert not (tmp_path / "hf" / "vocab.txt").exists()


@pytest.mark.hf4
def test_convert_hf_export_takes_vocab_and_refuses_a_wrong_size(tmp_path, capsys, monkeypatch) -> None:
    from tests.helpers import word_vocab

    _saved_model(tmp_path, untie_r=False)  # n_token 60, no vocabulary beside it
    vocab = Vocab([f"w{i}" for i in range(59)] + ["<unk>"], unk="<unk>")
    vocab.save(tmp_path / "v.json")
    argv = ["convert", str(tmp_path / "model"), "--to", "hf", "--vocab", str(tmp_path / "v.json")]
    assert main([*argv, "--out", str(tmp_path / "hf")]) == 0
    assert _hf_tokenizer(tmp_path / "hf", monkeypatch).encode("w3 w59 <unk>") == [3, 59, 59]
    word_vocab().save(tmp_path / "small.json")
    capsys.readouterr()
    argv[-1] = str(tmp_path / "small.json")
    assert main([*argv, "--out", str(tmp_path / "hf2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has 20 symbols but the model has n_token=60" in err
    assert not (tmp_path / "hf2").exists()


def test_convert_hf_export_of_a_character_vocabulary_writes_no_tokenizer(tmp_path, capsys) -> None:
    _saved_model(tmp_path, untie_r=False)
    Vocab(list("abcdefghijklmnopqrstuvwxyz") + [chr(0x100 + i) for i in range(34)]).save(
        tmp_path / "model" / "vocab.json")
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "model"), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no tokenizer files were written: the vocabulary is char-level" in err
    assert not (tmp_path / "hf" / "vocab.txt").exists()


def test_convert_from_hf_hub_id(tmp_path, hub_cache, capsys) -> None:
    """`txl convert --from hf ORG/NAME` converts the repository's own files (pytorch_model.bin, vocab.pkl)."""
    from tests.helpers import assert_same_outputs, hf_repo, one_line_error, txl_repo

    model, _ = hf_repo(tmp_path, hub_cache)
    assert main(["convert", "--from", "hf", "transfo-xl/tiny-wt103", "--out", str(tmp_path / "out")]) == 0
    assert_same_outputs(TransformerXLLM.from_pretrained(tmp_path / "out"), model)
    assert Vocab.load(tmp_path / "out" / "vocab.json").idx2sym == SYMS
    txl_repo(tmp_path, hub_cache)
    capsys.readouterr()  # transformers' own notes while the checkpoint was built
    assert main(["convert", "--from", "hf", "org/tiny", "--out", str(tmp_path / "o2")]) == 2
    assert "is a txl model already" in one_line_error(capsys)
    assert main(["convert", "--to", "hf", "org/tiny", "--out", str(tmp_path / "o3")]) == 0


@pytest.mark.hf4
def test_convert_vocab_may_name_a_dataset(tmp_path, capsys, monkeypatch) -> None:
    """``--vocab ptb``: the vocabulary of ptb's prepared cache (60 symbols, as the model); none prepared: one line."""
    from tests.data.test_named_vocab import ptb_dir
    from transformer_xl.data import load_corpus

    monkeypatch.setenv("TXL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    _saved_model(tmp_path, untie_r=False)  # n_token 60, no vocabulary beside it
    argv = ["convert", str(tmp_path / "model"), "--to", "hf", "--vocab", "ptb", "--out", str(tmp_path / "hf")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--vocab ptb: no prepared vocabulary of ptb yet; run `txl data prepare ptb`" in err
    assert not (tmp_path / "hf").exists()
    vocab = load_corpus("ptb", ptb_dir(tmp_path / "data")).vocab
    assert len(vocab) == 60
    assert main(argv) == 0
    assert _hf_tokenizer(tmp_path / "hf", monkeypatch).encode("w3 w57 nope") == [vocab.sym2idx["w3"],
                                                                                vocab.sym2idx["w57"], vocab.unk_idx]


def _tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("dst", ["hf", "official"])
def test_convert_writes_over_nothing_it_did_not_write(tmp_path, capsys, dst) -> None:
    """--out the model's own directory, a directory holding it, or a folder of the user's: refused in one line naming
    --force, every file kept. An earlier txl convert output is replaced whole (its manifest says so); --force moves
    the user's folder aside to OUT.old-1 and writes the output in its place."""
    from transformer_xl.store.manifest import verify_manifest

    _saved_model(tmp_path, untie_r=False)
    model = tmp_path / "model"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "settings"}')
    before = _tree(tmp_path)
    for out in (model, tmp_path, mine):
        assert main(["convert", str(model), "--to", dst, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"txl convert: error: {out} ") and "--force" in err, err
    assert _tree(tmp_path) == before
    out = tmp_path / "out"
    assert main(["convert", str(model), "--to", dst, "--out", str(out)]) == 0
    (out / "stale.json").write_text("{}")  # not the command's: the next write is refused, then allowed once removed
    assert main(["convert", str(model), "--to", dst, "--out", str(out)]) == 2
    (out / "stale.json").unlink()
    assert main(["convert", str(model), "--to", dst, "--out", str(out)]) == 0
    assert verify_manifest(out, required=True)["output"] == "txl convert"
    capsys.readouterr()
    assert main(["convert", str(model), "--to", dst, "--out", str(mine), "--force"]) == 0
    assert capsys.readouterr().err.endswith(f"txl convert: moved the old {mine} aside to {tmp_path / 'mine.old-1'} "
                                            "(--force)\n")
    assert _tree(tmp_path / "mine.old-1") == {"config.json": b'{"my": "settings"}'}
    assert _tree(mine) == _tree(out) and _tree(model) == {k[6:]: v for k, v in before.items() if k[:6] == "model/"}


def test_convert_import_refuses_its_input_folder_as_out(tmp_path, capsys) -> None:
    """--from hf HF_DIR --out HF_DIR (the checkpoint being read) is refused; the folder stays as it was."""
    _saved_model(tmp_path, untie_r=False)
    assert main(["convert", str(tmp_path / "model"), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    before = _tree(tmp_path / "hf")
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "hf"), "--from", "hf", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err == (f"txl convert: error: {tmp_path / 'hf'} is txl convert's own input: refusing to write there; give "
                   f"a new or empty directory, or --force to move it aside to {tmp_path / 'hf.old-1'}\n")
    assert _tree(tmp_path / "hf") == before


# ---------------------------------------------------------------------------------------------- --from tf
TF_WORDS = ["<eos>", "<unk>", "the", "game", "was", "well", "@-@", "known", ",", ".", "1", "@,@", "000", "(", ")",
            "'s", "=", "It", "n't", "do", "Valkyria", "of", "and", "é"]  # the tiny TF model's 24 symbols


def _released(tmp_path):
    """The tiny checkpoint TensorFlow wrote, in the released layout, with a Python 2 cache.pkl of 24 words."""
    from tests.interop.tf_files import py2_cache_pkl, tf_tiny

    root = tf_tiny(tmp_path / "tf_tiny")
    (root / "data" / "cache.pkl").write_bytes(py2_cache_pkl(TF_WORDS))
    return root


def test_convert_from_tf_writes_a_model_every_txl_tool_reads(tmp_path, capsys) -> None:
    from tests.interop.tf_files import segment_nll, tf_golden

    root = _released(tmp_path)
    out = tmp_path / "m"
    assert main(["convert", "--from", "tf", str(root), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "2 layers, d_model 8, 2 heads of 4" in printed.out and "vocabulary (24 symbols)" in printed.out
    assert Vocab.load(out / "vocab.json").idx2sym == TF_WORDS
    assert json.loads((out / "MANIFEST.json").read_text())["files"]
    spec, want = tf_golden()
    assert abs(segment_nll(TransformerXLLM.from_pretrained(out), spec) - want).max() < 1e-5
    # the tools: generation and scoring from the directory, and transformers 5's Auto classes
    assert main(["generate", str(out), "--prompt", "the game was", "--max-new-tokens", "5", "--seed", "0"]) == 0
    (tmp_path / "lines.txt").write_text("the game was well known .\n")
    assert main(["score", str(out), str(tmp_path / "lines.txt")]) == 0
    assert '"n_tokens": 7' in capsys.readouterr().out
    from transformers import AutoModelForCausalLM

    import transformer_xl.hf  # noqa: F401

    hf = AutoModelForCausalLM.from_pretrained(out)
    assert hf.config.n_token == 24


def test_txl_eval_reads_a_dataset_in_the_models_vocabulary_order(tmp_path, capsys) -> None:
    """A released model's vocabulary is ordered by Python 2's Counter; txl's preparation of the same text orders
    tied counts otherwise: eval reads the dataset's symbols as the model's ids (here a text of the model's words
    whose own vocabulary orders them differently)."""
    root = _released(tmp_path)
    assert main(["convert", "--from", "tf", str(root), "--out", str(tmp_path / "m"), "--preset", "lm1b"]) == 0
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (cfg["tgt_len"], cfg["mem_len"], cfg["clamp_len"], cfg["same_length"]) == (32, 128, -1, True)
    text = tmp_path / "text"
    text.mkdir()
    words = " ".join(reversed(TF_WORDS[2:]))
    for split in ("train", "valid", "test"):
        (text / f"{split}.txt").write_text(f"{words}\n" * 30)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "m"), "--dataset", str(text), "--split", "test", "--level", "word",
                 "--json", str(tmp_path / "r.json")]) == 0
    assert "read as the model's own ids" in capsys.readouterr().err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["mem_len"] == 128 and result["same_length"] is True and result["tokens"] > 0
    (text / "test.txt").write_text("a word the model never saw\n" * 30)
    for split in ("train", "valid"):
        (text / f"{split}.txt").write_text("a word the model never saw\n" * 30)
    assert main(["eval", str(tmp_path / "m"), "--dataset", str(text), "--split", "test", "--level", "word",
                 "--data-dir", str(tmp_path / "cache2")]) == 2


@pytest.mark.parametrize("damage", ["shard", "index", "shape", "hostile-pickle", "user-files"])
def test_convert_from_tf_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, capsys, damage) -> None:
    from tests.interop.tf_files import hostile_pkl

    root = _released(tmp_path)
    out = tmp_path / "out"
    prefix = root / "model" / "model.ckpt-0"
    marker = tmp_path / "ran"
    if damage == "shard":
        shard = prefix.with_name("model.ckpt-0.data-00000-of-00001")
        shard.write_bytes(shard.read_bytes()[:-64])
    elif damage == "index":
        prefix.with_name("model.ckpt-0.index").unlink()
    elif damage == "shape":  # corpus-info.json of another model
        (root / "data" / "corpus-info.json").write_text(json.dumps({"vocab_size": 30, "cutoffs": [0, 30],
                                                                    "dataset": "enwik8"}))
    elif damage == "hostile-pickle":
        (root / "data" / "cache.pkl").write_bytes(hostile_pkl(marker))
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["convert", "--from", "tf", str(root), "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("txl convert: error: ") and "Traceback" not in err, err
    assert not marker.exists()
    if damage == "user-files":
        assert (out / "notes.txt").read_text() == "mine" and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    else:
        assert not out.exists()
