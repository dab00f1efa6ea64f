"""Hugging Face Hub ids (transformer_xl.interop.hub), against a Hub cache laid out as huggingface_hub lays it out,
offline: txl's own layout loads as it is, Hugging Face's TransfoXL layout (pytorch_model.bin, vocab.pkl) is converted
once and kept by commit, and a missing id or a missing huggingface_hub is one line."""

from __future__ import annotations

import pickle
import socket
import sys
from types import SimpleNamespace

import pytest

from tests.helpers import (
    HF_SYMS,
    assert_same_outputs,
    hf_checkpoint_dir,
    hf_repo,
    hf_tokenizer_dict,
    hub_repo,
    tiny_model,
    txl_repo,
)
from transformer_xl import CheckpointError, ConfigError, TransformerXLLM
from transformer_xl.errors import install_hint
from transformer_xl.interop import hub

CONNECT = socket.create_connection


class _Opened:
    """A connection that opened (and closes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


@pytest.fixture(autouse=True)
def _hub_host_answers(monkeypatch) -> None:
    """The tests that stand in for the Hub online (a stubbed hf_hub_download) open no connection: the probe of the
    Hub's host (:func:`hub.hub_reachable`) finds it answering."""
    monkeypatch.setattr(socket, "create_connection", lambda *args, **kwargs: _Opened())


