"""Shared pieces of the tests: seeded tiny models (HF-tester sizes), a small structured word corpus, and a
tiny training run. ``conftest.py`` exposes them as fixtures; modules that need them at import time (for
``parametrize``) import them from here."""

from __future__ import annotations

import json
import os
import pickle
import random
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from transformer_xl.model import TransformerXLLM, TXLConfig
from transformer_xl.train.config import TrainConfig

#: The default tiny architecture: 2 layers, d_model 16, 2 heads of 8 (seconds on a CPU, every branch used).
TINY = dict(n_token=50, n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=4, mem_len=6, init_std=0.3)


def tiny_config(**overrides: Any) -> TXLConfig:
    """:data:`TINY` with ``overrides``."""
    return TXLConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, *, train: bool = False, **overrides: Any) -> TransformerXLLM:
    """A tiny model initialized under ``torch.manual_seed(seed)``, in eval mode unless ``train``."""
    torch.manual_seed(seed)
    return TransformerXLLM(tiny_config(**overrides)).train(train)


def generation_model(seed: int = 0, *, train: bool = False, n_token: int = 40, **overrides: Any) -> TransformerXLLM:
    """A tiny model for generation tests: non-zero biases and LayerNorms too (peaked, tie-free distributions)."""
    kw = dict(n_token=n_token, d_model=32, d_head=16, d_inner=64, tgt_len=5, mem_len=6, init_std=0.15,
              proj_init_std=0.15)
    model = tiny_model(seed, train=train, **{**kw, **overrides})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


WORDS = (
    "the", "cat", "dog", "sat", "ran", "on", "under", "a", "mat", "log", "big", "small", "red", "blue", "one",
    "two", "three", "and", "then", "it", "was", "very", "quite", "not", "so", "here", "there", "up", "down",
)


def corpus_dir(root: Path, n_train: int = 400, n_eval: int = 120) -> Path:
    """``root/corpus/{train,valid,test}.txt``: word sentences with some structure (a model can learn them)."""
    rng = random.Random(0)
    d = Path(root) / "corpus"
    d.mkdir(parents=True, exist_ok=True)

    def text(n: int) -> str:
        words: list[str] = []
        lines = []
        while len(words) < n:
            a, b = rng.choice(WORDS), rng.choice(WORDS)
            line = f"the {a} {b} sat on the {b} {a}"
            lines.append(line)
            words += line.split()
        return "\n".join(lines) + "\n"

    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        (d / f"{split}.txt").write_text(text(n), encoding="utf-8")
    return d


def tiny_train_config(out_dir: Path, dataset: str = "unused", **kw: Any) -> TrainConfig:
    """A run of the ``tiny`` model shape (d_model 16) that takes well under a second per step."""
    model = dict(n_layer=2, n_head=2, d_model=16, d_head=8, d_inner=32, tgt_len=6, mem_len=6, dropout=0.0)
    for key in list(kw):
        if key in model or key in ("cutoffs", "div_val", "tie_projs", "dropatt", "same_length", "clamp_len"):
            model[key] = kw.pop(key)
    base: dict[str, Any] = dict(dataset=dataset, model="tiny", model_overrides=model, out_dir=str(out_dir),
                                batch_size=4, lr=3e-3, warmup_step=2, max_step=8, eval_interval=4, log_interval=1,
                                eval_max_tokens=200, save_interval=2, final_eval=False, progress=False, seed=7)
    base.update(kw)
    return TrainConfig(**base)


#: An adaptive-softmax tiny model (3 clusters, div_val 2, tied projections): every weight-mapping path.
ADAPTIVE = dict(n_token=60, mem_len=4, cutoffs=[20, 40], div_val=2, tie_projs=[False, True, True])


def adaptive_model(seed: int = 0, **overrides: Any) -> TransformerXLLM:
    """:func:`tiny_model` with :data:`ADAPTIVE`."""
    return tiny_model(seed, **{**ADAPTIVE, **overrides})


def assert_same_outputs(a: TransformerXLLM, b: TransformerXLLM) -> None:
    """The two models give bit-identical NLL on a fixed batch."""
    x = torch.randint(0, a.config.n_token, (2, 4), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a(x, x).nll, b(x, x).nll, atol=0, rtol=0)


#: The repository root (the checkout under test).
REPO = Path(__file__).resolve().parents[1]


