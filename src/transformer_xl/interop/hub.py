"""Models on the Hugging Face Hub: ``ORG/NAME`` (optionally ``ORG/NAME@REVISION``) wherever a model directory is
accepted (:meth:`TransformerXLLM.from_pretrained`, ``txl eval | generate | convert | recl``, ``train --init-from``).

Everything goes through ``huggingface_hub`` (``hf_hub_download``): its cache (``HF_HUB_CACHE`` / ``HF_HOME``), its
offline mode (``HF_HUB_OFFLINE=1``: the cache only), its token (``HF_TOKEN`` for private or gated repositories)
and its revisions (a branch, tag or commit; the branch ``main`` by default). There is no downloader here. The
files of one model are fetched at one commit: the one the revision named when ``config.json`` was fetched.

**Which names go to the Hub** (:func:`parse_hub_id`; relative to the working directory): a name is a Hub id only
when it is shaped ``ORG/NAME[@REVISION]`` (so ``./x``, ``../x``, ``/x``, ``~/x`` and ``a/b/c`` are paths), no file or
directory of that name exists (a local path wins: ``runs/demo`` stays the run it always was), and ``ORG`` is not a
local directory (``runs/demoo`` beside ``runs/`` is a mistyped run: refused at once as a missing directory, never
looked up on the Hub). When the Hub is unreachable (its host does not resolve or accept a connection within
:data:`PROBE_TIMEOUT_S` seconds, no proxy set) the cache alone is read, as with ``HF_HUB_OFFLINE=1``, instead of
``huggingface_hub`` retrying every request for half a minute; its retry warnings are silenced either way.

Two layouts are read:

* **txl's own** (``config.json`` with ``n_token``, ``model.safetensors``, ``vocab.json``, ``MANIFEST.json``): loaded
  from the Hub cache's snapshot folder as it is (the manifest, when the repository has one, is checked as for any
  model directory, and names the files to fetch);
* **Hugging Face TransfoXL** (``config.json`` with ``model_type: transfo-xl``, ``model.safetensors`` or
  ``pytorch_model.bin``, ``vocab.pkl`` / ``vocab.bin`` / ``vocab.txt``; e.g. ``transfo-xl/transfo-xl-wt103``):
  converted on first use by :func:`transformer_xl.interop.hf.from_hf` and
  :func:`transformer_xl.interop.hf_vocab.load_hf_vocab` (the pickles are read without running code) and written
  in txl's layout to ``<txl cache>/hub/models--ORG--NAME/<commit>/`` (``<txl cache>``: ``$TXL_CACHE_DIR``, else
  the user cache's ``txl/prepared``), so the next load of that commit reads the converted copy.
"""

from __future__ import annotations

import re
import socket
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_xl.data.hub import EXTRA as INSTALL_HINT
from transformer_xl.data.hub import hub_offline, quiet_hub_logs
from transformer_xl.data.paths import resolve_cache_dir
from transformer_xl.errors import CheckpointError, ConfigError
from transformer_xl.store.files import read_json
from transformer_xl.store.layout import CONFIG, MANIFEST, VOCAB, WEIGHTS

#: ``ORG/NAME`` or ``ORG/NAME@REVISION`` (the Hub's repository names: letters, digits, ``-``, ``_``, ``.``).
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?:@(?P<revision>[\w./-]{1,255}))?")
#: The files of a Hugging Face TransfoXL repository, in order of preference: weights, then a vocabulary.
_HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_HF_VOCABS = (("vocab.pkl",), ("vocab.bin",), ("vocab.txt", "tokenizer_config.json"))
#: Seconds to wait for a connection to the Hub before reading the cache alone.
PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class HubSnapshot:
    """The files of one repository at one commit, in the Hub cache (``path`` is its ``snapshots/<commit>``)."""

    repo_id: str
    commit: str
    path: Path
    layout: str  # "txl" (loads as it is) or "hf" (Hugging Face TransfoXL: converted once)