@pytest.mark.parametrize(("name", "expected"), [
    ("transfo-xl/transfo-xl-wt103", ("transfo-xl/transfo-xl-wt103", None)),
    ("org/name@v1.0", ("org/name", "v1.0")),
    ("org/name@" + "a" * 40, ("org/name", "a" * 40)),
    ("org/name@refs/pr/1", ("org/name", "refs/pr/1")),
    ("name", None), ("/abs/path", None), ("a/b/c", None), ("../x", None), ("org/..", None), ("./x", None),
    ("org/name@", None), ("-org/name", None), ("org/na..me", None),
])
def test_parse_hub_id(name: str, expected, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert hub.parse_hub_id(name) == expected


def test_a_local_directory_of_the_same_name_or_of_its_org_wins(tmp_path, monkeypatch) -> None:
    """``runs/demo`` is the run when it exists, and ``runs/other`` a missing path beside it, not a Hub id."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    (tmp_path / "afile").write_text("x")
    assert hub.parse_hub_id("runs/demo") is None and hub.parse_hub_id("runs/other") is None
    assert hub.parse_hub_id("runs/other@v1") is None
    assert hub.parse_hub_id("afile/x") == ("afile/x", None) and hub.parse_hub_id("org/x") == ("org/x", None)
    assert hub.missing_path_hint("runs/other") == (" (runs/ is a local directory, so this is a path, not a Hugging "
                                                   "Face Hub id)")
    assert hub.missing_path_hint("runs/demo") == hub.missing_path_hint("org/x") == hub.missing_path_hint("a/b/c") == ""


def _no_network(monkeypatch) -> list:
    """No name resolves (a machine offline), HF_HUB_OFFLINE unset; returns the list of hf_hub_download calls."""
    import huggingface_hub
    from huggingface_hub import constants

    def no_dns(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(socket, "create_connection", CONNECT)
    for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    calls: list = []
    real = huggingface_hub.hf_hub_download

    def download(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    return calls


@pytest.mark.parametrize("command", [["eval", "runs/demoo", "--dataset", "wt2"], ["generate", "runs/x"],
                                     ["score", "runs/x", "text.txt"]])
def test_a_mistyped_run_directory_fails_at_once_without_the_hub(tmp_path, hub_cache, monkeypatch, capsys,
                                                                command) -> None:
    """``runs/demoo`` beside ``runs/`` is a missing directory: one line naming it, never sent to the Hub (which,
    unreachable, cost ~25 s of retries and their warnings)."""
    import time

    from transformer_xl.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    (tmp_path / "text.txt").write_text("some text\n")
    calls = _no_network(monkeypatch)
    start = time.monotonic()
    assert main(command) == 2
    assert time.monotonic() - start < 5 and calls == []
    err = capsys.readouterr().err
    assert err == (f"txl {command[0]}: error: no such model or run directory: {command[1]} (runs/ is a local "
                   "directory, so this is a path, not a Hugging Face Hub id)\n")


def test_an_unreachable_hub_fails_at_once_in_one_line(tmp_path, hub_cache, monkeypatch, capsys) -> None:
    """A Hub id with no network and HF_HUB_OFFLINE unset: the cache alone, at once, instead of huggingface_hub's
    retries with back-off (~25 s) and their multi-line warnings."""
    import time

    from transformer_xl.cli import main

    monkeypatch.chdir(tmp_path)
    calls = _no_network(monkeypatch)
    start = time.monotonic()
    assert main(["generate", "nobody/nothing"]) == 2
    assert time.monotonic() - start < 5 and len(calls) == 1 and calls[0][1]["local_files_only"] is True
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MaxRetryError" not in err and "Traceback" not in err
    assert err.startswith("txl generate: error: nobody/nothing: no local directory of that name, and the Hub cache")
    assert err.endswith("(the Hub could not be reached: check the network, or set HF_HUB_OFFLINE=1 to use the cache "
                        "only)\n")


def test_the_hub_probe_reads_the_endpoint_and_trusts_a_proxy(monkeypatch) -> None:
    from huggingface_hub import constants

    opened: list = []

    def connect(address, timeout):
        opened.append((address, timeout))
        if address[0] == "down.example":
            raise OSError("unreachable")
        return _Opened()

    for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(socket, "create_connection", connect)
    for endpoint, port, up in (("https://hub.example", 443, True), ("http://hub.example:8080", 8080, True),
                               ("http://hub.example", 80, True), ("https://down.example", 443, False)):
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        assert hub.hub_reachable() is up
        assert opened.pop() == ((endpoint.split("//")[1].split(":")[0], port), hub.PROBE_TIMEOUT_S)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert hub.hub_reachable() is True and opened == []


def test_revision_given_twice_must_agree() -> None:
    assert hub.split_revision("org/a@v1", None) == ("org/a", "v1")
    assert hub.split_revision("org/a", "v2") == ("org/a", "v2")
    with pytest.raises(ConfigError, match="names revision 'v1' but revision='v2'"):
        hub.split_revision("org/a@v1", "v2")


def test_txl_layout_loads_from_the_hub_cache_as_it_is(tmp_path, hub_cache) -> None:
    model, commit = txl_repo(tmp_path, hub_cache)
    snap = hub.fetch("org/tiny")
    assert (snap.repo_id, snap.commit, snap.layout) == ("org/tiny", commit, "txl")
    assert snap.path == hub_cache / "models--org--tiny" / "snapshots" / commit
    for name in ("org/tiny", f"org/tiny@{commit}"):
        assert_same_outputs(TransformerXLLM.from_pretrained(name), model)
    assert_same_outputs(TransformerXLLM.from_pretrained("org/tiny", revision="main"), model)
    assert hub.hub_model_dir("org/tiny") == snap.path  # nothing converted, nothing copied
    assert not (tmp_path / "txl-cache").exists()


def test_txl_layout_manifest_is_checked(tmp_path, hub_cache) -> None:
    _, commit = txl_repo(tmp_path, hub_cache)
    blob = (hub_cache / "models--org--tiny" / "snapshots" / commit / "vocab.json").resolve()
    blob.write_text(blob.read_text().replace("game", "gamE"))
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        TransformerXLLM.from_pretrained("org/tiny")


def test_hf_layout_is_converted_once_and_kept_by_commit(tmp_path, hub_cache, monkeypatch) -> None:
    model, commit = hf_repo(tmp_path, hub_cache)
    notes: list[str] = []
    out = hub.hub_model_dir("transfo-xl/tiny-wt103", note=notes.append)
    assert out == tmp_path / "txl-cache" / "hub" / "models--transfo-xl--tiny-wt103" / commit
    assert sorted(p.name for p in out.iterdir()) == ["MANIFEST.json", "config.json", "model.safetensors",
                                                     "vocab.json"]
    assert notes == [f"converting transfo-xl/tiny-wt103@{commit[:12]} (Hugging Face TransfoXL) once, into {out}"]
    assert_same_outputs(TransformerXLLM.from_pretrained(out), model)
    assert (out / "vocab.json").read_text().count("Valkyria") == 1

    import transformer_xl.interop.hf as hf_module

    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(hf_module, "from_hf", refuse)
    again = TransformerXLLM.from_pretrained("transfo-xl/tiny-wt103")  # the kept conversion, no second one
    assert_same_outputs(again, model)
    assert not again.training


def test_hf_layout_pickles_run_no_code(tmp_path, hub_cache) -> None:
    """A vocab.pkl that would run a command is refused, in one line, and the command does not run."""
    from tests.helpers import HostilePickle

    marker = tmp_path / "ran"
    hf_checkpoint_dir(tmp_path / "evil", tiny_model(5, n_token=len(HF_SYMS)),
                      vocab={**hf_tokenizer_dict(), "x": HostilePickle(marker)})
    hub_repo(hub_cache, "bad/evil", tmp_path / "evil")
    with pytest.raises(CheckpointError, match=r"(posix|os)\.system") as err:
        TransformerXLLM.from_pretrained("bad/evil")
    assert "\n" not in str(err.value) and not marker.exists()


def test_missing_id_or_revision_offline_is_one_line(tmp_path, hub_cache) -> None:
    txl_repo(tmp_path, hub_cache)
    with pytest.raises(CheckpointError) as err:
        TransformerXLLM.from_pretrained("nobody/nothing")
    msg = str(err.value)
    assert msg.startswith("nobody/nothing: no local directory of that name") and "HF_HUB_OFFLINE" in msg
    assert str(hub_cache) in msg and "\n" not in msg
    with pytest.raises(CheckpointError, match=r"holds no config\.json of org/tiny@v9"):
        TransformerXLLM.from_pretrained("org/tiny@v9")


def test_revision_for_a_local_directory_is_refused(tmp_path) -> None:
    tiny_model().save_pretrained(tmp_path / "m")
    with pytest.raises(ConfigError, match="applies to Hub ids"):
        TransformerXLLM.from_pretrained(tmp_path / "m", revision="main")


def test_a_repository_that_is_not_transformer_xl_is_refused(tmp_path, hub_cache) -> None:
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text('{"model_type": "gpt2", "n_embd": 8}')
    hub_repo(hub_cache, "openai/gpt", tmp_path / "gpt")
    with pytest.raises(CheckpointError, match="is not a Transformer-XL model"):
        hub.fetch("openai/gpt")


def test_missing_weights_are_one_line(tmp_path, hub_cache) -> None:
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text('{"model_type": "transfo-xl", "vocab_size": 10}')
    hub_repo(hub_cache, "org/half", tmp_path / "half")
    with pytest.raises(CheckpointError, match=r"org/half@\w{12} has no model.safetensors or pytorch_model.bin"):
        hub.fetch("org/half")


def test_without_huggingface_hub_an_id_is_one_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` now raises ImportError
    with pytest.raises(ConfigError) as err:
        TransformerXLLM.from_pretrained("transfo-xl/transfo-xl-wt103")
    assert str(err.value) == ("transfo-xl/transfo-xl-wt103: no local directory of that name, and Hub model ids "
                              f"need huggingface_hub ({install_hint('hub')})")


def test_converted_dir_is_keyed_by_repo_and_commit(tmp_path) -> None:
    assert hub.converted_dir("a/b", "c" * 40, tmp_path) == tmp_path / "hub" / "models--a--b" / ("c" * 40)


def test_a_model_is_fetched_at_the_commit_its_config_came_from(tmp_path, hub_cache, monkeypatch) -> None:
    """``main`` moves on between the download of config.json and the others (a push in between): every file
    comes from the commit config.json came from, not from where the branch now points."""
    import huggingface_hub

    model, commit = txl_repo(tmp_path, hub_cache)
    (tmp_path / "newer").mkdir()  # the newer commit: only its config.json is in the cache
    tiny_model(4).save_pretrained(tmp_path / "newer-full")
    (tmp_path / "newer" / "config.json").write_bytes((tmp_path / "newer-full" / "config.json").read_bytes())
    newer = hub_repo(hub_cache, "org/tiny", tmp_path / "newer")
    main = hub_cache / "models--org--tiny" / "refs" / "main"
    main.write_text(commit)
    real = huggingface_hub.hf_hub_download
    asked: list[tuple[str, str | None]] = []

    def push_after_the_config(repo_id, filename, **kw):
        path = real(repo_id, filename, **kw)
        asked.append((filename, kw.get("revision")))
        main.write_text(newer)  # the branch moves once config.json is read
        return path

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", push_after_the_config)
    snap = hub.fetch("org/tiny")
    assert snap.commit == commit and asked[0] == ("config.json", None)
    assert {rev for _, rev in asked[1:]} == {commit} and len(asked) > 1
    main.write_text(commit)
    assert_same_outputs(TransformerXLLM.from_pretrained(snap.path), model)


def test_a_conversion_stopped_before_its_manifest_is_made_again(tmp_path, hub_cache) -> None:
    """The manifest is written last: a conversion directory without one (the process killed while it wrote the
    weights) is converted again, never loaded as it is."""
    model, commit = hf_repo(tmp_path, hub_cache)
    out = hub.converted_dir("transfo-xl/tiny-wt103", commit)
    out.mkdir(parents=True)
    tiny_model(3).save_pretrained(out)  # another model's files...
    (out / "MANIFEST.json").unlink()  # ...without the manifest that would say the conversion was complete
    (out / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes()[:100])  # cut short
    notes: list[str] = []
    assert hub.hub_model_dir("transfo-xl/tiny-wt103", note=notes.append) == out
    assert len(notes) == 1 and (out / "MANIFEST.json").is_file()
    assert_same_outputs(TransformerXLLM.from_pretrained(out), model)


def test_hub_model_dir_reads_the_revision_asked_for(tmp_path, hub_cache) -> None:
    _, commit_a = txl_repo(tmp_path, hub_cache)
    tiny_model(4).save_pretrained(tmp_path / "b", vocab=None)
    commit_b = hub_repo(hub_cache, "org/tiny", tmp_path / "b")  # main moves on to another commit
    snapshots = hub_cache / "models--org--tiny" / "snapshots"
    assert hub.hub_model_dir("org/tiny", revision=commit_a) == snapshots / commit_a
    assert hub.hub_model_dir("org/tiny") == snapshots / commit_b


def test_what_is_missing_says_whether_the_hub_was_offline_or_unreachable(tmp_path, hub_cache, monkeypatch) -> None:
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    with pytest.raises(CheckpointError, match=r"holds no config\.json of nobody/nothing \(HF_HUB_OFFLINE is set: "
                       r"download it once online, or copy the cache\)$"):
        hub.fetch("nobody/nothing")

    def unreachable(*args, **kwargs):
        raise LocalEntryNotFoundError("cannot reach the Hub")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    with pytest.raises(CheckpointError, match=r"holds no config\.json of nobody/nothing \(the Hub could not be "
                       r"reached: check the network, or set HF_HUB_OFFLINE=1 to use the cache only\)$"):
        hub.fetch("nobody/nothing")


def test_the_layout_is_told_by_the_config() -> None:
    hf_arch = {"architectures": ["TransfoXLLMHeadModel"]}
    for config, layout in (({"model_type": "transfo-xl"}, "hf"), ({"vocab_size": 10}, "hf"), ({"n_token": 10}, "txl"),
                           ({"model_type": "transfo-xl", "n_token": 3, "vocab_size": 3}, "hf"),
                           ({"model_type": "transfo-xl", "n_token": 3, **hf_arch}, "hf"),
                           # txl's own, saved through transformers (transformer_xl.hf)
                           ({"model_type": "transfo-xl", "n_token": 3, "architectures": ["TransfoXLForCausalLM"]},
                            "txl")):
        assert hub._layout(config, "org/x") == layout, config


def test_a_hf_repository_without_a_vocabulary_converts_its_weights_alone(tmp_path, hub_cache) -> None:
    model, commit = hf_repo(tmp_path, hub_cache)
    (hub_cache / "models--transfo-xl--tiny-wt103" / "snapshots" / commit / "vocab.pkl").unlink()
    assert hub.fetch("transfo-xl/tiny-wt103").layout == "hf"
    out = hub.hub_model_dir("transfo-xl/tiny-wt103", cache_dir=tmp_path / "elsewhere")
    assert out == tmp_path / "elsewhere" / "hub" / "models--transfo-xl--tiny-wt103" / commit
    assert sorted(p.name for p in out.iterdir()) == ["MANIFEST.json", "config.json", "model.safetensors"]
    assert_same_outputs(TransformerXLLM.from_pretrained(out), model)


def _answers(hub_cache, errors: dict, asked: list | None = None):
    """A stand-in for hf_hub_download online: files of the fixture cache's snapshot of main, ``errors`` (file ->
    exception) raised as huggingface_hub raises them; ``asked`` collects the files asked for."""
    def download(repo_id, filename, revision=None, **kwargs):
        if asked is not None:
            asked.append(filename)
        if filename in errors:
            raise errors[filename]
        repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
        commit = revision if revision and (repo / "snapshots" / revision).is_dir() else \
            (repo / "refs" / "main").read_text()
        return str(repo / "snapshots" / commit / filename)
    return download


def _http(cls: type, message: str) -> Exception:
    """huggingface_hub's HTTP error ``cls`` (from 1.0 on it needs the response it came with)."""
    return cls(message, response=SimpleNamespace(headers={}, request=None))