def hub_repo(cache: Path, repo_id: str, source: Path, *, ref: str = "main") -> str:
    """Lay out the files of the folder ``source`` as ``huggingface_hub`` lays out its cache (``cache`` as
    ``HF_HUB_CACHE``): ``models--ORG--NAME/blobs/<sha256>``, ``snapshots/<commit>/<file>`` links to those blobs,
    ``refs/<ref>`` holding the commit. Returns the commit (a SHA-1 of the files, as a Git commit is 40 hex digits)."""
    import hashlib

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    files = sorted(p for p in source.iterdir() if p.is_file())
    commit = hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for p in files:
        data = p.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / p.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return commit


def txl_repo(tmp_path: Path, cache: Path, repo_id: str = "org/tiny") -> tuple[TransformerXLLM, str]:
    """A tiny model in txl's layout (config.json, model.safetensors, vocab.json, MANIFEST.json) in the Hub cache."""
    vocab = word_vocab()
    model = tiny_model(3, n_token=len(vocab))
    model.save_pretrained(tmp_path / "txl-src", vocab=vocab)
    return model, hub_repo(cache, repo_id, tmp_path / "txl-src")


def hf_repo(tmp_path: Path, cache: Path, repo_id: str = "transfo-xl/tiny-wt103") -> tuple[TransformerXLLM, str]:
    """A tiny Hugging Face TransfoXL checkpoint as transfo-xl-wt103 has it (config.json, pytorch_model.bin, the
    tokenizer's pickled vocab.pkl: :func:`hf_checkpoint_dir`) in the Hub cache."""
    model = tiny_model(5, n_token=len(HF_SYMS), untie_r=True)
    return model, hub_repo(cache, repo_id, hf_checkpoint_dir(tmp_path / "hf-src", model))


def subprocess_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``txl`` subprocess: this checkout's sources, one thread, a private data cache."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TXL_CACHE_DIR": str(tmp_path / "cache"),
            "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1", **extra}



def eval_model(attn_type: int = 0, **overrides: Any) -> TransformerXLLM:
    """A tiny model for evaluation tests: segments of 8, a memory of 8 for relative encodings, none for absolute."""
    lengths = dict(tgt_len=8, mem_len=8 if attn_type in (0, 1) else 0)
    return tiny_model(attn_type=attn_type, **{**lengths, **overrides})


def token_data(n: int = 203, seed: int = 0, n_token: int = TINY["n_token"]) -> Any:
    """``n`` random token ids below ``n_token`` (a NumPy array)."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, n_token, n)


def model_dir_with_vocab(root: Path, vocab: Any, seed: int = 0) -> tuple[TransformerXLLM, Path]:
    """A tiny model for ``vocab`` saved with its vocabulary as ``root/m`` (what ``txl generate`` reads)."""
    model = tiny_model(seed, n_token=len(vocab), mem_len=4, train=True)
    model.save_pretrained(root / "m")
    vocab.save(root / "m" / "vocab.json")
    return model, root / "m"


#: A word vocabulary with WikiText conventions (``@-@``, ``@,@``), clitics and brackets.
WIKI_WORDS = ["<eos>", "<unk>", "the", "game", "was", "well", "@-@", "known", ",", ".", "1", "@,@", "000", "(", ")",
              "'s", "=", "It", "n't", "do"]


def word_vocab() -> Any:
    """:data:`WIKI_WORDS` as a vocabulary with ``<eos>`` and ``<unk>``."""
    from transformer_xl.data import Vocab

    return Vocab(WIKI_WORDS, special=["<eos>", "<unk>"], eos="<eos>", unk="<unk>")


#: A Hugging Face TransfoXL vocabulary (its tokenizer pickles these symbols).
HF_SYMS = ["<eos>", "the", ",", ".", "of", "<unk>", "and", "@-@", "Valkyria", "é"]


def hf_tokenizer_dict() -> dict:
    """What TransfoXLTokenizer.save_vocabulary pickles (its __dict__), for a small vocabulary."""
    return {
        "counter": Counter({s: 100 - i for i, s in enumerate(HF_SYMS[1:])}),
        "special": ["<eos>"], "min_freq": 0, "max_size": None, "lower_case": False, "delimiter": None,
        "vocab_file": None, "never_split": ("<unk>", "<eos>", "<formula>"),
        "idx2sym": list(HF_SYMS), "sym2idx": OrderedDict((s, i) for i, s in enumerate(HF_SYMS)),
        "eos_idx": 0, "unk_idx": 5,
    }


class HostilePickle:
    """Unpickling it would run a shell command that creates ``path`` (so a test can see it did not run)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


