"""Downloads with resume, a progress bar and SHA-256 verification; archive member extraction; sources in order.

A download goes to ``NAME.part`` and is renamed to ``NAME`` only once complete and verified; a
checksum or size mismatch deletes the partial file. An interrupted download keeps ``NAME.part``,
which the next call resumes with an HTTP ``Range`` request.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from transformer_xl.data.hub import fetch_from_hub, hub_offline, placement_hint
from transformer_xl.data.paths import resolve_data_dir
from transformer_xl.data.registry import DatasetSpec, Member, Resource, get_spec
from transformer_xl.errors import DataError, one_line
from transformer_xl.store.files import sha256_file, write_json

BLOCK = 1 << 16
#: The record, in a dataset folder, of where each fetched file came from (URL or Hub dataset) and its SHA-256.
SOURCES = "sources.json"
log = logging.getLogger(__name__)


def _progress(total: int | None, initial: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        disable=not enabled,
        leave=False,
    )


def _open(url: str, offset: int, timeout: float):
    req = urllib.request.Request(url, headers={"User-Agent": "txl-data"})
    if offset:
        req.add_header("Range", f"bytes={offset}-")
    return urllib.request.urlopen(req, timeout=timeout)


def verify_file(path: Path, *, sha256: str | None = None, size: int | None = None) -> None:
    """Raise :class:`DataError` if ``path`` does not have the expected size / SHA-256."""
    actual = path.stat().st_size
    if size is not None and actual != size:
        raise DataError(f"{path}: {actual} bytes, expected {size} (truncated or wrong file)")
    if sha256 is not None:
        got = sha256_file(path)
        if got != sha256.lower():
            raise DataError(f"{path}: sha256 {got} does not match the expected {sha256}")


def download(
    url: str,
    dest: Path,
    *,
    sha256: str | None = None,
    size: int | None = None,
    progress: bool = True,
    timeout: float = 60.0,  # pragma: no mutate (a default wait: no test tells 60 s from 61 s)
) -> Path:
    """Download ``url`` to ``dest``, resuming ``dest.part``, verifying size and SHA-256 when known.

    On a mismatch the partial file is removed and a :class:`DataError` raised; ``dest`` only ever
    appears complete and verified.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if part.exists() else 0
    if size is not None and offset > size:
        part.unlink()
        offset = 0
    how = f"download {url} by hand and place it at {dest}"
    try:
        resp = _open(url, offset, timeout) if size is None or offset < size else None
    except urllib.error.HTTPError as exc:
        if exc.code != 416 or not offset:  # 416: nothing left to send, the part may be complete
            raise DataError(f"cannot download {url}: HTTP {exc.code}; {how}") from None
        resp = None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DataError(f"cannot download {url} ({reason}); {how}") from None
    if resp is not None:
        with resp:
            status = getattr(resp, "status", None)
            if offset and status != 206:
                offset = 0  # the server (or file://) ignored Range: start over
            length = resp.headers.get("Content-Length")
            total = offset + int(length) if length is not None else size
            written = offset
            with (
                open(part, "ab" if offset else "wb") as f,
                _progress(total, offset, dest.name, progress) as bar,
            ):
                try:
                    while block := resp.read(BLOCK):
                        f.write(block)
                        written += len(block)
                        bar.update(len(block))
                except OSError as exc:
                    raise DataError(
                        f"download of {url} interrupted at {written} bytes ({exc}); run the command again to resume"
                    ) from None
            if total is not None and written < total:
                raise DataError(
                    f"download of {url} truncated at {written} of {total} bytes; run the command again to resume"
                )
    try:
        verify_file(part, sha256=sha256, size=size)
    except DataError as exc:
        part.unlink(missing_ok=True)
        raise DataError(f"{exc}; the partial download was removed, fetch again") from None
    os.replace(part, dest)
    return dest


def _member_name(name: str) -> str:
    return name[2:] if name.startswith("./") else name


