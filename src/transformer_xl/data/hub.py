"""Original dataset files rebuilt from a Hugging Face Hub dataset's Parquet shards (``Salesforce/wikitext``).

The shards are fetched with ``huggingface_hub.hf_hub_download`` (``repo_type="dataset"``, the pinned revision): its
cache, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and ``HF_TOKEN`` apply as everywhere else; no downloader of our own.
They are read with ``pyarrow`` (the ``hub`` extra). Each row is one line of the original file with its line end, a
whitespace-only line an empty row (how the Hub dataset was made), so the original bytes are written back exactly:
the line and token counts and the published checksum of the original file are verified before the file appears.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformer_xl.data.registry import HubSource, HubSplit
from transformer_xl.errors import DataError, install_hint

EXTRA = install_hint("hub")


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set (as ``huggingface_hub`` reads it)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    return bool(constants.HF_HUB_OFFLINE)


def hub_cache_dir() -> str:
    """The Hugging Face Hub cache folder (``HF_HUB_CACHE``, ``HF_HOME/hub``, ``~/.cache/huggingface/hub``)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
        return os.environ.get("HF_HUB_CACHE") or str(Path(home) / "hub")
    return str(constants.HF_HUB_CACHE)


def snapshot_dir(hub: HubSource) -> str:
    """Where ``huggingface_hub`` keeps the pinned revision's files."""
    return f"{hub_cache_dir()}/datasets--{hub.repo_id.replace('/', '--')}/snapshots/{hub.revision}"


def placement_hint(hub: HubSource, folder: Path) -> str:
    """The files to place by hand, and where, for a machine that cannot download (one line)."""
    shards = ", ".join(f for split in hub.splits for f in split.files)
    originals = ", ".join(split.dest for split in hub.splits)
    return f"place {shards} under {snapshot_dir(hub)}/, or {originals} in {folder}/"


@contextlib.contextmanager
def quiet_hub_logs() -> Iterator[None]:
    """huggingface_hub logs every retry of an unreachable Hub as a warning (and urllib3 its own retries): the one line
    of the outcome says it (used by the dataset and the model downloads alike). huggingface_hub sets its logger's
    level when its logging module is first imported, lazily, inside the first download: it is imported first here,
    or that first download would put the warnings back."""
    with contextlib.suppress(ImportError):
        import huggingface_hub.utils.logging  # noqa: F401  (sets the level, once per process)
    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "urllib3")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _download(hub: HubSource, filename: str, folder: Path) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        with quiet_hub_logs():
            return Path(hf_hub_download(hub.repo_id, filename, repo_type="dataset", revision=hub.revision))
    except LocalEntryNotFoundError:  # offline (or the Hub unreachable) and not in the cache
        why = "offline (HF_HUB_OFFLINE)" if hub_offline() else "the Hub cannot be reached"
        raise DataError(f"{why} and {hub.repo_id}@{hub.revision[:7]} is not in the Hugging Face cache; "
                        f"{placement_hint(hub, folder)}") from None
    except (EntryNotFoundError, RepositoryNotFoundError) as exc:
        raise DataError(f"{hub.describe()}: {filename} not found ({type(exc).__name__})") from None
    except (OSError, ValueError) as exc:  # HTTP errors are OSErrors (requests), a bad token a ValueError
        raise DataError(f"{hub.describe()}: cannot download {filename} ({str(exc).splitlines()[0]})") from None


def _rebuild(hub: HubSource, split: HubSplit, shards: list[Path], dest: Path) -> dict[str, Any]:
    """Write the original file of ``split`` from its shards to ``dest`` (through ``dest.part``), verified."""
    import pyarrow.parquet as pq

    sha256, sha1 = hashlib.sha256(), hashlib.sha1()
    lines = tokens = 0
    # equivalent mutants: the codec's name is case-blind; the temporary name is removed on failure, renamed on success
    blank = hub.blank_line.encode("utf-8")  # pragma: no mutate
    part = dest.with_name(dest.name + ".part")  # pragma: no mutate
    try:
        with open(part, "wb") as out:
            for shard in shards:
                # equivalent mutant (columns=None): the published shards have one column
                for batch in pq.ParquetFile(shard).iter_batches(columns=[hub.column]):  # pragma: no mutate
                    rows = batch.column(0).to_pylist()
                    body = b"".join(row.encode("utf-8") if row else blank for row in rows)
                    out.write(body)
                    sha256.update(body)
                    sha1.update(body)
                    lines += len(rows)
                    tokens += sum(len(row.split()) for row in rows if row) + len(rows)  # words + <eos> per line
    except (OSError, KeyError, ValueError, AttributeError) as exc:  # pyarrow's errors derive from these
        part.unlink(missing_ok=True)
        raise DataError(f"{hub.describe()}: cannot read {split.files[0]} ({exc})") from None
    want = {"lines": split.lines, "tokens": split.tokens, "sha256": split.sha256, "sha1": split.sha1}
    got = {"lines": lines, "tokens": tokens, "sha256": sha256.hexdigest(), "sha1": sha1.hexdigest()}
    wrong = [k for k, v in want.items() if v is not None and got[k] != v]
    if wrong:
        part.unlink(missing_ok=True)  # pragma: no mutate (equivalent: the part file was just written)
        raise DataError(f"{hub.describe()}: the text rebuilt for {split.dest} does not match the original "
                        f"({', '.join(f'{k} {got[k]}, expected {want[k]}' for k in wrong)})")
    os.replace(part, dest)
    return {"source": hub.describe(), "files": list(split.files), "sha256": got["sha256"], "lines": lines,
            "tokens": tokens}


def fetch_from_hub(hub: HubSource, folder: Path, *, force: bool = False) -> dict[str, dict[str, Any]]:
    """Rebuild every original file of ``hub`` in ``folder`` (those present are kept unless ``force``); returns the
    record of each file written (source, shards, SHA-256, lines, tokens). A one-line :class:`DataError` when a
    package is missing, the shards cannot be had, or the rebuilt text is not the original."""
    try:
        import huggingface_hub  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as exc:
        raise DataError(f"the Hub source needs huggingface_hub and pyarrow ({exc.name} is missing): {EXTRA}") from None
    folder.mkdir(parents=True, exist_ok=True)
    records = {}
    for split in hub.splits:
        dest = folder / split.dest
        if dest.exists() and not force:
            continue
        shards = [_download(hub, f, folder) for f in split.files]
        records[split.dest] = _rebuild(hub, split, shards, dest)
    return records


__all__ = ["fetch_from_hub", "hub_offline", "placement_hint", "quiet_hub_logs"]
