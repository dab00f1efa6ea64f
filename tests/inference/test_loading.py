"""Loading what inference needs: the model behind any directory (verified when it is a checkpoint), in eval mode,
and its vocabulary."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_same_outputs, damage_file, eval_model, model_dirs
from transformer_xl.data import Vocab
from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.inference.loading import load_model, load_vocab
from transformer_xl.store.checkpoint import save_checkpoint


def test_load_model_resolves_run_dirs_and_returns_eval_mode(tmp_path) -> None:
    model = eval_model()
    model.save_pretrained(tmp_path / "run" / "best")
    loaded, directory = load_model(tmp_path / "run")
    assert directory == tmp_path / "run" / "best" and not loaded.training
    assert_same_outputs(model, loaded)


def test_load_model_tells_which_model_of_a_run_it_picked_once_loaded(tmp_path) -> None:
    model = eval_model()
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints", 3, model.state_dict(), model.config.to_json(),
                           {"step": 3})
    notes: list[str] = []
    assert load_model(tmp_path / "run", note=notes.append)[1] == ckpt
    assert notes == [f"using {ckpt} (the newest checkpoint; no best/ or final/)"]
    notes.clear()
    load_model(ckpt, note=notes.append)  # a model or checkpoint directory given as such: nothing to tell
    assert notes == []
    damage_file(ckpt / "model.safetensors", "bit-flip")
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_model(tmp_path / "run", note=notes.append)
    assert notes == []  # a refused model was not used: the error is the one line


def test_a_corrupt_checkpoint_is_refused(tmp_path) -> None:
    model = eval_model()
    ckpt = save_checkpoint(tmp_path / "checkpoints", 3, model.state_dict(), model.config.to_json(), {"step": 3})
    assert load_model(ckpt)[1] == ckpt
    weights = ckpt / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 0xFF
    weights.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_model(ckpt)


def test_load_vocab_from_the_run(tmp_path) -> None:
    eval_model().save_pretrained(tmp_path / "run" / "best")
    Vocab(["a", "b"]).save(tmp_path / "run" / "vocab.json")
    assert load_vocab(tmp_path / "run" / "best").idx2sym == ["a", "b"]


def test_unknown_or_absent_devices_are_one_line_errors(tmp_path) -> None:
    eval_model().save_pretrained(tmp_path / "m")
    with pytest.raises(ConfigError, match="unknown device 'bogus'"):
        load_model(tmp_path / "m", device="bogus")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            load_model(tmp_path / "m", device="cuda")


def test_check_dataset_refuses_another_vocabulary_or_size(tmp_path) -> None:
    from types import SimpleNamespace

    from tests.helpers import model_dir_with_vocab, word_vocab
    from transformer_xl.errors import DataError
    from transformer_xl.inference.loading import check_dataset

    vocab = word_vocab()
    model, directory = model_dir_with_vocab(tmp_path, vocab)
    check_dataset(model, directory, SimpleNamespace(vocab=vocab), "mine")
    swapped = Vocab([*vocab.idx2sym[:-2], vocab.idx2sym[-1], vocab.idx2sym[-2]], special=["<eos>", "<unk>"],
                    eos="<eos>", unk="<unk>")  # same size, two ids exchanged: the model would score garbage
    with pytest.raises(DataError, match=r"vocabulary of mine \(20 symbols\) differs from the model's"):
        check_dataset(model, directory, SimpleNamespace(vocab=swapped), "mine")
    (directory / "vocab.json").unlink()
    check_dataset(model, directory, SimpleNamespace(vocab=swapped), "mine")  # no vocabulary: sizes only
    smaller = Vocab(vocab.idx2sym[:-1], special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>")
    with pytest.raises(DataError, match="has 19 symbols but the model predicts 20"):
        check_dataset(model, directory, SimpleNamespace(vocab=smaller), "mine")


@pytest.mark.parametrize("damage", ["truncate", "bit-flip"])
def test_every_kind_of_model_dir_is_verified_and_verify_false_skips_it(tmp_path, damage) -> None:
    dirs = model_dirs(tmp_path, eval_model())
    assert load_model(tmp_path / "run")[1] == dirs["best"]  # a run directory: its best/, train_info.json listed
    for kind, directory in dirs.items():
        damage_file(directory / "model.safetensors", damage)
        with pytest.raises(CheckpointError, match=r"model\.safetensors does not match its SHA-256"):
            load_model(directory)
        if damage == "bit-flip":
            assert load_model(directory, verify=False)[1] == directory, kind
        else:
            with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
                load_model(directory, verify=False)


def test_a_checkpoint_without_its_manifest_is_refused_unless_not_verified(tmp_path) -> None:
    model = eval_model()
    ckpt = save_checkpoint(tmp_path / "checkpoints", 3, model.state_dict(), model.config.to_json(), {"step": 3})
    (ckpt / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match=r"is not a complete checkpoint \(no MANIFEST.json\)"):
        load_model(ckpt)  # a step_* directory is a checkpoint by its name
    assert_same_outputs(model, load_model(ckpt, verify=False)[0])


def test_load_codec_picks_the_level_of_the_vocabulary(tmp_path) -> None:
    from transformer_xl.inference.loading import load_codec

    (tmp_path / "m").mkdir()
    (tmp_path / "empty").mkdir()
    Vocab(["<eos>", "a", "b"], special=["<eos>"], eos="<eos>").save(tmp_path / "m" / "vocab.json")
    vocab, codec = load_codec(tmp_path / "m")
    assert len(vocab) == 3 and codec.level == "char" and codec.encode("ab") == [1, 2]
    assert load_codec(tmp_path / "m", level="word")[1].level == "word"
    with pytest.raises(CheckpointError):
        load_codec(tmp_path / "empty")


def test_json_files_nested_too_deeply_are_one_line_errors(tmp_path) -> None:
    """A model's ``config.json``, its vocabulary or its run's config of 100,000 ``[``: one-line errors naming the file
    (a manifest would refuse the changed file first: these directories have none, or are not verified)."""
    from transformer_xl.errors import DataError
    from transformer_xl.inference.loading import run_text_options
    from transformer_xl.store.files import write_text

    deep = "[" * 100_000
    eval_model().save_pretrained(tmp_path / "run" / "best", vocab=Vocab(["<eos>"] + [f"w{i}" for i in range(49)]))
    best = tmp_path / "run" / "best"
    (best / "MANIFEST.json").unlink()
    write_text(tmp_path / "run" / "config.json", deep)  # the run's config: not a run's config, then
    assert run_text_options(best) == {}
    write_text(best / "vocab.json", deep)
    with pytest.raises(DataError, match=rf"^vocabulary {best / 'vocab.json'} is not a usable JSON object: it is "
                                        "nested too deeply"):
        load_vocab(best)
    config = (best / "config.json").read_text()
    write_text(best / "config.json", deep)
    for verify in (True, False):
        with pytest.raises(CheckpointError, match=rf"^{best / 'config.json'} is not a usable JSON object: it is "
                                                  "nested too deeply"):
            load_model(best, verify=verify)
    write_text(best / "config.json", config)
    write_text(best / "MANIFEST.json", deep)
    message = r": a JSON file of the model \(config\.json, a manifest, the run's train_info\.json or the weights' "
    with pytest.raises(CheckpointError, match=rf"^{best}{message}metadata\) is nested too deeply to be read$"):
        load_model(best)
    (best / "MANIFEST.json").unlink()
    write_text(best / "train_info.json", deep)  # read to name the step of the model a run directory picks
    with pytest.raises(CheckpointError, match=rf"^{tmp_path / 'run'}{message}"):
        load_model(tmp_path / "run")
    model = eval_model()
    ckpt = save_checkpoint(tmp_path / "run2" / "checkpoints", 3, model.state_dict(), model.config.to_json(), {})
    write_text(ckpt / "MANIFEST.json", deep)
    with pytest.raises(CheckpointError, match=rf"^{ckpt}{message}"):
        load_model(ckpt)


def test_fits_sees_the_config_before_the_model_is_built(tmp_path, monkeypatch) -> None:
    """``fits`` is shown the config before anything is built, and its refusal is the load's; a config that cannot be
    read is left to the load, which refuses it in its own words (after the manifest)."""
    from transformer_xl.model import TransformerXLLM

    eval_model(mem_len=5).save_pretrained(tmp_path / "m")
    seen = []

    def refuse(config) -> None:
        seen.append(config.mem_len)
        raise ConfigError("too long")

    def never(*args, **kwargs):
        raise AssertionError("built")

    with monkeypatch.context() as m:
        m.setattr(TransformerXLLM, "from_pretrained", never)
        with pytest.raises(ConfigError, match="too long"):
            load_model(tmp_path / "m", fits=refuse)
    assert seen == [5]
    assert load_model(tmp_path / "m", fits=seen.append)[0].config.mem_len == 5 and seen[-1].mem_len == 5
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json does not match its SHA-256"):
        load_model(tmp_path / "m", fits=refuse)