def test_each_hub_failure_is_one_line_naming_it(tmp_path, hub_cache, monkeypatch) -> None:
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    txl_repo(tmp_path, hub_cache)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    cases = [
        (EntryNotFoundError("404"), "and the Hub repository org/tiny has no config.json"),
        (_http(RevisionNotFoundError, "404"), "and the Hub repository org/tiny has no revision None"),
        (_http(RepositoryNotFoundError, "401"), "and the Hugging Face Hub has no model org/tiny (or it is private or "
                                                "gated: log in or set HF_TOKEN)"),
        (_http(HfHubHTTPError, "500 Server Error\nmore"), "and the Hugging Face Hub gave: 500 Server Error"),
        (OSError(""), "and the Hugging Face Hub gave: OSError"),
    ]
    for exc, why in cases:
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", _answers(hub_cache, {"config.json": exc}))
        with pytest.raises(CheckpointError) as err:
            hub.fetch("org/tiny")
        assert str(err.value) == f"org/tiny: no local directory of that name, {why}", type(exc)


def test_optional_files_the_repository_lacks_are_skipped_online(tmp_path, hub_cache, monkeypatch) -> None:
    """Online, a file the repository does not have is EntryNotFoundError: the manifest and vocabulary are optional,
    the weights are not."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import EntryNotFoundError

    _, commit = txl_repo(tmp_path, hub_cache)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    absent = {"MANIFEST.json": EntryNotFoundError("404"), "vocab.json": EntryNotFoundError("404")}
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _answers(hub_cache, absent))
    assert hub.fetch("org/tiny").commit == commit
    absent["model.safetensors"] = EntryNotFoundError("404")
    with pytest.raises(CheckpointError, match=rf"^org/tiny@{commit}: no local directory of that name, and the Hub "
                       r"repository org/tiny@\w+ has no model.safetensors$"):
        hub.fetch("org/tiny")


def test_a_config_that_is_not_json_or_not_transformer_xl_is_one_line(tmp_path, hub_cache) -> None:
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text('{"model_type": "gpt2"}')
    hub_repo(hub_cache, "openai/gpt", tmp_path / "gpt")
    with pytest.raises(CheckpointError, match=r"^the Hub repository openai/gpt is not a Transformer-XL model \(config"
                       r"\.json has model_type 'gpt2', not transfo-xl, and no n_token\)$"):
        hub.fetch("openai/gpt")
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "config.json").write_text('{"n_token": ')
    hub_repo(hub_cache, "org/torn", tmp_path / "torn")
    with pytest.raises(CheckpointError):
        hub.fetch("org/torn")


def test_the_manifest_names_the_files_fetched_and_each_is_required(tmp_path, hub_cache, monkeypatch) -> None:
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import EntryNotFoundError

    txl_repo(tmp_path, hub_cache)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    asked: list[str] = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _answers(hub_cache, {}, asked))
    hub.fetch("org/tiny")
    assert asked == ["config.json", "MANIFEST.json", "config.json", "model.safetensors", "vocab.json"]
    absent = {"vocab.json": EntryNotFoundError("404")}  # listed by the manifest: required
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _answers(hub_cache, absent))
    with pytest.raises(CheckpointError, match=r"has no vocab\.json$"):
        hub.fetch("org/tiny")
    asked.clear()
    absent = {"MANIFEST.json": EntryNotFoundError("404")}  # no manifest: the weights, and a vocabulary if any
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _answers(hub_cache, absent, asked))
    hub.fetch("org/tiny")
    assert asked == ["config.json", "MANIFEST.json", "model.safetensors", "vocab.json"]


@pytest.mark.parametrize(("text", "why"), [('{"files": ', r"MANIFEST\.json is not valid JSON"),
                                           ('{"step": 3}', "no 'files' object")])
def test_a_torn_or_empty_manifest_on_the_hub_is_one_line(tmp_path, hub_cache, text: str, why: str) -> None:
    """A manifest that is not JSON is refused by fetch itself; one naming no files fetches nothing more and the
    load refuses it: both a one-line CheckpointError, never a TypeError from the fetch."""
    txl_repo(tmp_path, hub_cache)
    (tmp_path / "txl-src" / "MANIFEST.json").write_text(text)
    hub_repo(hub_cache, "org/torn", tmp_path / "txl-src")
    with pytest.raises(CheckpointError, match=why) as err:
        TransformerXLLM.from_pretrained("org/torn")
    assert "\n" not in str(err.value)


def test_a_hf_vocabulary_of_another_size_than_the_model_is_refused(tmp_path, hub_cache) -> None:
    _, commit = hf_repo(tmp_path, hub_cache)
    short = hf_tokenizer_dict()
    short["idx2sym"] = HF_SYMS[:-1]
    short["sym2idx"] = {s: i for i, s in enumerate(HF_SYMS[:-1])}
    (hub_cache / "models--transfo-xl--tiny-wt103" / "snapshots" / commit / "vocab.pkl").resolve().write_bytes(
        pickle.dumps(short))
    with pytest.raises(CheckpointError, match=rf"^the vocabulary of transfo-xl/tiny-wt103 \(vocab\.pkl\) has "
                       rf"{len(HF_SYMS) - 1} symbols but its model predicts {len(HF_SYMS)}$"):
        hub.hub_model_dir("transfo-xl/tiny-wt103")
    assert not (tmp_path / "txl-cache" / "hub" / "models--transfo-xl--tiny-wt103" / commit).exists()
