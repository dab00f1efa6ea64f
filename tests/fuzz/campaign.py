"""Property-based fuzzing of every file txl reads, through the public entry points (issue 24, item 5).

Each reader has a seed (valid files written by txl itself or by the tools it reads from), a loader (the public
function or the CLI's ``main()`` that reads them) and mutations drawn by ``hypothesis``: byte flips, cuts,
insertions and splices anywhere in a file, and for JSON/TOML files a value replaced by any JSON value (huge and
negative numbers, nulls, nested lists). The property: every input ends in success or in ONE error line (a
:class:`TXLError` with a one-line message, or the CLI's one-line error and a non-zero exit) within the time bound;
never another exception (a traceback), a hang, an allocation beyond the memory bound, or code run from a pickle.

Run as a script (``python -m tests.fuzz.campaign --examples N [READER ...]``): it sets the memory bound
(``RLIMIT_AS``) on itself first, so a multi-gigabyte allocation fails here instead of swapping the machine, and
prints one line of counts per reader. ``hypothesis`` runs derandomized (the seed is fixed by the test's name and
``--seed``) with its example database off, so a run is repeatable; the seed is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

#: Bounds of one case: wall seconds, and the address space of the whole campaign process.
CASE_SECONDS = 20
MEMORY_BYTES = 6 * 2**30
#: Where a pickle's REDUCE would leave its mark if it ran (it must not).
MARKER = Path(tempfile.gettempdir()) / f"txl-fuzz-pickle-ran-{os.getpid()}"


class Hang(BaseException):
    """A case ran past :data:`CASE_SECONDS` (BaseException: no ``except Exception`` in txl swallows it)."""


# ---------------------------------------------------------------------------------------------- mutations
def _byte_ops() -> st.SearchStrategy:
    pos = st.integers(0, 2**20)
    return st.lists(st.one_of(
        st.tuples(st.just("flip"), pos, st.integers(1, 255)),
        st.tuples(st.just("cut"), pos),
        st.tuples(st.just("insert"), pos, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("delete"), pos, st.integers(1, 64)),
        st.tuples(st.just("splice"), pos, st.sampled_from([b"\xff\xff\xff\xff\xff\xff\xff\x7f", b"\x00" * 8,
                                                             b"-1", b"1e999", b"NaN", b'"', b"{", b"]", b"\n"])),
    ), min_size=1, max_size=4)


def mutate_bytes(data: bytes, ops: list[tuple]) -> bytes:
    """``data`` changed by ``ops`` (positions taken modulo the current length)."""
    buf = bytearray(data)
    for op in ops:
        at = op[1] % (len(buf) + 1)
        if op[0] == "flip" and buf:
            buf[at % len(buf)] ^= op[2]
        elif op[0] == "cut":
            del buf[at:]
        elif op[0] == "insert":
            buf[at:at] = op[2]
        elif op[0] == "delete":
            del buf[at:at + op[2]]
        elif op[0] == "splice":
            buf[at:at + len(op[2])] = op[2]
    return bytes(buf)


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, -1, 1, 2**31, 2**63, 10**12]),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8,
)


def mutate_json(data: Any, path: list[int], value: Any, delete: bool) -> Any:
    """``data`` with the node chosen by ``path`` (indices into each level's keys) replaced by ``value`` or deleted."""
    if not isinstance(data, (dict, list)) or not data or not path:
        return value
    keys = list(data) if isinstance(data, dict) else list(range(len(data)))
    key = keys[path[0] % len(keys)]
    out = dict(data) if isinstance(data, dict) else list(data)
    if len(path) == 1 or not isinstance(out[key], (dict, list)) or not out[key]:
        if delete:
            del out[key]
        else:
            out[key] = value
    else:
        out[key] = mutate_json(out[key], path[1:], value, delete)
    return out


def json_change() -> st.SearchStrategy:
    return st.tuples(st.lists(st.integers(0, 64), min_size=1, max_size=4), JSON_VALUES, st.booleans())


def pickle_payload(kind: str) -> bytes:
    """A pickle whose REDUCE would create :data:`MARKER` if it were loaded with the plain ``pickle`` module."""
    code = f"open({str(MARKER)!r}, 'w').close()"
    inner = b"cbuiltins\nexec\n(" + pickle.dumps(code, protocol=0)[:-1].replace(b"p0\n", b"") + b"tR."
    if kind == "bare":
        return inner
    # The same REDUCE inside a torch.save zip archive: data.pkl replaced, what torch.load would unpickle.
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", inner)
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------- the readers
@dataclass
class Reader:
    """A family of files: ``make(root)`` writes the seed files and returns the one the mutations aim at by
    default; ``load(root)`` reads them through the public entry point; ``targets``: the files mutated."""

    name: str
    make: Callable[[Path], None]
    load: Callable[[Path], Any]
    targets: tuple[str, ...]
    json_targets: tuple[str, ...] = ()
    pickles: tuple[str, ...] = ()
    rehash: str | None = None  # a folder whose MANIFEST.json is rewritten after the change (reaches the parsers)
    counts: dict[str, int] = field(default_factory=lambda: {"cases": 0, "ok": 0, "refused": 0})


def _tiny_model() -> Any:
    from tests.helpers import tiny_model

    return tiny_model(0, n_token=20, cutoffs=[10], div_val=2, d_embed=16)


def _vocab() -> Any:
    from tests.helpers import word_vocab

    return word_vocab()


def _make_model_dir(root: Path) -> None:
    from tests.helpers import model_dir_with_vocab

    model_dir_with_vocab(root, _vocab())


def _load_model_dir(root: Path) -> Any:
    from transformer_xl.inference.loading import load_model, load_vocab

    load_model(root / "m")
    return load_vocab(root / "m")


def _cli(argv: list[str]) -> int:
    """``txl ARGV`` in-process; the property holds for the stderr it wrote (checked by the caller)."""
    from transformer_xl.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    text = err.getvalue()
    lines = [line for line in text.splitlines() if line.strip()]
    if rc != 0:
        assert rc in (1, 2) and len(lines) == 1 and ": error: " in lines[0] and "Traceback" not in text, (rc, text)
    return rc


def _load_cli_generate(root: Path) -> int:
    return _cli(["generate", str(root / "m"), "--prompt", "the game", "--max-new-tokens", "2", "--seed", "0"])


def _make_safetensors(root: Path) -> None:
    import torch

    from transformer_xl.store.tensors import save_tensors

    save_tensors({"a": torch.ones(3, 4), "b.c": torch.arange(5, dtype=torch.float32)}, root / "t.safetensors",
                 metadata={"format": "pt"})


def _load_safetensors(root: Path) -> Any:
    from transformer_xl.store.tensors import load_tensors, read_header

    read_header(root / "t.safetensors")
    return load_tensors(root / "t.safetensors")


def _make_vocab_files(root: Path) -> None:
    vocab = _vocab()
    vocab.save(root / "vocab.json")
    (root / "vocab.txt").write_text("\n".join(["<UNK>", "<eos>", *[f"w{i}" for i in range(20)]]) + "\n")


def _load_vocab_files(root: Path) -> Any:
    from transformer_xl.data.vocab import Vocab

    Vocab.load(root / "vocab.json")
    return Vocab.from_symbol_file(root / "vocab.txt")


def _words(n: int) -> str:
    return "\n".join(" ".join(f"w{(i * 7 + j) % 23}" for j in range(8)) for i in range(n)) + "\n"


def _make_npy_cache(root: Path) -> None:
    """The cache key holds the source's path: every copy of the seed names the seed's own text file, so that the
    load finds (and reads) the mutated cache instead of building a fresh one beside it."""
    from transformer_xl.data import load_corpus

    (root / "corpus.txt").write_text(_words(60))
    (root / "source").write_text(str(root / "corpus.txt"))
    load_corpus(str(root / "corpus.txt"), cache_dir=root / "cache")


def _load_npy_cache(root: Path) -> Any:
    from transformer_xl.data import load_corpus

    corpus = load_corpus((root / "source").read_text(), cache_dir=root / "cache", on_stale="error")
    return {k: int(v.max()) for k, v in corpus.splits.items() if len(v)}


def _make_metrics(root: Path) -> None:
    rows = [{"kind": "train", "step": i, "loss": 3.0 - i / 10, "lr": 1e-3, "tok_per_s": 100.0} for i in range(1, 6)]
    rows.append({"kind": "valid", "step": 5, "loss": 2.9, "ppl": 18.2})
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _load_metrics(root: Path) -> Any:
    from transformer_xl.train.metrics import read_metrics

    return read_metrics(root / "metrics.jsonl", warn=False)


def _make_toml(root: Path) -> None:
    (root / "run.toml").write_text('preset = "wt2-cpu"\nmax_step = 3\nlr = 3e-4\nn_layer = 2\n'
                                   '[model_overrides]\nd_inner = 96\n')
    (root / "run.json").write_text(json.dumps({"preset": "wt2-cpu", "max_step": 3, "lr": 0.001, "n_layer": 2}))


def _load_toml(root: Path) -> Any:
    from transformer_xl.train.config import TrainConfig, read_config_file

    for name in ("run.toml", "run.json"):
        TrainConfig.from_dict(read_config_file(root / name))


def _make_hf_dir(root: Path) -> None:
    import torch

    from transformer_xl.interop.hf import hf_config_dict, to_hf_state_dict

    model = _tiny_model()
    (root / "hf").mkdir()
    (root / "hf" / "config.json").write_text(json.dumps(hf_config_dict(model)))
    torch.save(to_hf_state_dict(model), root / "hf" / "pytorch_model.bin")
    from tests.helpers import hf_tokenizer_dict

    (root / "hf" / "vocab.pkl").write_bytes(pickle.dumps(hf_tokenizer_dict(), protocol=2))


def _load_hf_dir(root: Path) -> Any:
    from transformer_xl.interop.hf import from_hf
    from transformer_xl.interop.hf_vocab import load_hf_vocab

    from_hf(root / "hf", verify=False)
    return load_hf_vocab(root / "hf" / "vocab.pkl")


def _make_official(root: Path) -> None:
    import torch

    from transformer_xl.interop.official import to_official

    kwargs, state = to_official(_tiny_model())
    torch.save(state, root / "model.pt")
    (root / "kwargs.json").write_text(json.dumps(kwargs))


def _load_official(root: Path) -> Any:
    from transformer_xl.interop.official import load_official

    return load_official(root / "model.pt", root / "kwargs.json", verify=False)


def _make_tokenizer(root: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(23)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    (root / "corpus.txt").write_text(_words(40))


def _load_tokenizer(root: Path) -> Any:
    from transformer_xl.data import load_corpus

    return load_corpus(str(root / "corpus.txt"), cache_dir=root / "cache", tokenizer=str(root / "tokenizer.json"))


def _make_text(root: Path) -> None:
    (root / "corpus.txt").write_text("Grüße aus Köln — naïve café\n" + _words(30), encoding="utf-8")


def _load_text(root: Path) -> Any:
    from transformer_xl.data import load_corpus

    for errors in ("strict", "replace"):
        with contextlib.suppress(_txl_error()):
            load_corpus(str(root / "corpus.txt"), cache_dir=root / f"cache-{errors}", errors=errors, level="word")
    return load_corpus(str(root / "corpus.txt"), cache_dir=root / "cache-char", level="char", errors="replace")


def _txl_error() -> type[BaseException]:
    from transformer_xl.errors import TXLError

    return TXLError


READERS = {r.name: r for r in [
    Reader("model-dir", _make_model_dir, _load_model_dir, ("m/config.json", "m/model.safetensors", "m/MANIFEST.json",
                                                           "m/vocab.json"),
           json_targets=("m/config.json", "m/MANIFEST.json", "m/vocab.json")),
    Reader("model-dir-rehashed", _make_model_dir, _load_model_dir, ("m/config.json", "m/model.safetensors",
                                                                    "m/vocab.json"),
           json_targets=("m/config.json", "m/vocab.json"), rehash="m"),
    Reader("cli-generate", _make_model_dir, _load_cli_generate, ("m/config.json", "m/model.safetensors",
                                                                 "m/MANIFEST.json", "m/vocab.json"),
           json_targets=("m/config.json", "m/vocab.json"), rehash="m"),
    Reader("safetensors", _make_safetensors, _load_safetensors, ("t.safetensors",)),
    Reader("vocab-json-txt", _make_vocab_files, _load_vocab_files, ("vocab.json", "vocab.txt"),
           json_targets=("vocab.json",)),
    Reader("npy-cache", _make_npy_cache, _load_npy_cache, ("cache/*/train.npy", "cache/*/valid.npy",
                                                           "cache/*/manifest.json", "cache/*/vocab.json")),
    Reader("metrics-jsonl", _make_metrics, _load_metrics, ("metrics.jsonl",)),
    Reader("train-config", _make_toml, _load_toml, ("run.toml", "run.json"), json_targets=("run.json",)),
    Reader("hf-dir", _make_hf_dir, _load_hf_dir, ("hf/config.json", "hf/pytorch_model.bin", "hf/vocab.pkl"),
           json_targets=("hf/config.json",), pickles=("hf/pytorch_model.bin", "hf/vocab.pkl")),
    Reader("official", _make_official, _load_official, ("model.pt", "kwargs.json"), json_targets=("kwargs.json",),
           pickles=("model.pt",)),
    Reader("tokenizer-json", _make_tokenizer, _load_tokenizer, ("tokenizer.json",), json_targets=("tokenizer.json",)),
    Reader("text", _make_text, _load_text, ("corpus.txt",)),
]}

#: Encodings the text reader is given (text in any encoding: UTF-8 is the format, the rest must be refused or,
#: with errors="replace", read).
ENCODINGS = ("utf-8", "utf-16", "utf-32", "latin-1", "cp1252", "shift_jis", "utf-8-sig")


# ---------------------------------------------------------------------------------------------- the property
def _resolve(root: Path, pattern: str) -> Path:
    found = sorted(root.glob(pattern))
    assert found, f"seed file {pattern} missing under {root}"
    return found[0]


def check_case(reader: Reader, seed_dir: Path, change: tuple[str, Any]) -> None:
    """Copy the seed, apply ``change`` to one file, load: success or one error line, in time, nothing executed."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="txl-fuzz-") as tmp:
        root = Path(tmp) / "r"
        shutil.copytree(seed_dir, root)
        kind, detail = change
        target = _resolve(root, reader.targets[detail[0] % len(reader.targets)] if kind != "json"
                          else reader.json_targets[detail[0] % len(reader.json_targets)])
        if kind == "bytes":
            target.write_bytes(mutate_bytes(target.read_bytes(), detail[1]))
        elif kind == "json":
            try:
                data = json.loads(target.read_text(encoding="utf-8"))
            except ValueError:
                data = {}
            target.write_text(json.dumps(mutate_json(data, *detail[1])), encoding="utf-8")
        elif kind == "pickle":
            target = _resolve(root, reader.pickles[detail[0] % len(reader.pickles)])
            target.write_bytes(pickle_payload(detail[1]))
        elif kind == "encoding":
            text = target.read_text(encoding="utf-8")
            target.write_bytes(text.encode(detail[1], errors="replace"))
        if reader.rehash:
            from transformer_xl.store.manifest import write_manifest

            write_manifest(root / reader.rehash, [n for n in ("config.json", "model.safetensors", "vocab.json")
                                                   if (root / reader.rehash / n).is_file()])
        MARKER.unlink(missing_ok=True)
        reader.counts["cases"] += 1
        old = signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(CASE_SECONDS)
        outcome = "ok"
        try:
            result = reader.load(root)
            if isinstance(result, int) and result != 0:
                outcome = "refused"
        except _txl_error() as exc:
            message = str(exc)
            assert message and "\n" not in message, f"{reader.name}: a multi-line error: {message!r}"
            outcome = "refused"
        except Hang:
            raise AssertionError(f"{reader.name}: no answer within {CASE_SECONDS} s") from None
        except Exception as exc:  # a traceback is the failure the campaign looks for
            raise AssertionError(f"{reader.name}: {type(exc).__name__} escaped:\n{traceback.format_exc()}") from exc
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        assert not MARKER.exists(), f"{reader.name}: a pickle's REDUCE ran"
        reader.counts[outcome] += 1


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang()


def changes(reader: Reader) -> st.SearchStrategy:
    idx = st.integers(0, 63)
    options = [st.tuples(st.just("bytes"), st.tuples(idx, _byte_ops()))]
    if reader.json_targets:
        options.append(st.tuples(st.just("json"), st.tuples(idx, json_change())))
    if reader.pickles:
        options.append(st.tuples(st.just("pickle"), st.tuples(idx, st.sampled_from(["bare", "zip"]))))
    if reader.name == "text":
        options.append(st.tuples(st.just("encoding"), st.tuples(idx, st.sampled_from(ENCODINGS))))
    return st.one_of(options)


def run_reader(reader: Reader, examples: int, run_seed: int) -> dict[str, int]:
    """``examples`` cases of ``reader`` (derandomized from ``run_seed``; no example database)."""
    with tempfile.TemporaryDirectory(prefix="txl-fuzz-seed-") as tmp:
        seed_dir = Path(tmp)
        reader.make(seed_dir)
        reader.load(seed_dir)  # the seed itself loads

        @seed(run_seed)
        @settings(max_examples=examples, database=None, deadline=None, derandomize=False, print_blob=True,
                  suppress_health_check=list(HealthCheck))
        @given(change=changes(reader))
        def case(change: tuple[str, Any]) -> None:
            check_case(reader, seed_dir, change)

        case()
    return reader.counts


def limit_memory(nbytes: int = MEMORY_BYTES) -> None:
    """Cap this process's address space (a multi-gigabyte allocation then fails with MemoryError, a failure)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = nbytes if hard == resource.RLIM_INFINITY else min(nbytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("readers", nargs="*", help=f"default: all of {', '.join(READERS)}")
    parser.add_argument("--examples", type=int, default=20, help="cases per reader")
    parser.add_argument("--seed", type=int, default=24, help="hypothesis seed (printed; the same seed repeats)")
    args = parser.parse_args(argv)
    limit_memory()
    names = args.readers or list(READERS)
    print(f"fuzz seed {args.seed}, {args.examples} cases per reader, {CASE_SECONDS} s per case, "
          f"address space <= {MEMORY_BYTES >> 30} GiB", flush=True)
    failed = []
    for name in names:
        start = time.perf_counter()
        try:
            counts = run_reader(READERS[name], args.examples, args.seed)
        except Exception:  # the falsifying example and its traceback, then the other readers
            traceback.print_exc()
            failed.append(name)
            print(f"{name}: FAILED after {READERS[name].counts['cases']} cases", flush=True)
            continue
        print(f"{name}: {counts['cases']} cases, {counts['ok']} loaded, {counts['refused']} refused in one line "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