#: The real datasets of the workplace (Penn Treebank, WikiText-2): ``$TXL_DATA_DIR``, else ``../shared/data``.
SHARED_DATA = Path(os.environ.get("TXL_DATA_DIR") or REPO.parent / "shared" / "data")
HAVE_SHARED_DATA = (SHARED_DATA / "ptb" / "ptb.train.txt.gz").is_file() and (SHARED_DATA / "wikitext-2").is_dir()
needs_shared_data = pytest.mark.skipif(not HAVE_SHARED_DATA, reason=f"real datasets not found at {SHARED_DATA}")


def damage_file(path: Path, how: str) -> None:
    """``"truncate"``: drop the last 4 bytes; ``"bit-flip"``: flip a low mantissa bit of the file's last float32
    (a weights file stays readable and finite, only its SHA-256 tells)."""
    blob = bytearray(Path(path).read_bytes())
    if how == "truncate":
        del blob[-4:]
    elif how == "bit-flip":
        blob[-2] ^= 0x01
    else:
        raise ValueError(how)
    Path(path).write_bytes(bytes(blob))


#: The kinds of model directory txl writes, as :func:`model_dirs` lays them out.
MODEL_DIR_KINDS = ("best", "pretrained", "checkpoint", "converted")


def model_dirs(root: Path, model: TransformerXLLM, vocab: Any = None) -> dict[str, Path]:
    """``model`` as each kind of directory txl writes: ``best`` (``RUN/best`` as the trainer publishes it, with
    ``train_info.json`` and ``RUN/vocab.json``), ``pretrained`` (``save_pretrained``), ``checkpoint``
    (``RUN/checkpoints/step_*``) and ``converted`` (``txl convert --from hf`` of its ``--to hf`` export)."""
    from transformer_xl.cli import main
    from transformer_xl.store.checkpoint import save_checkpoint
    from transformer_xl.train.metrics import publish_model

    run = Path(root) / "run"
    publish_model(run / "best", model, {"step": 4, "valid_loss": 3.0})
    dirs = {"best": run / "best", "pretrained": model.save_pretrained(Path(root) / "pretrained"),
            "checkpoint": save_checkpoint(run / "checkpoints", 4, model.state_dict(), model.config.to_json(),
                                          {"step": 4})}
    assert main(["convert", str(dirs["pretrained"]), "--to", "hf", "--out", str(Path(root) / "hf")]) == 0
    assert main(["convert", str(Path(root) / "hf"), "--from", "hf", "--out", str(Path(root) / "converted")]) == 0
    dirs["converted"] = Path(root) / "converted"
    if vocab is not None:
        for d in (run, dirs["pretrained"], dirs["converted"]):
            vocab.save(d / "vocab.json")
    return dirs


#: How a command can be given a model (:func:`model_arg`): a model directory, a checkpoint, a run directory.
MODEL_ARG_KINDS = ("model", "checkpoint", "run")


def train_tiny_run(root: Path) -> tuple[Path, Path]:
    """``(run directory, corpus directory)``: a tiny model trained 4 steps on :func:`corpus_dir` into
    ``root/run`` (``best/``, ``final/``, ``checkpoints/step_*``, ``vocab.json``), as ``txl train`` writes it."""
    from transformer_xl.data import load_corpus
    from transformer_xl.train import Trainer

    corpus = corpus_dir(root)
    cfg = tiny_train_config(root / "run", str(corpus), max_step=4, eval_interval=2, save_interval=2)
    Trainer(cfg, corpus=load_corpus(str(corpus), cache_dir=root / "cache")).fit()
    return root / "run", corpus


def model_arg(run: Path, kind: str, tmp: Path) -> Path:
    """What to give a command for ``run`` as each of :data:`MODEL_ARG_KINDS`: ``model``, a copy of its ``best/``
    in an unrelated directory ``tmp/elsewhere/best`` (nothing of the run beside it); ``checkpoint``, its newest
    ``checkpoints/step_*``; ``run``, the run directory itself."""
    import shutil

    from transformer_xl.store.layout import step_dirs

    if kind == "model":
        return Path(shutil.copytree(run / "best", tmp / "elsewhere" / "best"))
    return step_dirs(run / "checkpoints")[-1] if kind == "checkpoint" else run