def parse_hub_id(name: str | Path) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``name`` is a Hub id, else None (a local path): shaped ``ORG/NAME[@REVISION]``,
    no local path of that name exists, and ``ORG`` is not a local directory (the rule in the module docstring)."""
    text = str(name)
    m = HUB_ID.fullmatch(text)
    if m is None or ".." in text or Path(text).exists() or Path(text.split("/", 1)[0]).is_dir():
        return None
    return m.group("repo"), m.group("revision")


def missing_path_hint(name: str | Path) -> str:
    """For a local path that does not exist: why a name shaped as a Hub id was not looked up on the Hub (its first
    component is a local directory, e.g. ``runs/``), else ``""``."""
    text = str(name)
    if HUB_ID.fullmatch(text) is None or Path(text).exists() or parse_hub_id(text) is not None:
        return ""
    return f" ({text.split('/', 1)[0]}/ is a local directory, so this is a path, not a Hugging Face Hub id)"


def hub_reachable() -> bool:
    """Whether a connection to the Hub's host opens within :data:`PROBE_TIMEOUT_S` seconds (True when a proxy is
    set: the proxy reaches it). Unreachable, ``huggingface_hub`` would retry each request with back-off for about
    25 s before falling back to its cache."""
    from huggingface_hub import constants

    if any(k in urllib.request.getproxies() for k in ("https", "http", "all")):
        return True
    url = urllib.parse.urlsplit(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=PROBE_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


def split_revision(name: str, revision: str | None) -> tuple[str, str | None]:
    """``(repo_id, revision)`` of an id that may carry ``@REVISION``; giving it both ways differently is refused."""
    repo, _, rev = name.partition("@")
    if rev and revision is not None and rev != revision:
        raise ConfigError(f"{name} names revision {rev!r} but revision={revision!r} was given")
    return repo, rev or revision


def fetch(name: str, revision: str | None = None) -> HubSnapshot:
    """The files of the model ``name`` (``ORG/NAME`` or ``ORG/NAME@REV``) at ``revision`` in the Hub cache,
    downloaded when missing (not with ``HF_HUB_OFFLINE=1``). One-line :class:`CheckpointError` when the id is
    unknown, unreachable or not cached offline, or not a Transformer-XL model; :class:`ConfigError` without
    ``huggingface_hub``."""
    repo, revision = split_revision(name, revision)
    try:
        import huggingface_hub as hub
    except ImportError:
        raise ConfigError(f"{repo}: no local directory of that name, and Hub model ids need huggingface_hub "
                          f"({INSTALL_HINT})") from None
    cache_only = hub_offline() or not hub_reachable()  # unreachable: the cache at once, not half a minute of retries
    config_path = Path(_download(hub, repo, CONFIG, revision, required=True, cache_only=cache_only))
    folder, commit = config_path.parent, config_path.parent.name  # the cache's snapshots/<commit>/config.json
    layout = _layout(read_json(config_path, error=CheckpointError), repo)
    get = lambda file, required=False: _download(hub, repo, file, commit, required=required,  # noqa: E731
                                                 cache_only=cache_only)
    if layout == "txl":
        manifest = get(MANIFEST)  # when there is one, it names the files (each then required)
        if manifest is not None:
            for file in read_json(manifest, error=CheckpointError).get("files", {}):
                get(file, required=True)
        else:
            get(WEIGHTS, required=True)
            get(VOCAB)
    else:
        if not any(get(file) for file in _HF_WEIGHTS):
            raise CheckpointError(f"the Hub repository {repo}@{commit[:12]} has no {' or '.join(_HF_WEIGHTS)}"
                                  f"{_offline_hint()}")
        for files in _HF_VOCABS:
            if all([get(file) for file in files]):
                break
    return HubSnapshot(repo, commit, folder, layout)


def config_layout(config: Any) -> str | None:
    """Whose ``config.json`` this is: ``"txl"`` (``n_token``; saved through transformers too, with ``model_type``),
    ``"hf"`` (Hugging Face TransfoXL: ``vocab_size``, or its ``model_type`` / architecture without ``n_token``), or
    None (neither)."""
    if not isinstance(config, dict):
        return None
    hf_arch = "TransfoXLLMHeadModel" in (config.get("architectures") or [])
    if "n_token" in config and "vocab_size" not in config and not hf_arch:
        return "txl"
    if config.get("model_type") == "transfo-xl" or "vocab_size" in config:
        return "hf"
    return "txl" if "n_token" in config else None


def _layout(config: dict[str, Any], repo: str) -> str:
    layout = config_layout(config)
    if layout is not None:
        return layout
    raise CheckpointError(f"the Hub repository {repo} is not a Transformer-XL model (config.json has model_type "
                          f"{config.get('model_type')!r}, not transfo-xl, and no n_token)")


def _download(hub: Any, repo: str, file: str, revision: str | None, *, required: bool,
              cache_only: bool = False) -> str | None:
    """``hf_hub_download`` of one file (from the cache alone with ``cache_only``); a file the repository (or, offline,
    the cache) lacks is None unless ``required``; every failure is one line."""
    from huggingface_hub import errors

    where = f"{repo}@{revision}" if revision else repo
    try:
        with quiet_hub_logs():
            return hub.hf_hub_download(repo, file, revision=revision, local_files_only=cache_only)
    except errors.LocalEntryNotFoundError:
        if not required:
            return None
        why = (f"and the Hub cache ({hub.constants.HF_HUB_CACHE}) holds no {file} of {where}{_offline_hint()}")
    except errors.EntryNotFoundError:
        if not required:
            return None
        why = f"and the Hub repository {where} has no {file}"
    except errors.RevisionNotFoundError:
        why = f"and the Hub repository {repo} has no revision {revision!r}"
    except errors.RepositoryNotFoundError:
        why = (f"and the Hugging Face Hub has no model {repo} (or it is private or gated: log in or set HF_TOKEN)")
    except (errors.HfHubHTTPError, OSError, ValueError) as exc:
        why = f"and the Hugging Face Hub gave: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    raise CheckpointError(f"{where}: no local directory of that name, {why}")


def _offline_hint() -> str:
    if hub_offline():
        return " (HF_HUB_OFFLINE is set: download it once online, or copy the cache)"
    return " (the Hub could not be reached: check the network, or set HF_HUB_OFFLINE=1 to use the cache only)"


def converted_dir(repo_id: str, commit: str, cache_dir: str | Path | None = None) -> Path:
    """Where the txl conversion of ``repo_id`` at ``commit`` is kept: ``<txl cache>/hub/models--ORG--NAME/COMMIT``."""
    return resolve_cache_dir(cache_dir) / "hub" / ("models--" + repo_id.replace("/", "--")) / commit


def hub_model_dir(name: str, revision: str | None = None, *, cache_dir: str | Path | None = None,
                  note: Callable[[str], None] | None = None) -> Path:
    """A txl model directory holding the Hub model ``name`` (``ORG/NAME[@REV]``): the snapshot itself for txl's
    layout, else its conversion, made on first use (``note`` is told, e.g. a line on stderr) and kept keyed by
    the commit."""
    snap = fetch(name, revision)
    if snap.layout == "txl":
        return snap.path
    out = converted_dir(snap.repo_id, snap.commit, cache_dir)
    if (out / MANIFEST).is_file():  # written last: the conversion is complete
        return out
    from transformer_xl.interop.hf import from_hf
    from transformer_xl.interop.hf_vocab import find_hf_vocab, load_hf_vocab

    # equivalent mutants (verify): a Hugging Face TransfoXL repository has no txl MANIFEST.json to check
    model = from_hf(snap.path, verify=False)  # pragma: no mutate
    found = find_hf_vocab(snap.path)
    vocab = load_hf_vocab(found) if found is not None else None
    if vocab is not None and len(vocab) != model.config.n_token:
        raise CheckpointError(f"the vocabulary of {snap.repo_id} ({found.name}) has {len(vocab)} symbols but its "
                              f"model predicts {model.config.n_token}")
    if note is not None:
        note(f"converting {snap.repo_id}@{snap.commit[:12]} (Hugging Face TransfoXL) once, into {out}")
    model.save_pretrained(out, vocab=vocab)
    return out
