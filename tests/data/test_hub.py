"""WikiText from the Hub dataset's Parquet: a fixture built from the embedded WikiText-2 in huggingface_hub's own cache
layout (``datasets--Salesforce--wikitext/{blobs,refs/main,snapshots/REV/...}``), read offline."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import lzma
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import subprocess_env
from transformer_xl.data import fetch, load_corpus
from transformer_xl.data import registry as corpora
from transformer_xl.data.fetch import SOURCES
from transformer_xl.data.hub import fetch_from_hub, placement_hint
from transformer_xl.data.registry import ASSETS_DIR
from transformer_xl.errors import DataError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
hf_constants = pytest.importorskip("huggingface_hub.constants")

HUB = corpora.DATASETS["wt2"].hub
SPLITS = {"train": "train", "valid": "validation", "test": "test"}


def original(split: str) -> bytes:
    """The embedded ``wiki.SPLIT.tokens`` (the official file's bytes)."""
    return lzma.decompress((ASSETS_DIR / "wikitext-2" / f"wiki.{split}.tokens.xz").read_bytes())


def hub_rows(text: bytes) -> list[str]:
    """The rows the Hub dataset holds for an original file: each line with its line end, read as text, and an empty
    row for a whitespace-only line."""
    return [line if line.strip() else "" for line in io.StringIO(text.decode("utf-8"), newline=None)]


def build_hub_cache(root: Path, edit: dict[str, tuple[int, str]] | None = None) -> Path:
    """A Hugging Face cache holding ``Salesforce/wikitext``'s wikitext-2-v1 Parquet shards at the pinned revision,
    laid out as huggingface_hub lays it out: content in ``blobs/``, ``snapshots/REV/PATH`` links to them,
    ``refs/main`` naming REV. ``edit``: split -> (row, new text) changed before writing."""
    repo = root / f"datasets--{HUB.repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(HUB.revision)
    (repo / "blobs").mkdir()
    for split, hub_split in SPLITS.items():
        rows = hub_rows(original(split))
        if edit and split in edit:
            rows[edit[split][0]] = edit[split][1]
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": rows}), buf, row_group_size=4096)  # several batches per shard
        blob = repo / "blobs" / hashlib.sha256(buf.getvalue()).hexdigest()
        blob.write_bytes(buf.getvalue())
        link = repo / "snapshots" / HUB.revision / HUB.config / f"{hub_split}-00000-of-00001.parquet"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return root


def move_main(cache: Path, edit: dict[str, tuple[int, str]]) -> str:
    """Push a commit to ``main`` in the fixture cache built by :func:`build_hub_cache`: the shards with ``edit``
    applied, as another snapshot, and ``refs/main`` naming it; the pinned revision's snapshot stays. Returns it."""
    other = build_hub_cache(cache.parent / "other", edit=edit)
    src = other / f"datasets--{HUB.repo_id.replace('/', '--')}"
    repo = cache / src.name
    commit = "f" * 40
    for blob in (src / "blobs").iterdir():
        if not (repo / "blobs" / blob.name).exists():
            blob.rename(repo / "blobs" / blob.name)
    (src / "snapshots" / HUB.revision).rename(repo / "snapshots" / commit)
    (repo / "refs" / "main").write_text(commit)
    return commit


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HUB_OFFLINE with HF_HUB_CACHE at a fresh fixture cache (as huggingface_hub reads them at import)."""
    cache = build_hub_cache(tmp_path / "hf")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.parametrize(("env", "expected"), [
    ({"HF_HUB_CACHE": "/c/hub-cache", "HF_HOME": "/h"}, "/c/hub-cache"), ({"HF_HOME": "/h"}, "/h/hub"),
    ({}, "HOME/.cache/huggingface/hub"),
])
def test_without_huggingface_hub_its_cache_and_offline_mode_are_read_as_it_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    """The placement hint names the cache folder even where huggingface_hub is not installed: HF_HUB_CACHE, else
    HF_HOME/hub, else ~/.cache/huggingface/hub; HF_HUB_OFFLINE is true for 1/ON/YES/TRUE in any case."""
    from transformer_xl.data.hub import hub_cache_dir, hub_offline

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `from huggingface_hub import ...` raises ImportError
    for name in ("HF_HUB_CACHE", "HF_HOME", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert hub_cache_dir() == expected.replace("HOME", str(tmp_path))
    assert not hub_offline()
    for value, offline in (("1", True), ("on", True), ("Yes", True), ("TRUE", True), ("0", False), ("no", False)):
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        assert hub_offline() is offline, value


def test_registry_lists_the_wikitext_sources_in_order() -> None:
    for name, archive in (("wt2", "wikitext-2-v1.zip"), ("wt103", "wikitext-103-v1.zip")):
        spec = corpora.get_spec(name)
        res = spec.resources[0]
        assert res.urls == (f"https://s3.amazonaws.com/research.metamind.io/wikitext/{archive}",
                            f"https://wikitext.smerity.com/{archive}")
        assert res.sha256 and spec.hub.repo_id == "Salesforce/wikitext" and len(spec.hub.revision) == 40
        assert [s.dest for s in spec.hub.splits] == [f"wiki.{s}.tokens" for s in SPLITS]
    wt103 = corpora.get_spec("wt103").hub
    assert wt103.splits[0].files == ("wikitext-103-v1/train-00000-of-00002.parquet",
                                     "wikitext-103-v1/train-00001-of-00002.parquet")
    assert all(s.sha1 and s.tokens and s.lines for s in wt103.splits)
    assert [s.sha256 for s in HUB.splits] == [m.sha256 for m in corpora.get_spec("wt2").resources[0].members]


def test_parquet_gives_exactly_the_original_files_and_token_stream(offline_hub: Path, tmp_path: Path) -> None:
    records = fetch_from_hub(HUB, tmp_path / "data" / "wikitext-2")
    for split in SPLITS:
        assert (tmp_path / "data" / "wikitext-2" / f"wiki.{split}.tokens").read_bytes() == original(split)
        assert records[f"wiki.{split}.tokens"]["source"] == HUB.describe()
    assert records["wiki.train.tokens"]["lines"] == 36_718 and records["wiki.train.tokens"]["tokens"] == 2_088_628
    from_hub = load_corpus("wt2", tmp_path / "data", cache_dir=tmp_path / "c1")
    embedded = load_corpus("wt2", tmp_path / "empty", cache_dir=tmp_path / "c2")
    assert from_hub.vocab.idx2sym == embedded.vocab.idx2sym
    for split in SPLITS:
        assert np.array_equal(from_hub.splits[split], embedded.splits[split])


def test_fetch_falls_back_to_the_hub_and_records_it_in_the_cache_manifest(
    offline_hub: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Offline, the network URLs are skipped without a word and the Hub cache serves; the source is recorded."""
    files = fetch("wt2", tmp_path / "data", progress=False)
    assert [f.name for f in files] == ["wiki.test.tokens", "wiki.train.tokens", "wiki.valid.tokens"]
    assert not caplog.records
    record = json.loads((tmp_path / "data" / "wikitext-2" / SOURCES).read_text())
    assert record["wiki.valid.tokens"]["source"] == f"hf://datasets/Salesforce/wikitext@{HUB.revision}/wikitext-2-v1"
    manifest = load_corpus("wt2-char", tmp_path / "data", cache_dir=tmp_path / "c").manifest
    assert manifest["fetched_from"]["wiki.test.tokens"]["sha256"] == HUB.splits[2].sha256


def test_the_pinned_revision_is_read_when_the_branch_has_moved(offline_hub: Path, tmp_path: Path) -> None:
    """``main`` moved on to a commit whose text differs: the dataset is still rebuilt from the pinned revision."""
    move_main(offline_hub, edit={"test": (3, "a line pushed later\n")})
    fetch_from_hub(HUB, tmp_path / "out")
    assert (tmp_path / "out" / "wiki.test.tokens").read_bytes() == original("test")


def test_files_already_there_are_kept_unless_forced(offline_hub: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "wiki.valid.tokens").write_bytes(b"kept\n")
    records = fetch_from_hub(HUB, out)
    assert sorted(records) == ["wiki.test.tokens", "wiki.train.tokens"]  # nothing said of the file kept
    assert (out / "wiki.valid.tokens").read_bytes() == b"kept\n"
    records = fetch_from_hub(HUB, out, force=True)
    assert sorted(records) == ["wiki.test.tokens", "wiki.train.tokens", "wiki.valid.tokens"]
    assert (out / "wiki.valid.tokens").read_bytes() == original("valid")


def test_fetch_with_force_rebuilds_from_the_hub_the_files_already_there(offline_hub: Path, tmp_path: Path) -> None:
    """``txl data fetch wt2 --force`` offline: every file is rebuilt from the Hub cache, an edited one included."""
    folder = tmp_path / "data" / "wikitext-2"
    folder.mkdir(parents=True)
    (folder / "wiki.valid.tokens").write_bytes(b"edited\n")
    fetch("wt2", tmp_path / "data", force=True, progress=False)
    assert (folder / "wiki.valid.tokens").read_bytes() == original("valid")


def test_a_split_in_several_shards_is_rebuilt_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """WikiText-103's training text comes in two shards: the rows of every shard are written, counted and hashed."""
    cache = build_hub_cache(tmp_path / "hf")
    snapshot = cache / f"datasets--{HUB.repo_id.replace('/', '--')}" / "snapshots" / HUB.revision / HUB.config
    rows = hub_rows(original("valid"))
    files = []
    for i, part in enumerate((rows[:1000], rows[1000:])):
        files.append(f"{HUB.config}/validation-0000{i}-of-00002.parquet")
        pq.write_table(pa.table({"text": part}), snapshot / Path(files[-1]).name)
    split = dataclasses.replace(HUB.splits[1], files=tuple(files))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    records = fetch_from_hub(dataclasses.replace(HUB, splits=(split,)), tmp_path / "out")
    assert (tmp_path / "out" / "wiki.valid.tokens").read_bytes() == original("valid")
    assert records["wiki.valid.tokens"]["lines"] == len(rows) and records["wiki.valid.tokens"]["tokens"] == 217_646
    (snapshot / Path(files[1]).name).write_bytes(b"PAR1 not parquet")  # a damaged shard: one line naming the split
    with pytest.raises(DataError, match=rf"^{re.escape(HUB.describe())}: cannot read {files[0]} \("):
        fetch_from_hub(dataclasses.replace(HUB, splits=(split,)), tmp_path / "out2")
    assert not list((tmp_path / "out2").iterdir())


def test_a_wrong_sha1_is_refused(offline_hub: Path, tmp_path: Path) -> None:
    """WikiText-103's originals are published with SHA-1 sums (and no SHA-256): those are checked too."""
    split = dataclasses.replace(HUB.splits[2], sha256=None, sha1="0" * 40)
    with pytest.raises(DataError, match=r"wiki.test.tokens does not match the original \(sha1 [0-9a-f]{40}, "
                       r"expected 0{40}\)$"):
        fetch_from_hub(dataclasses.replace(HUB, splits=(split,)), tmp_path / "out")
    right = dataclasses.replace(split, sha1=hashlib.sha1(original("test")).hexdigest())
    assert fetch_from_hub(dataclasses.replace(HUB, splits=(right,)), tmp_path / "out")["wiki.test.tokens"]["lines"]


def test_a_rebuilt_text_unlike_the_original_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = build_hub_cache(tmp_path / "hf", edit={"valid": (5, "an edited line\n")})
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    with pytest.raises(DataError, match=r"wiki.valid.tokens does not match the original \(tokens 217\d+, expected "
                       r"217646, sha256 [0-9a-f]{64}, expected f0737ed"):
        fetch_from_hub(HUB, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["wiki.train.tokens"]  # neither valid nor .part
    counts = dataclasses.replace(HUB.splits[0], sha256=None, tokens=1)  # counts are checked with no checksum too
    with pytest.raises(DataError, match="tokens 2088628, expected 1"):
        fetch_from_hub(dataclasses.replace(HUB, splits=(counts,)), tmp_path / "out2")


def test_offline_with_nothing_cached_names_the_files_and_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "empty-hf"))
    with pytest.raises(DataError) as err:
        fetch("wt103", tmp_path / "data", progress=False)
    message = str(err.value)
    assert "\n" not in message and message.startswith("wt103: hf://datasets/Salesforce/wikitext@")
    snapshot = f"{tmp_path}/empty-hf/datasets--Salesforce--wikitext/snapshots/{HUB.revision}/"
    assert f"offline (HF_HUB_OFFLINE) and Salesforce/wikitext@{HUB.revision[:7]} is not in the Hugging Face cache; " \
           f"place wikitext-103-v1/train-00000-of-00002.parquet, wikitext-103-v1/train-00001-of-00002.parquet, " \
           f"wikitext-103-v1/validation-00000-of-00001.parquet, wikitext-103-v1/test-00000-of-00001.parquet under " \
           f"{snapshot}, or wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens in {tmp_path}/data/wikitext-103/" \
           in message
    assert message.endswith(placement_hint(corpora.get_spec("wt103").hub, tmp_path / "data" / "wikitext-103"))