def _extract_member(archive: Path, member: Member, folder: Path) -> None:
    """Verify ``member`` of ``archive`` (and write it to ``folder/member.dest`` if it has one)."""
    h = hashlib.sha256()
    n = 0
    tmp = folder / f"{member.dest}.part" if member.dest else None
    try:
        with contextlib.ExitStack() as stack:
            if zipfile.is_zipfile(archive):
                zf = stack.enter_context(zipfile.ZipFile(archive))
                names = {_member_name(i): i for i in zf.namelist()}
                if member.name not in names:
                    raise DataError(f"{archive}: archive has no member {member.name}")
                src = stack.enter_context(zf.open(names[member.name]))
            else:
                tf = stack.enter_context(tarfile.open(archive))
                infos = {_member_name(i.name): i for i in tf.getmembers()}
                if member.name not in infos:
                    raise DataError(f"{archive}: archive has no member {member.name}")
                src = stack.enter_context(tf.extractfile(infos[member.name]))
            out = stack.enter_context(open(tmp, "wb") if tmp else open(os.devnull, "wb"))  # noqa: SIM115
            while block := src.read(BLOCK):  # pragma: no mutate (the block size bounds memory; same bytes read)
                h.update(block)
                n += len(block)
                out.write(block)
    except (OSError, zipfile.BadZipFile, tarfile.TarError, EOFError) as exc:
        raise DataError(f"{archive}: cannot read archive ({one_line(exc)}); delete it and fetch again") from None
    if (member.size is not None and n != member.size) or (member.sha256 and h.hexdigest() != member.sha256):
        if tmp:
            tmp.unlink(missing_ok=True)  # pragma: no mutate (equivalent: the part file was just written)
        raise DataError(
            f"{archive}: member {member.name} does not match its published size/sha256 "
            "(wrong or corrupt archive); delete it and fetch again"
        )
    if tmp:
        os.replace(tmp, folder / member.dest)


def _extract_all(archive: Path, folder: Path) -> None:
    try:
        with tarfile.open(archive) as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(folder, filter="data")
            else:  # pragma: no cover - Python < 3.10.12
                for m in tf.getmembers():
                    if m.name.startswith(("/", "..")) or "/../" in m.name:
                        raise DataError(f"{archive}: unsafe member path {m.name}")
                tf.extractall(folder)
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise DataError(f"{archive}: cannot extract ({one_line(exc)}); delete it and fetch again") from None


def _resource_done(res: Resource, folder: Path) -> bool:
    if res.members and all(m.dest for m in res.members):
        return all((folder / m.dest).exists() or (folder / f"{m.dest}.gz").exists() for m in res.members)
    return (folder / res.filename).exists() and not res.extract_all


def _from_url(res: Resource, url: str, folder: Path, *, force: bool, progress: bool) -> None:
    """Download ``res`` from ``url`` (or verify the archive already there) and extract its verified members."""
    archive = folder / res.filename
    there = archive.exists() and not force  # placed by hand, or left by a fetch stopped before extracting
    if not there:
        download(url, archive, sha256=res.sha256, size=res.size, progress=progress)  # verified as it lands
    try:
        if there:  # verified like a download (WikiText-103's members have no checksums of their own)
            try:
                verify_file(archive, sha256=res.sha256, size=res.size)
            except DataError as exc:
                raise DataError(f"{exc}; the archive already there was removed") from None
        for member in res.members:
            _extract_member(archive, member, folder)
    except DataError:
        # never leave an archive that failed verification as if good (it is there: found, or downloaded above)
        archive.unlink(missing_ok=True)  # pragma: no mutate (equivalent: missing_ok, the archive exists here)
        raise
    if res.extract_all:
        _extract_all(archive, folder)
    if res.members and all(m.dest for m in res.members):
        archive.unlink()  # everything needed was extracted and verified


def _record(res: Resource, url: str, folder: Path) -> dict[str, dict[str, Any]]:
    """What :data:`SOURCES` records for the files ``res`` gave: where they came from and their SHA-256."""
    names = [m.dest for m in res.members if m.dest] or ([] if res.extract_all else [res.filename])
    return {n: {"source": url, "archive": res.filename, "sha256": sha256_file(folder / n)} for n in names
            if (folder / n).is_file()}


def record_sources(folder: Path, records: dict[str, dict[str, Any]]) -> None:
    """Add ``records`` (file name -> source, SHA-256, ...) to the dataset folder's :data:`SOURCES`."""
    if records:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        new = {k: {**v, "fetched": stamp} for k, v in records.items()}
        write_json(folder / SOURCES, {**read_sources(folder), **new})