def assert_model_note(err: str, prog: str, run: Path, kind: str) -> None:
    """Given a run directory, ``prog`` said on stderr, in one line, that it uses the run's ``best/``; given a model
    or checkpoint directory, it said nothing of the kind."""
    import json

    notes = [line for line in err.splitlines() if ": using " in line]
    if kind == "run":
        step = json.loads((run / "best" / "train_info.json").read_text(encoding="utf-8"))["step"]
        assert notes == [f"{prog}: using {run / 'best'} (the best validation model, step {step})"], err
    else:
        assert notes == [], err


def assert_cli_refuses_damage(argv_of: Any, dirs: dict[str, Path], damage: str, capsys: Any) -> None:
    """For each directory of ``dirs``: damage its weights (:func:`damage_file`), then ``txl *argv_of(dir)`` exits
    2 with one line on stderr naming the file whose SHA-256 does not match; with ``--no-verify`` a bit-flipped
    (finite) one runs (exit 0) and a truncated one is still a one-line error."""
    from transformer_xl.cli import main

    for kind, d in dirs.items():
        damage_file(d / "model.safetensors", damage)
        argv = argv_of(d)
        capsys.readouterr()
        assert main(argv) == 2, kind
        err = capsys.readouterr().err
        assert err.startswith(f"txl {argv[0]}: error: ") and err.count("\n") == 1, (kind, err)
        assert f"{d / 'model.safetensors'} does not match its SHA-256" in err, (kind, err)
        rc = main([*argv, "--no-verify"])
        err = capsys.readouterr().err
        assert rc == (0 if damage == "bit-flip" else 2), (kind, err)
        if damage == "truncate":
            assert "is not a readable safetensors file" in err and err.count("\n") == 1, (kind, err)


def one_line_error(capsys: Any, prefix: str = "txl ") -> str:
    """What a failed command wrote to stderr, asserted to be exactly one line starting with ``prefix`` and no
    traceback."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(prefix) and "Traceback" not in err, err
    return err


def signal_at_step(monkeypatch: Any, step: int = 2) -> Any:
    """Make every :class:`Trainer` stop at ``step`` as SIGTERM/Ctrl-C would (its handler sets ``stop_request``);
    returns the original ``train_step`` (``monkeypatch.setattr(Trainer, "train_step", it)`` lets training go on)."""
    from transformer_xl.train import Trainer

    train_step = Trainer.train_step

    def signalled(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.step == step:
            self.stop_request = "signal"
        return train_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", signalled)
    return train_step


# ---------------------------------------------------------------------------------------------- torchrun processes

def workers(agent: int) -> dict[int, int]:
    """rank -> pid of the workers the torchrun agent ``agent`` started (its children with ``RANK`` set); also used
    by ``benchmarks/tour_torchrun.py``."""
    found = {}
    for child in Path(f"/proc/{agent}/task/{agent}/children").read_text().split():
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = [e[5:] for e in env if e.startswith(b"RANK=")]
        if rank:
            found[int(rank[0])] = int(child)
    return found


def ended(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie its parent has not reaped yet)."""
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def saved_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the distinct storages autograd keeps for backward while ``fn`` runs."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def hf_checkpoint_dir(root: Path, model: TransformerXLLM, *, weights: str = "pytorch_model.bin",
                      vocab: Any = None) -> Path:
    """A Hugging Face TransfoXL directory as ``transfo-xl/transfo-xl-wt103`` has it, written without transformers
    (which no longer has TransfoXL): its ``config.json`` (with the evaluation lengths), the weights in its key names
    (``pytorch_model.bin`` as ``torch.save`` writes it, or ``model.safetensors``) and the tokenizer's pickled
    ``vocab.pkl`` (``vocab``: the pickled object, by default :func:`hf_tokenizer_dict`)."""
    from safetensors.torch import save_file

    from transformer_xl.interop.hf import hf_config_dict, to_hf_state_dict

    root.mkdir(parents=True, exist_ok=True)
    config = {**hf_config_dict(model), "tgt_len": model.config.tgt_len, "ext_len": 0}
    (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
    state = {k: v.clone().contiguous() for k, v in to_hf_state_dict(model).items()}  # tied: copies
    if weights == "model.safetensors":
        save_file(state, str(root / weights))
    else:
        torch.save(state, root / weights)  # the old checkpoint's format; read back with weights_only=True
    (root / "vocab.pkl").write_bytes(pickle.dumps(hf_tokenizer_dict() if vocab is None else vocab))
    return root
