"""The prepared-data cache: reused while valid, rebuilt (or refused) when stale; no pickle."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from tests.helpers import SHARED_DATA as SHARED
from tests.helpers import needs_shared_data as needs_shared
from transformer_xl.data import load_corpus
from transformer_xl.errors import DataError


@needs_shared
def test_cache_reused_then_stale_detected(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "ptb").mkdir(parents=True)
    for s in ("train", "valid", "test"):
        (data / "ptb" / f"ptb.{s}.txt.gz").write_bytes((SHARED / "ptb" / f"ptb.{s}.txt.gz").read_bytes())
    first = load_corpus("ptb", data, cache_dir=tmp_path / "c")
    created = first.manifest["created"]
    manifest = json.loads((first.cache_dir / "manifest.json").read_text())
    assert manifest["vocab"]["size"] == 10_000 and manifest["splits"]["train"]["dtype"] == "uint16"
    assert len(manifest["sources"]) == 3 and all(len(s["sha256"]) == 64 for s in manifest["sources"])
    again = load_corpus("ptb", data, cache_dir=tmp_path / "c")
    assert again.manifest["created"] == created and again.cache_dir == first.cache_dir
    # another txl version wrote it: refused with a clear message, or rebuilt
    manifest["txl_version"] = "0.0.0-other"
    (first.cache_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"stale .*txl 0\.0\.0-other"):
        load_corpus("ptb", data, cache_dir=tmp_path / "c", on_stale="error")
    rebuilt = load_corpus("ptb", data, cache_dir=tmp_path / "c")
    assert rebuilt.manifest["txl_version"] != "0.0.0-other"
    # a different vocabulary file in the cache is detected
    vocab = json.loads((rebuilt.cache_dir / "vocab.json").read_text())
    vocab["symbols"][1], vocab["symbols"][2] = vocab["symbols"][2], vocab["symbols"][1]
    (rebuilt.cache_dir / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(DataError, match="another vocabulary"):
        load_corpus("ptb", data, cache_dir=tmp_path / "c", on_stale="error")
    # changed source content is detected
    os.utime(data / "ptb" / "ptb.test.txt.gz", ns=(1, 1))
    with gzip.open(data / "ptb" / "ptb.test.txt.gz", "wb") as f:
        f.write(b"a b c\n")
    with pytest.raises(DataError, match="changed"):
        load_corpus("ptb", data, cache_dir=tmp_path / "c", on_stale="error")


def _user_cache(tmp_path: Path):
    from tests.helpers import corpus_dir

    corpus = corpus_dir(tmp_path)
    return corpus, load_corpus(str(corpus), cache_dir=tmp_path / "c")


def test_a_user_corpus_edited_in_place_is_rebuilt_by_content(tmp_path: Path) -> None:
    corpus, first = _user_cache(tmp_path)
    path = corpus / "train.txt"
    st = path.stat()
    text = path.read_text()
    path.write_text(text.replace("the", "eht", 1))  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(DataError, match=r"train.txt changed content \(sha256\)"):
        load_corpus(str(corpus), cache_dir=tmp_path / "c", on_stale="error")
    rebuilt = load_corpus(str(corpus), cache_dir=tmp_path / "c")
    assert "eht" in rebuilt.vocab and "eht" not in first.vocab


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["splits"]["train"].update(file="../x"), r"names '\.\./x', not a plain file name"),
    (lambda m: m["splits"]["train"].update(file="/abs/train.npy"), "not a plain file name"),
    (lambda m: m["splits"]["train"].update(file=""), "not a plain file name"),
    (lambda m: m["extras"].update(x={"file": "a/b.npy", "length": 1, "dtype": "uint8"}), "not a plain file name"),
    (lambda m: m.update(splits="train.npy"), "has the wrong structure"),
    (lambda m: m.update(sources="a.txt"), "has the wrong structure"),
    (lambda m: m["splits"].update(train=["train.npy"]), "entry 'train' has the wrong structure"),
])
def test_a_manifest_of_the_wrong_shape_is_refused_before_opening_anything(tmp_path: Path, edit, message) -> None:
    """A damaged manifest is refused; ``--rebuild`` replaces the folder, whose files a cache's names still vouch for
    (``*.npy``, the vocabulary, the manifest)."""
    corpus, first = _user_cache(tmp_path)
    path = first.cache_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=message):
        load_corpus(str(corpus), cache_dir=tmp_path / "c")
    assert load_corpus(str(corpus), cache_dir=tmp_path / "c", rebuild=True).splits["train"].size > 0


@pytest.mark.parametrize("content, message", [(b"\xff\xfe{}", "unreadable .*utf-8"), (b"[1, 2]", "not a JSON object")])
def test_an_unreadable_manifest_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    corpus, first = _user_cache(tmp_path)
    (first.cache_dir / "manifest.json").write_bytes(content)
    with pytest.raises(DataError, match=message):
        load_corpus(str(corpus), cache_dir=tmp_path / "c")


def test_corrupt_arrays_are_refused(tmp_path: Path) -> None:
    import numpy as np

    corpus, first = _user_cache(tmp_path)
    npy = first.cache_dir / "train.npy"
    good = npy.read_bytes()
    npy.write_bytes(good[:10] + b"{'descr': '<u1', 'fortran_order': False, 'shape': (" + good[60:])
    with pytest.raises(DataError, match=r"train\.npy: unreadable cache array"):
        load_corpus(str(corpus), cache_dir=tmp_path / "c")
    npy.write_bytes(good)
    arr = np.load(npy)
    arr[3] = len(first.vocab)
    np.save(npy, arr)
    with pytest.raises(DataError, match=f"holds token id {len(first.vocab)}, but the vocabulary has"):
        load_corpus(str(corpus), cache_dir=tmp_path / "c")


@pytest.mark.parametrize("head", [b"PK\x03\x04", b"PK\x05\x06" + bytes(18), b"\x93NUMPY\x09\x09"],
                         ids=["zip-magic", "empty-zip", "unknown-version"])
def test_an_array_that_starts_like_another_format_is_one_line(tmp_path: Path, head: bytes) -> None:
    """np.load picks .npz by the zip magic: a damaged array beginning with it raised zipfile.BadZipFile (the fuzz
    campaign's seed 24). The cache reads the .npy format only, so it is a bad array like any other."""
    from transformer_xl.data.cache import read_npy

    corpus, first = _user_cache(tmp_path)
    npy = first.cache_dir / "train.npy"
    good = npy.read_bytes()
    npy.write_bytes(head + good[len(head):])
    with pytest.raises(DataError, match=r"train\.npy: unreadable cache array \(.+\); rebuild with --rebuild$"):
        load_corpus(str(corpus), cache_dir=tmp_path / "c")
    for mmap in (False, True):
        with pytest.raises(ValueError):
            read_npy(npy, mmap=mmap)


def test_list_caches_reads_manifests_only(tmp_path: Path) -> None:
    from transformer_xl.data.cache import list_caches

    assert list_caches(tmp_path / "none", "text-x") == []
    (tmp_path / "text-x-123").mkdir()
    (tmp_path / "text-x-123" / "manifest.json").write_text(
        '{"dataset": "text-x", "config": {"options": {"tokenizer": "/t.json"}}, "sources": [{"path": "/d/a.txt"}], '
        '"vocab": {"size": 7}, "splits": {"train": {"file": "train.npy", "length": 5, "dtype": "uint8"}}, '
        '"created": "2026-01-01"}')
    (tmp_path / "text-x-456").mkdir()  # no manifest: not a cache
    listed = list_caches(tmp_path, "text-x")
    assert [(c["level"], c["tokenizer"], c["vocab_size"], c["tokens"]) for c in listed] == [
        ("tokenizer", "/t.json", 7, {"train": 5})]
    assert list_caches(tmp_path, "text-x", Path("/d")) == listed and list_caches(tmp_path, "text-x", Path("/e")) == []


def test_a_cache_published_first_by_another_process_is_used(tmp_path: Path, monkeypatch) -> None:
    """Two processes (e.g. the ranks of one torchrun) build the same cache at once: the later rename finds the
    folder taken (a real ENOTEMPTY from the filesystem), leaves the published one in place (same inode: a reader of
    it never sees it vanish) and loads it instead of failing."""
    import os
    import shutil

    import transformer_xl.store.files as files
    from tests.helpers import corpus_dir

    real_rename = os.rename
    published: list[int] = []

    def the_other_process_was_first(src, dst, *args, **kwargs):
        if Path(dst).parent == tmp_path / "c" and not Path(dst).exists():
            shutil.copytree(src, dst)  # the other process's identical cache lands just before our rename
            published.append(Path(dst).stat().st_ino)
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(files.os, "rename", the_other_process_was_first)
    corpus = load_corpus(str(corpus_dir(tmp_path)), cache_dir=tmp_path / "c")
    monkeypatch.setattr(files.os, "rename", real_rename)
    assert published and corpus.cache_dir.stat().st_ino == published[0]  # theirs kept, not moved aside
    again = load_corpus(str(corpus_dir(tmp_path)), cache_dir=tmp_path / "c", on_stale="error")  # theirs is valid
    assert again.vocab.sha256() == corpus.vocab.sha256() and len(corpus.splits["train"]) > 0
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".")]  # our temporary is gone