def read_sources(folder: Path) -> dict[str, dict[str, Any]]:
    """The dataset folder's :data:`SOURCES` (file name -> where it was fetched from), or ``{}``."""
    path = folder / SOURCES
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}  # a provenance note only: an unreadable one is rewritten by the next fetch
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def _offline_skip(url: str) -> bool:
    return hub_offline() and not url.startswith("file:")


def _try_sources(spec: DatasetSpec, folder: Path, *, mirror: str | None, force: bool, progress: bool) -> None:
    """Each resource not yet done from its URLs in order, then (for what is still missing) the Hub dataset. A dead
    source is said in one line naming the next one tried; when every source failed, one :class:`DataError` line."""
    failures: list[str] = []
    missing = False  # pragma: no mutate (equivalent: None is as false)
    for res in spec.resources:
        if not force and _resource_done(res, folder):
            continue
        urls = [f"{mirror.rstrip('/')}/{res.filename}"] if mirror else [u for u in res.urls if not _offline_skip(u)]
        if not force and (folder / res.filename).is_file():  # an archive already there (placed by hand) comes first,
            urls.insert(0, (folder / res.filename).as_uri())  # offline too: verified, removed if wrong
        nexts = [*urls[1:], spec.hub.describe() if spec.hub and not mirror else None]
        for url, after in zip(urls, nexts):
            try:
                _from_url(res, url, folder, force=force, progress=progress)
            except DataError as exc:
                why = _short(exc, url)
                failures.append(f"{url}: {why}")
                if after:
                    log.warning("txl data: %s failed (%s); trying %s", url, why, after)
                continue
            record_sources(folder, _record(res, url, folder))
            break
        else:
            missing = True
    if not missing:
        return
    if spec.hub is not None and not mirror:
        try:
            record_sources(folder, fetch_from_hub(spec.hub, folder, force=force))
            return
        except DataError as exc:
            failures.append(f"{spec.hub.describe()}: {exc}")
            hint = placement_hint(spec.hub, folder)
    else:
        hint = f"download {spec.resources[0].url} by hand and place it in {folder}/"
    if not failures:
        failures.append("offline (HF_HUB_OFFLINE is set) and no local source")
    tail = "" if hint in failures[-1] else f"; {hint}"
    if len(failures) == 1:  # one source (or offline: the Hub cache only)
        raise DataError(f"{spec.name}: {failures[0]}{tail}")
    raise DataError(f"{spec.name}: every source failed ({'; '.join(failures)}){tail}")


def _short(exc: DataError, url: str) -> str:
    """A failure's reason without the URL (said before it) or the advice to download by hand (said once, at the
    end): ``HTTP 403``, ``[Errno -2] Name or service not known``, ``...: sha256 ... does not match ...``."""
    text = str(exc)
    for cut in ("; download ", "; the partial download"):
        text = text.split(cut)[0]
    prefix = f"cannot download {url}"
    if text.startswith(prefix):
        text = text[len(prefix):].lstrip(": ")
        text = text[1:-1] if text.startswith("(") and text.endswith(")") else text
    return text


def fetch(
    name: str,
    data_dir: str | Path | None = None,
    *,
    mirror: str | None = None,
    force: bool = False,
    progress: bool = True,
) -> list[Path]:
    """Download and verify the files of dataset ``name`` into ``<data_dir>/<subdir>``.

    Sources are tried in order: each download's URLs (the original, then the author's mirrors), then the Hugging
    Face Hub dataset where the registry lists one (the original files rebuilt from Parquet, see
    :mod:`transformer_xl.data.hub`). Whatever the source, the files are verified (SHA-256, sizes, or the line and
    token counts and checksum of the rebuilt text), and the source used is recorded in the folder's
    :data:`SOURCES` (copied into the manifest of every cache prepared from them). With ``HF_HUB_OFFLINE`` set,
    network URLs are skipped. ``mirror`` replaces the directory part of every canonical URL (e.g. a ``file://``
    folder or a local server) and is then the only source. Files already present are kept unless ``force``.
    Returns the dataset folder's files.
    """
    spec: DatasetSpec = get_spec(name)
    folder = resolve_data_dir(data_dir) / spec.subdir
    folder.mkdir(parents=True, exist_ok=True)
    _try_sources(spec, folder, mirror=mirror, force=force, progress=progress)
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != SOURCES)


__all__ = ["SOURCES", "download", "fetch", "read_sources", "record_sources", "verify_file"]
