"""Downloads from file:// and a 127.0.0.1 HTTP server: resume (Range), checksums, extraction, CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import json
import re
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from transformer_xl.data import download, fetch, load_corpus
from transformer_xl.data import registry as corpora
from transformer_xl.errors import DataError

PAYLOAD = bytes(range(256)) * 4000  # 1,024,000 bytes
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with single-range support; ``truncate`` cuts every body short once."""

    truncate_once: ClassVar[list[bool]] = []
    ranges_seen: ClassVar[list[str]] = []
    agents_seen: ClassVar[list[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        body = path.read_bytes()
        self.agents_seen.append(self.headers.get("User-Agent"))
        rng = self.headers.get("Range")
        start = 0
        if rng:
            self.ranges_seen.append(rng)
            start = int(rng.split("=")[1].split("-")[0])
            if start >= len(body):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        chunk = body[start:]
        if self.truncate_once:
            self.truncate_once.pop()
            chunk = chunk[: len(chunk) // 3]
        self.wfile.write(chunk)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "www"
    root.mkdir()
    handler = lambda *a, **k: RangeHandler(*a, directory=str(root), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    RangeHandler.truncate_once.clear()
    RangeHandler.ranges_seen.clear()
    RangeHandler.agents_seen.clear()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()
    httpd.server_close()


def test_file_url_download_and_checksum(tmp_path: Path) -> None:
    src = tmp_path / "blob.bin"
    src.write_bytes(PAYLOAD)
    dest = download(src.as_uri(), tmp_path / "out" / "new" / "blob.bin", sha256=SHA, progress=False)  # folders made
    assert dest.read_bytes() == PAYLOAD
    with pytest.raises(DataError, match=r"sha256 .* does not match"):
        download(src.as_uri(), tmp_path / "out" / "bad.bin", sha256="0" * 64, progress=False)
    assert not (tmp_path / "out" / "bad.bin").exists() and not (tmp_path / "out" / "bad.bin.part").exists()
    with pytest.raises(DataError, match=r"cannot download .*place it at"):
        download((tmp_path / "absent").as_uri(), tmp_path / "out" / "x", progress=False)


def test_http_truncated_download_resumes_with_range(server: tuple[str, Path], tmp_path: Path) -> None:
    url, root = server
    (root / "blob.bin").write_bytes(PAYLOAD)
    dest = tmp_path / "blob.bin"
    RangeHandler.truncate_once.append(True)
    with pytest.raises(DataError, match="truncated at 341333 of 1024000 bytes"):
        download(f"{url}/blob.bin", dest, sha256=SHA, progress=False)
    assert not dest.exists() and dest.with_name("blob.bin.part").stat().st_size == 341_333
    download(f"{url}/blob.bin", dest, sha256=SHA, progress=False)
    assert RangeHandler.ranges_seen == ["bytes=341333-"]
    assert RangeHandler.agents_seen == ["txl-data", "txl-data"]  # not urllib's, which some servers refuse
    assert dest.read_bytes() == PAYLOAD and not dest.with_name("blob.bin.part").exists()


def test_the_progress_bar_counts_from_the_resumed_part_in_binary_units_and_is_cleared(
    server: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bar names the file, starts at the bytes already there (a resumed download), counts in KiB/MiB (B/s) and
    is erased when done: the terminal is left to the command's own output."""
    url, root = server
    (root / "blob.bin").write_bytes(PAYLOAD)
    (tmp_path / "blob.bin.part").write_bytes(PAYLOAD[:262_144])  # 256 KiB of 1000 KiB already fetched
    capsys.readouterr()
    download(f"{url}/blob.bin", tmp_path / "blob.bin", sha256=SHA)
    err = capsys.readouterr().err
    assert err.startswith("\rblob.bin:  26%|") and "| 256k/0.98M [" in err and "B/s]" in err
    assert err.endswith("\r") and not err.rsplit("\r", 2)[1].strip()  # its last line blanked, no newline left
    download(f"{url}/blob.bin", tmp_path / "quiet.bin", sha256=SHA, progress=False)
    assert capsys.readouterr().err == ""


def test_a_source_that_never_answers_is_given_up_after_the_timeout(tmp_path: Path) -> None:
    """A server that accepts the connection and sends nothing: the download stops after ``timeout`` seconds, in
    one line, instead of waiting for the server to hang up."""
    import socket

    release = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as srv:

        def hold() -> None:
            conn, _ = srv.accept()
            with conn:
                release.wait(10)  # then hang up: a download without a timeout sees a closed connection

        thread = threading.Thread(target=hold, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{srv.getsockname()[1]}/blob.bin"
        try:
            with pytest.raises(DataError, match=rf"^cannot download {url} \(timed out\); download {url} by hand"):
                download(url, tmp_path / "blob.bin", progress=False, timeout=0.5)
        finally:
            release.set()
            thread.join()
    assert not (tmp_path / "blob.bin").exists()


def test_http_checksum_mismatch_removes_partial(server: tuple[str, Path], tmp_path: Path) -> None:
    url, root = server
    (root / "blob.bin").write_bytes(PAYLOAD[:-1] + b"X")
    dest = tmp_path / "blob.bin"
    with pytest.raises(DataError, match="partial download was removed"):
        download(f"{url}/blob.bin", dest, sha256=SHA, progress=False)
    assert not dest.exists() and not dest.with_name("blob.bin.part").exists()


def _ptb_tgz(lines: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for split, body in lines.items():
            info = tarfile.TarInfo(f"./simple-examples/data/ptb.{split}.txt")
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def test_fetch_dataset_from_mirror_verifies_members(
    server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, root = server
    bodies = {"train": b"a b c\nb c\n", "valid": b"a b\n", "test": b"c a\n"}
    (root / "simple-examples.tgz").write_bytes(_ptb_tgz(bodies))
    spec = corpora.DATASETS["ptb"]
    res = spec.resources[0]
    members = tuple(
        dataclasses.replace(m, sha256=hashlib.sha256(bodies[m.dest.split(".")[1]]).hexdigest()) for m in res.members
    )
    patched = dataclasses.replace(spec, resources=(dataclasses.replace(res, members=members),))
    monkeypatch.setitem(corpora.DATASETS, "ptb", patched)
    files = fetch("ptb", tmp_path / "data", mirror=url, progress=False)
    assert [f.name for f in files] == ["ptb.test.txt", "ptb.train.txt", "ptb.valid.txt"]
    assert not (tmp_path / "data" / "ptb" / "simple-examples.tgz").exists()
    c = load_corpus("ptb", tmp_path / "data", cache_dir=tmp_path / "c")
    assert c.splits["train"].shape[0] == 7
    # with the real published checksums the fake archive is refused and nothing is promoted
    monkeypatch.setitem(corpora.DATASETS, "ptb", spec)
    with pytest.raises(DataError, match="does not match its published size/sha256"):
        fetch("ptb", tmp_path / "data2", mirror=url, progress=False)
    assert not list((tmp_path / "data2" / "ptb").iterdir())  # neither members nor the bad archive



def _ptb_without_member_checksums(monkeypatch: pytest.MonkeyPatch, archive: bytes) -> None:
    """PTB whose archive has a published SHA-256 (``archive``'s) and whose members have none, as WikiText-103."""
    spec = corpora.DATASETS["ptb"]
    res = spec.resources[0]
    members = tuple(dataclasses.replace(m, sha256=None, size=None) for m in res.members)
    res = dataclasses.replace(res, members=members, sha256=hashlib.sha256(archive).hexdigest(), size=None)
    monkeypatch.setitem(corpora.DATASETS, "ptb", dataclasses.replace(spec, resources=(res,)))


def test_a_wrong_archive_already_there_is_refused_removed_and_fetched_again(
    server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An archive placed by hand is checked against the published SHA-256 like a download: with members that have
    no checksums of their own, nothing else would notice the wrong text."""
    url, root = server
    good = {"train": b"a b\n", "valid": b"b\n", "test": b"a\n"}
    wrong = {"train": b"x\n", "valid": b"y\n", "test": b"z\n"}
    (root / "simple-examples.tgz").write_bytes(_ptb_tgz(good))
    _ptb_without_member_checksums(monkeypatch, (root / "simple-examples.tgz").read_bytes())
    folder = tmp_path / "data" / "ptb"
    folder.mkdir(parents=True)
    (folder / "simple-examples.tgz").write_bytes(_ptb_tgz(wrong))  # a corrupt or other archive, placed by hand
    fetch("ptb", tmp_path / "data", mirror=url, progress=False)
    assert {p.name: p.read_bytes() for p in folder.glob("ptb.*.txt")} == {f"ptb.{k}.txt": v for k, v in good.items()}
    [line] = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(rf"txl data: {re.escape((folder / 'simple-examples.tgz').as_uri())} failed \(.*sha256 "
                        rf"[0-9a-f]+ does not match the expected [0-9a-f]+; the archive already there was removed\); "
                        rf"trying {re.escape(url)}/simple-examples.tgz", line)


def test_an_archive_placed_by_hand_is_used_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the offline error advises (download the archive by hand and place it in the folder) works offline."""
    hf_constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)  # the network URLs are skipped
    bodies = {"train": b"a b c\n", "valid": b"a b\n", "test": b"c a\n"}
    archive = _ptb_tgz(bodies)
    _ptb_without_member_checksums(monkeypatch, archive)
    folder = tmp_path / "data" / "ptb"
    folder.mkdir(parents=True)
    (folder / "simple-examples.tgz").write_bytes(archive)
    files = fetch("ptb", tmp_path / "data", progress=False)
    assert [f.name for f in files] == ["ptb.test.txt", "ptb.train.txt", "ptb.valid.txt"]
    assert (folder / "ptb.valid.txt").read_bytes() == bodies["valid"] and not (folder / "simple-examples.tgz").exists()
    (folder / "ptb.train.txt").unlink()
    (folder / "simple-examples.tgz").write_bytes(archive[:-1] + bytes([archive[-1] ^ 1]))  # one wrong bit: removed
    with pytest.raises(DataError, match=r"sha256 \w+ does not match .*; the archive already there was removed"):
        fetch("ptb", tmp_path / "data", progress=False)
    assert not (folder / "simple-examples.tgz").exists() and not (folder / "ptb.train.txt").exists()


def _ptb_served(server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                bodies: dict[str, bytes]) -> tuple[str, Path, Path]:
    """PTB's archive of ``bodies`` on the test server (members without checksums); its dataset folder made."""
    url, root = server
    (root / "simple-examples.tgz").write_bytes(_ptb_tgz(bodies))
    _ptb_without_member_checksums(monkeypatch, (root / "simple-examples.tgz").read_bytes())
    folder = tmp_path / "data" / "ptb"
    folder.mkdir(parents=True)
    return url, root, folder


def test_a_partly_fetched_folder_is_completed(server: tuple[str, Path], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """One member extracted and the others missing (a fetch stopped half way, a file deleted) is not done."""
    bodies = {"train": b"a b\n", "valid": b"b\n", "test": b"a\n"}
    url, root, folder = _ptb_served(server, monkeypatch, tmp_path, bodies)
    (folder / "ptb.train.txt").write_bytes(bodies["train"])
    files = fetch("ptb", tmp_path / "data", mirror=url, progress=False)
    assert [f.name for f in files] == ["ptb.test.txt", "ptb.train.txt", "ptb.valid.txt"]
    assert (folder / "ptb.test.txt").read_bytes() == bodies["test"]
    (root / "simple-examples.tgz").unlink()  # every member there: nothing is fetched (the mirror has nothing now)
    assert fetch("ptb", tmp_path / "data", mirror=url, progress=False) == files


def _wt2_zip(path: Path) -> Path:
    """A ``wikitext-2-v1.zip`` laid out as the official one, from the embedded WikiText-2 (real member checksums)."""
    import lzma
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        for split in ("train", "valid", "test"):
            body = lzma.decompress((corpora.ASSETS_DIR / "wikitext-2" / f"wiki.{split}.tokens.xz").read_bytes())
            zf.writestr(f"wikitext-2/wiki.{split}.tokens", body)
    return path


def _with_urls(monkeypatch: pytest.MonkeyPatch, name: str, urls: list[str], sha256: str | None) -> None:
    spec = corpora.DATASETS[name]
    res = dataclasses.replace(spec.resources[0], url=urls[0], mirrors=tuple(urls[1:]), sha256=sha256)
    monkeypatch.setitem(corpora.DATASETS, name, dataclasses.replace(spec, resources=(res,)))


def test_dead_and_wrong_sources_are_passed_in_order_one_line_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "www").mkdir()
    good = _wt2_zip(tmp_path / "www" / "wikitext-2-v1.zip")
    wrong = tmp_path / "www" / "other.zip"
    wrong.write_bytes(good.read_bytes()[:-10] + b"0123456789")
    dead, wrong_url, good_url = (tmp_path / "gone.zip").as_uri(), wrong.as_uri(), good.as_uri()
    _with_urls(monkeypatch, "wt2", [dead, wrong_url, good_url], hashlib.sha256(good.read_bytes()).hexdigest())
    files = fetch("wt2", tmp_path / "data", progress=False)
    assert [f.name for f in files] == ["wiki.test.tokens", "wiki.train.tokens", "wiki.valid.tokens"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0] == (f"txl data: {dead} failed ([Errno 2] No such file or directory: '{tmp_path / 'gone.zip'}'); "
                        f"trying {wrong_url}")
    assert re.fullmatch(rf"txl data: {re.escape(wrong_url)} failed \(.*sha256 [0-9a-f]+ does not match the expected "
                        rf"[0-9a-f]+\); trying {re.escape(good_url)}", lines[1])
    sources = json.loads((tmp_path / "data" / "wikitext-2" / "sources.json").read_text())
    assert {v["source"] for v in sources.values()} == {good_url}
    assert {v["archive"] for v in sources.values()} == {"wikitext-2-v1.zip"}
    c = load_corpus("wt2", tmp_path / "data", cache_dir=tmp_path / "c")
    assert c.manifest["fetched_from"]["wiki.train.tokens"]["source"] == good_url
    assert c.manifest["fetched_from"]["wiki.train.tokens"]["sha256"] == corpora._WT2_SHA["train"]
    assert c.info()["tokens"] == {"train": 2_088_628, "valid": 217_646, "test": 245_569}


def test_every_source_dead_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    hf_constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)  # no network: the Hub source reads the cache only
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    urls = [(tmp_path / "a.zip").as_uri(), (tmp_path / "b.zip").as_uri()]
    _with_urls(monkeypatch, "wt2", urls, None)
    with pytest.raises(DataError) as err:
        fetch("wt2", tmp_path / "data", progress=False)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"wt2: every source failed ({urls[0]}: [Errno 2] No such file or directory: ")
    assert f"; {urls[1]}: [Errno 2] No such file" in message and "; hf://datasets/Salesforce/wikitext@" in message
    assert message.endswith(f"in {tmp_path / 'data' / 'wikitext-2'}/)") and message.count("; place ") == 1
    assert [r.getMessage().split(" failed")[0] for r in caplog.records] == [f"txl data: {u}" for u in urls]
    # a dataset without a Hub source: its one URL dead is one line too
    _with_urls(monkeypatch, "ptb", [(tmp_path / "p.tgz").as_uri()], None)
    with pytest.raises(DataError, match=r"^ptb: file://\S+/p.tgz: \[Errno 2\] .*; download file://\S+ by hand "
                       r"and place it in \S+/ptb/$"):
        fetch("ptb", tmp_path / "data", progress=False)


def test_verify_file_checks_the_size_and_a_checksum_in_any_case(tmp_path: Path) -> None:
    from transformer_xl.data.fetch import verify_file

    path = tmp_path / "blob.bin"
    path.write_bytes(PAYLOAD)
    verify_file(path, sha256=SHA.upper(), size=len(PAYLOAD))  # published sums come in either case
    with pytest.raises(DataError, match=rf"^{path}: 1024000 bytes, expected 1024001 \(truncated or wrong file\)$"):
        verify_file(path, size=len(PAYLOAD) + 1)


def test_a_part_already_complete_or_too_long_or_ignored_by_the_server(tmp_path: Path) -> None:
    """A complete ``.part`` is verified and renamed without a request; one longer than the file is started over;
    a source that ignores the ``Range`` request (file://) sends everything again, written from the start."""
    src = tmp_path / "blob.bin"
    src.write_bytes(PAYLOAD)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.bin.part").write_bytes(PAYLOAD)
    gone = (tmp_path / "gone.bin").as_uri()  # never opened: nothing is left to download
    assert download(gone, out / "a.bin", sha256=SHA, size=len(PAYLOAD), progress=False).read_bytes() == PAYLOAD
    (out / "b.bin.part").write_bytes(PAYLOAD + b"extra")
    assert download(src.as_uri(), out / "b.bin", sha256=SHA, size=len(PAYLOAD), progress=False).read_bytes() == \
        PAYLOAD
    (out / "c.bin.part").write_bytes(b"garbage from an older try")
    assert download(src.as_uri(), out / "c.bin", sha256=SHA, progress=False).read_bytes() == PAYLOAD
    assert sorted(p.name for p in out.iterdir()) == ["a.bin", "b.bin", "c.bin"]


@pytest.mark.parametrize("kind", ["tgz", "zip"])
def test_an_archive_without_a_member_or_unreadable_is_one_line_and_removed(
    server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    import zipfile

    url, root = server
    if kind == "tgz":
        (root / "simple-examples.tgz").write_bytes(_ptb_tgz({"train": b"a\n", "valid": b"b\n"}))  # no test split
    else:  # a zip under the name, with the first two members only
        with zipfile.ZipFile(root / "simple-examples.tgz", "w") as zf:
            for split in ("train", "valid"):
                zf.writestr(f"simple-examples/data/ptb.{split}.txt", b"a\n")
    _ptb_without_member_checksums(monkeypatch, (root / "simple-examples.tgz").read_bytes())
    folder = tmp_path / "data" / "ptb"
    with pytest.raises(DataError, match=rf"^ptb: {url}/simple-examples.tgz: {folder}/simple-examples.tgz: archive has "
                       r"no member simple-examples/data/ptb.test.txt; download "):
        fetch("ptb", tmp_path / "data", mirror=url, progress=False)
    assert not (folder / "simple-examples.tgz").exists() and not (folder / "ptb.test.txt").exists()
    (root / "simple-examples.tgz").write_bytes(b"not an archive at all")
    _ptb_without_member_checksums(monkeypatch, (root / "simple-examples.tgz").read_bytes())
    with pytest.raises(DataError, match=rf"^ptb: {url}/simple-examples.tgz: {folder}/simple-examples.tgz: cannot read "
                       r"archive \(file could not be opened successfully:?\); delete it and fetch again; download "
                       ) as err:
        fetch("ptb", tmp_path / "data", mirror=url, progress=False)
    assert "\n" not in str(err.value)  # tarfile's reason spans several lines: its first is kept
    assert not (folder / "simple-examples.tgz").exists()


def test_the_sources_record_is_merged_and_an_unreadable_one_is_no_record(tmp_path: Path) -> None:
    from transformer_xl.data.fetch import read_sources, record_sources

    assert read_sources(tmp_path) == {}
    record_sources(tmp_path, {"a.txt": {"source": "u1"}})
    record_sources(tmp_path, {"b.txt": {"source": "u2"}})
    record_sources(tmp_path, {})
    got = read_sources(tmp_path)
    assert {k: v["source"] for k, v in got.items()} == {"a.txt": "u1", "b.txt": "u2"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", got["a.txt"]["fetched"])
    for text, expected in (("{torn", {}), ("[1, 2]", {}), ('{"a.txt": "no dict", "b.txt": {"source": "u"}}',
                                                           {"b.txt": {"source": "u"}})):
        (tmp_path / "sources.json").write_text(text)
        assert read_sources(tmp_path) == expected


def test_a_part_already_whole_is_kept_on_http_416_and_a_file_gone_from_the_server_is_one_line(
    server: tuple[str, Path], tmp_path: Path
) -> None:
    """A ``.part`` of unknown expected size asks for the rest; "nothing left" (HTTP 416) verifies and keeps it.
    A ``.part`` of a file the server no longer has (HTTP 404) is an error, not taken as complete."""
    url, root = server
    (root / "blob.bin").write_bytes(PAYLOAD)
    (tmp_path / "blob.bin.part").write_bytes(PAYLOAD)
    assert download(f"{url}/blob.bin", tmp_path / "blob.bin", sha256=SHA, progress=False).read_bytes() == PAYLOAD
    assert RangeHandler.ranges_seen == [f"bytes={len(PAYLOAD)}-"]
    (tmp_path / "gone.bin.part").write_bytes(PAYLOAD)
    with pytest.raises(DataError, match=rf"^cannot download {url}/gone.bin: HTTP 404; download "):
        download(f"{url}/gone.bin", tmp_path / "gone.bin", sha256=SHA, progress=False)
    assert not (tmp_path / "gone.bin").exists()


def test_a_part_longer_than_the_file_is_fetched_again_from_its_first_byte(server: tuple[str, Path],
                                                                         tmp_path: Path) -> None:
    url, root = server
    (root / "blob.bin").write_bytes(PAYLOAD)
    (tmp_path / "blob.bin.part").write_bytes(PAYLOAD + b"from an older, longer file")
    assert download(f"{url}/blob.bin", tmp_path / "blob.bin", size=len(PAYLOAD), progress=False).read_bytes() == \
        PAYLOAD
    assert RangeHandler.ranges_seen == []  # no Range request: the whole file from byte 0


def test_a_dead_http_source_is_one_line_naming_the_next(server: tuple[str, Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    url, _ = server
    hf_constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)  # the local server is tried (the Hub is not reached)
    good = _wt2_zip(tmp_path / "wikitext-2-v1.zip")
    _with_urls(monkeypatch, "wt2", [f"{url}/gone.zip", good.as_uri()], hashlib.sha256(good.read_bytes()).hexdigest())
    fetch("wt2", tmp_path / "data", progress=False)
    assert [r.getMessage() for r in caplog.records] == [f"txl data: {url}/gone.zip failed (HTTP 404); trying "
                                                        f"{good.as_uri()}"]


def _enwik8_like(monkeypatch: pytest.MonkeyPatch, body: bytes, *, archive_size: int, sha256: bool = True) -> None:
    """enwik8 with a small member: checked in place inside its zip (no ``dest``), by its size (and SHA-256); the
    archive itself has a published size and no checksum."""
    spec = corpora.DATASETS["enwik8"]
    res = spec.resources[0]
    member = dataclasses.replace(res.members[0], sha256=hashlib.sha256(body).hexdigest() if sha256 else None,
                                 size=len(body))
    res = dataclasses.replace(res, members=(member,), size=archive_size, sha256=None)
    monkeypatch.setitem(corpora.DATASETS, "enwik8", dataclasses.replace(spec, resources=(res,)))


def _zipped(name: str, body: bytes) -> bytes:
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(name, body)
    return buf.getvalue()


def test_a_member_checked_in_place_keeps_its_archive_and_sizes_are_checked(
    server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """enwik8's one member is verified inside the zip (the reader reads it from there): the archive stays, shown
    by a progress bar while it lands. A wrong archive size (a server's or a hand-placed file) or a member of another
    size is refused in one line, and nothing wrong is kept."""
    url, root = server
    body = bytes(range(256)) * 40
    zipped = _zipped("enwik8", body)
    (root / "enwik8.zip").write_bytes(zipped)
    _enwik8_like(monkeypatch, body, archive_size=len(zipped))
    folder = tmp_path / "data" / "enwik8"
    capsys.readouterr()
    assert fetch("enwik8", tmp_path / "data", mirror=f"{url}/") == [folder / "enwik8.zip"]  # a mirror folder's /
    assert (folder / "enwik8.zip").read_bytes() == zipped and "enwik8.zip:" in capsys.readouterr().err
    assert json.loads((folder / "sources.json").read_text())["enwik8.zip"]["source"] == f"{url}/enwik8.zip"
    assert fetch("enwik8", tmp_path / "data2", mirror=url, progress=False)
    assert capsys.readouterr().err == ""
    _enwik8_like(monkeypatch, body, archive_size=len(zipped) + 1)  # the server's file is not the published
    with pytest.raises(DataError, match=rf"enwik8.zip.part: {len(zipped)} bytes, expected {len(zipped) + 1} "):
        fetch("enwik8", tmp_path / "data3", mirror=url, progress=False)
    assert not list((tmp_path / "data3" / "enwik8").iterdir())
    # PTB (members extracted) with an archive of published size only, placed by hand: checked like a download
    spec, tgz = corpora.DATASETS["ptb"], _ptb_tgz({"train": b"a\n", "valid": b"b\n", "test": b"c\n"})
    members = tuple(dataclasses.replace(m, sha256=None) for m in spec.resources[0].members)
    res = dataclasses.replace(spec.resources[0], members=members, sha256=None, size=len(tgz) + 1)
    monkeypatch.setitem(corpora.DATASETS, "ptb", dataclasses.replace(spec, resources=(res,)))
    hf_constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)  # the hand-placed archive is the only source
    (tmp_path / "data4" / "ptb").mkdir(parents=True)
    (tmp_path / "data4" / "ptb" / "simple-examples.tgz").write_bytes(tgz)
    with pytest.raises(DataError, match=rf"simple-examples.tgz: {len(tgz)} bytes, expected {len(tgz) + 1} \(truncated "
                       r"or wrong file\); the archive already there was removed"):
        fetch("ptb", tmp_path / "data4", progress=False)
    assert not list((tmp_path / "data4" / "ptb").iterdir())
    other = _zipped("enwik8", body + b"!")  # one byte more: the member's size (its SHA-256 unknown) is wrong
    (root / "enwik8.zip").write_bytes(other)
    _enwik8_like(monkeypatch, body, archive_size=len(other), sha256=False)
    with pytest.raises(DataError, match=r"enwik8.zip: member enwik8 does not match its published size/sha256 "
                       r"\(wrong or corrupt archive\); delete it and fetch again"):
        fetch("enwik8", tmp_path / "data5", mirror=url, progress=False)
    _enwik8_like(monkeypatch, body + b"!", archive_size=len(other), sha256=False)  # its right size: accepted
    assert fetch("enwik8", tmp_path / "data5", mirror=url, progress=False) == [tmp_path / "data5" / "enwik8" /
                                                                                 "enwik8.zip"]


def test_an_archive_unpacked_whole_is_kept_beside_a_plain_file(server: tuple[str, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """One Billion Word: a tarball unpacked whole (kept: no member list to check a re-extraction against) and a
    plain file; the plain file is recorded in the sources with its SHA-256."""
    url, root = server
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tf:
        for name, body in (("r13/heldout/news.en.heldout-00000-of-00050", b"a b\n"), ("r13/train/news.en-1", b"c\n")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    spec = corpora.DATASETS["lm1b"]
    archive, vocab = (r.filename for r in spec.resources)
    (root / archive).write_bytes(tgz.getvalue())
    (root / vocab).write_bytes(b"<S>\na\n")
    folder = tmp_path / "data" / spec.subdir
    fetch("lm1b", tmp_path / "data", mirror=url, progress=False)
    assert (folder / "r13" / "train" / "news.en-1").read_bytes() == b"c\n"
    assert (folder / archive).read_bytes() == tgz.getvalue() and (folder / vocab).read_bytes() == b"<S>\na\n"
    sources = json.loads((folder / "sources.json").read_text())
    assert sorted(sources) == [vocab] and sources[vocab]["archive"] == vocab
    assert sources[vocab]["sha256"] == hashlib.sha256(b"<S>\na\n").hexdigest()
    (folder / "r13" / "train" / "news.en-1").unlink()
    (root / archive).unlink()  # unpacked again from the archive kept (an unpacked folder has no list to check)
    fetch("lm1b", tmp_path / "data", mirror=url, progress=False)
    assert (folder / "r13" / "train" / "news.en-1").read_bytes() == b"c\n"
    # whatever the order of the resources, one already there does not stop the fetch of the next
    monkeypatch.setitem(corpora.DATASETS, "lm1b", dataclasses.replace(spec, resources=spec.resources[::-1]))
    (root / archive).write_bytes(tgz.getvalue())
    (tmp_path / "again" / spec.subdir).mkdir(parents=True)
    (tmp_path / "again" / spec.subdir / vocab).write_bytes(b"<S>\na\n")
    fetch("lm1b", tmp_path / "again", mirror=url, progress=False)
    assert (tmp_path / "again" / spec.subdir / "r13" / "train" / "news.en-1").read_bytes() == b"c\n"
    (root / archive).write_bytes(b"not a tarball")
    with pytest.raises(DataError, match=rf"{archive}: cannot extract \(file could not be opened successfully:?\); "
                       "delete it and fetch again"):
        fetch("lm1b", tmp_path / "other", mirror=url, progress=False)
    evil = io.BytesIO()  # a member outside the dataset folder: refused by tarfile's data filter, nothing written
    with tarfile.open(fileobj=evil, mode="w:gz") as tf:
        info = tarfile.TarInfo("../evil.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"x\n"))
    (root / archive).write_bytes(evil.getvalue())
    with pytest.raises(DataError, match=rf"{archive}: cannot extract \(.*evil.txt.*\); delete it and fetch again"):
        fetch("lm1b", tmp_path / "evil" / "data", mirror=url, progress=False)
    assert not (tmp_path / "evil" / "evil.txt").exists()


def test_force_fetches_again_over_an_archive_and_files_already_there(server: tuple[str, Path], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``txl data fetch --force``: the source is downloaded again; neither the archive nor the files already in
    the folder are used, whatever they hold."""
    good = {"train": b"a b\n", "valid": b"b\n", "test": b"a\n"}
    url, _, folder = _ptb_served(server, monkeypatch, tmp_path, good)
    for split in good:
        (folder / f"ptb.{split}.txt").write_bytes(b"edited\n")
    (folder / "simple-examples.tgz").write_bytes(_ptb_tgz({"train": b"x\n", "valid": b"y\n", "test": b"z\n"}))
    fetch("ptb", tmp_path / "data", mirror=url, force=True, progress=False)
    assert {p.name: p.read_bytes() for p in folder.glob("ptb.*.txt")} == {f"ptb.{k}.txt": v for k, v in good.items()}
    assert not (folder / "simple-examples.tgz").exists()


def test_offline_without_a_local_source_is_one_line_saying_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PTB has no Hub source: offline, with no archive placed by hand, nothing can be tried."""
    hf_constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    url = corpora.DATASETS["ptb"].resources[0].url
    folder = tmp_path / "data" / "ptb"
    with pytest.raises(DataError, match=rf"^ptb: offline \(HF_HUB_OFFLINE is set\) and no local source; download "
                       rf"{re.escape(url)} by hand and place it in {folder}/$"):
        fetch("ptb", tmp_path / "data", progress=False)