def test_without_pyarrow_one_line_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"needs huggingface_hub and pyarrow \(pyarrow.parquet is missing\): "
                       r"pip install -e '\.\[hub\]' in the txl checkout"):
        fetch_from_hub(HUB, tmp_path)


@pytest.mark.integration
def test_txl_data_fetch_offline_from_the_hub_cache(tmp_path: Path) -> None:
    """The real environment route: ``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` read by huggingface_hub at import."""
    cache = build_hub_cache(tmp_path / "hf")
    env = subprocess_env(tmp_path, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    cmd = [sys.executable, "-m", "transformer_xl", "data", "fetch", "wt2", "--data-dir", str(tmp_path / "data")]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert run.stdout.split() == [str(tmp_path / "data" / "wikitext-2" / f"wiki.{s}.tokens") for s in
                                  ("test", "train", "valid")]
    assert (tmp_path / "data" / "wikitext-2" / "wiki.train.tokens").read_bytes() == original("train")
    cmd[5] = "wt103"
    env["HF_HUB_CACHE"] = str(tmp_path / "nothing")
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode != 0 and run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1 and "is not in the Hugging Face cache; place " in run.stderr


def test_an_unreachable_hub_is_one_line_without_its_retry_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stubbed hf_hub_download that retries (logging as huggingface_hub does) and gives up, as with no network."""
    import logging

    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(*args: object, **kwargs: object) -> str:
        logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
        raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(DataError, match=r"^the Hub cannot be reached and Salesforce/wikitext@b08601e is not in the "
                       r"Hugging Face cache; place wikitext-2-v1/train-00000-of-00001.parquet, "):
        fetch_from_hub(HUB, tmp_path)
    assert not [r for r in caplog.records if r.name.startswith("huggingface_hub")]


def test_the_first_download_of_a_process_keeps_its_retry_warnings_quiet(tmp_path: Path) -> None:
    """huggingface_hub sets its logger's level when its logging module is first imported, lazily, inside the first
    download: quieting must survive that import (in a fresh process, where it has not happened yet)."""
    code = ("import logging\n"
            "from transformer_xl.data.hub import quiet_hub_logs\n"
            "with quiet_hub_logs():\n"
            "    import huggingface_hub.file_download\n"
            "    print(logging.getLogger('huggingface_hub.utils._http').getEffectiveLevel(),\n"
            "          logging.getLogger('urllib3.connectionpool').getEffectiveLevel())\n"
            "print(logging.getLogger('huggingface_hub').getEffectiveLevel())\n")
    import transformer_xl

    src = str(Path(transformer_xl.__file__).parents[1])  # the sources this test imports
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=subprocess_env(tmp_path, PYTHONPATH=src), timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["40", "40", "30"]  # ERROR inside, huggingface_hub's own WARNING after


def test_a_missing_shard_or_a_failed_download_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stubbed hf_hub_download failures as huggingface_hub raises them: the file is not in the repository; an HTTP
    error with a several-line message (its first line is kept)."""
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    def missing(*args: object, **kwargs: object) -> str:
        raise EntryNotFoundError("404 Client Error: Entry Not Found for url")

    def failing(*args: object, **kwargs: object) -> str:
        raise OSError("500 Server Error\nmore detail")

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", missing)
    shard = HUB.splits[0].files[0]
    where = re.escape(HUB.describe())
    with pytest.raises(DataError, match=rf"^{where}: {shard} not found \(EntryNotFoundError\)$"):
        fetch_from_hub(HUB, tmp_path)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", failing)
    with pytest.raises(DataError, match=rf"^{where}: cannot download {shard} \(500 Server Error\)$"):
        fetch_from_hub(HUB, tmp_path)
