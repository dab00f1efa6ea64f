"""Output directories: a command writes over nothing it did not write itself.

Every txl command that writes a directory named on its command line (``txl export onnx MODEL OUT``, ``txl convert
... --out OUT``, ``txl data generate long-range OUT``) claims it first with :func:`claim_output_dir`:

* an absent or empty ``OUT`` is written;
* a previous output of the same command (its ``MANIFEST.json`` says ``"output": KIND``, :func:`write_output_manifest`,
  and ``OUT`` holds nothing that manifest does not list) is replaced: it is the command's own;
* anything else is refused in one line naming ``--force``: a file, a directory holding anything the command did not
  write (a model, a run, the user's own files), and always the command's own input (the model directory being
  exported, the run directory it belongs to) or a directory that contains it;
* with ``--force`` the old ``OUT`` is moved aside whole, to ``OUT.old-N`` beside it (the first free ``N``), and said
  on stderr; the new output is written in its place. Nothing is deleted: a command that fails moves it back.

A training run directory follows the same rule (:func:`transformer_xl.train.resume.plan_run`): a new run starts in an
absent or empty directory only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.store.manifest import MANIFEST, read_manifest, write_manifest

#: The manifest key naming the command whose output a directory is (e.g. ``"txl export onnx"``).
OUTPUT_KEY = "output"
#: How many of the names a command did not write a refusal quotes.
_QUOTED = 3


def write_output_manifest(directory: str | Path, kind: str, names: Iterable[str] | None = None) -> Path:
    """:func:`~transformer_xl.store.manifest.write_manifest` of ``directory`` that also records it as the output of
    the command ``kind``: the command may replace it later without ``--force``."""
    return write_manifest(directory, names, **{OUTPUT_KEY: kind})


def manifest_output(kind: str) -> Callable[[Path], set[str] | None]:
    """The names a previous output ``kind`` wrote in a directory (those its manifest lists, and the manifest), read
    from a manifest that says it is the output of ``kind``; ``None`` for any other directory."""

    def written(directory: Path) -> set[str] | None:
        try:
            manifest = read_manifest(directory)
        except CheckpointError:  # unreadable: nothing proves it is the command's
            return None
        if manifest is None or manifest.get(OUTPUT_KEY) != kind:
            return None
        return {*manifest["files"], MANIFEST}

    return written


def _inside(path: Path, outer: Path) -> bool:
    return path == outer or outer in path.parents


def refusal(out: str | Path, kind: str, *, protect: Iterable[str | Path] = (), sealed: Iterable[str | Path] = (),
            written: Callable[[Path], set[str] | None] | None = None) -> str | None:
    """Why the command ``kind`` may not write ``out`` (module docstring), or ``None`` when it may: ``out`` is absent,
    empty, or holds only what ``written(out)`` says an earlier run of the command wrote (default:
    :func:`manifest_output`); it is none of the paths of ``protect`` (the command's inputs) nor contains one, and
    lies inside none of ``sealed`` (model directories, which txl replaces whole: a ``best/`` at the next
    validation)."""
    out = Path(out)
    where = out.resolve()
    for p in map(Path, protect):
        if p.exists() and _inside(p.resolve(), where):
            return f"{out} is {kind}'s own input" if p.resolve() == where else f"{out} holds {kind}'s input {p}"
    for p in map(Path, sealed):
        if p.exists() and _inside(where, p.resolve()):
            return f"{out} lies inside the model directory {p}, which txl replaces as a whole"
    if not out.exists() and not out.is_symlink():
        return None
    if not out.is_dir():
        return f"{out} is a file, not a directory"
    names = sorted(p.name for p in out.iterdir())
    if not names:
        return None
    ours = (written or manifest_output(kind))(out) or set()
    foreign = [n for n in names if n not in ours]
    if not foreign:
        return None
    shown = ", ".join(foreign[:_QUOTED]) + (f" and {len(foreign) - _QUOTED} more" if len(foreign) > _QUOTED else "")
    return f"{out} holds what {kind} did not write ({shown})"


def backup_path(out: str | Path) -> Path:
    """Where ``--force`` moves an old ``out``: ``OUT.old-N`` beside it, the first ``N`` from 1 not taken."""
    out = Path(os.path.abspath(out))  # the link itself when ``out`` is a symbolic link: it is what moves
    n = 1
    while (candidate := out.with_name(f"{out.name}.old-{n}")).exists() or candidate.is_symlink():
        n += 1
    return candidate


@contextlib.contextmanager
def claim_output_dir(out: str | Path, kind: str, *, force: bool = False, protect: Iterable[str | Path] = (),
                     sealed: Iterable[str | Path] = (), written: Callable[[Path], set[str] | None] | None = None,
                     note: Callable[[str], Any] | None = None) -> Iterator[Path]:
    """The path the command ``kind`` writes its output ``out`` to, inside the block.

    ``out`` itself when it is new or empty. The command's own earlier output (:func:`refusal`) is replaced: the block
    writes a new directory beside it, which takes its place when the block ends normally -- and when files the
    command did not write appeared in it meanwhile, the old one is moved aside to :func:`backup_path` rather than
    removed. Anything else is a one-line :class:`ConfigError` naming ``--force``, unless ``force``: then the block
    writes beside ``out`` too, and the old ``out`` is moved aside (said with ``note``). The old ``out`` stays where
    it was while the block runs (it may be the command's input), and stays there if the block raises."""
    why = refusal(out, kind, protect=protect, sealed=sealed, written=written)
    out = Path(out)
    if why is None and not (out.is_dir() and any(out.iterdir())):  # new or empty: written in place
        yield out
        return
    if why is not None and not force:
        raise ConfigError(f"{why}: refusing to write there; give a new or empty directory, or --force to move it "
                          f"aside to {backup_path(out)}")
    if not out.exists() and not out.is_symlink():  # refused for where it lies (sealed): nothing to move
        yield out
        return
    where = Path(os.path.abspath(out))
    stage = where.with_name(f".{where.name}.new-{uuid.uuid4().hex[:8]}")  # hidden, beside it: the same file system
    stage.mkdir()
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)  # the block's own partial output
        raise
    if why is None and refusal(out, kind, protect=protect, sealed=sealed, written=written) is None:
        old = where.with_name(f".{where.name}.old-{uuid.uuid4().hex[:8]}")  # still the command's own: replaced
        os.rename(out, old)
        os.rename(stage, out)
        shutil.rmtree(old, ignore_errors=True)
        return
    backup = backup_path(out)  # --force, or files that are not the command's appeared while it wrote: kept
    os.rename(out, backup)
    os.rename(stage, out)
    if note is not None:
        why_moved = "--force" if why is not None else "files it did not write appeared in it meanwhile"
        note(f"moved the old {out} aside to {backup} ({why_moved})")