def test_a_cache_folder_holding_other_files_is_never_replaced(tmp_path: Path) -> None:
    """A cache is rebuilt by replacing its folder whole: when that folder holds a file the cache does not (put
    there by hand), the rebuild is refused in one line and the file kept; a folder of the cache's own files is
    rebuilt as ever."""
    corpus, first = _user_cache(tmp_path)
    (first.cache_dir / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=rf"^{first.cache_dir} holds what txl data prepare did not write "
                                        r"\(notes\.txt\): refusing to replace it; move them out, or delete the "
                                        r"folder to rebuild the cache$"):
        load_corpus(str(corpus), cache_dir=tmp_path / "c", rebuild=True)
    assert (first.cache_dir / "notes.txt").read_text() == "mine"
    (first.cache_dir / "notes.txt").unlink()
    rebuilt = load_corpus(str(corpus), cache_dir=tmp_path / "c", rebuild=True)
    assert rebuilt.cache_dir == first.cache_dir and rebuilt.manifest["created"] >= first.manifest["created"]


def test_a_users_own_arrays_in_a_cache_folder_are_never_deleted(tmp_path: Path) -> None:
    """Only what the cache's own manifest lists is the cache's: a ``.npy`` of the user's beside it, or a folder of
    arrays with no manifest at all, makes a rebuild refuse in one line naming the folder and its files; nothing is
    deleted (a ``*.npy`` or ``vocab.json`` used to be taken for the cache's and replaced with it)."""
    import numpy as np

    corpus, first = _user_cache(tmp_path)
    mine = first.cache_dir / "mine.npy"
    np.save(mine, np.arange(5))
    with pytest.raises(DataError, match=rf"^{first.cache_dir} holds what txl data prepare did not write "
                                        r"\(mine\.npy\): refusing to replace it"):
        load_corpus(str(corpus), cache_dir=tmp_path / "c", rebuild=True)
    assert np.load(mine).tolist() == [0, 1, 2, 3, 4]
    (first.cache_dir / "manifest.json").unlink()  # no manifest: none of these files is proven the cache's
    held = sorted(p.name for p in first.cache_dir.iterdir())
    assert held == ["mine.npy", "test.npy", "train.npy", "valid.npy", "vocab.json"]
    with pytest.raises(DataError, match=rf"^{first.cache_dir} holds what txl data prepare did not write "
                                        r"\(mine\.npy, test\.npy, train\.npy and 2 more\)"):
        load_corpus(str(corpus), cache_dir=tmp_path / "c")
    assert sorted(p.name for p in first.cache_dir.iterdir()) == held and np.load(mine).size == 5
