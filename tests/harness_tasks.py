"""Local lm-evaluation-harness tasks over the embedded WikiText-2 valid text, and the tiny model they are scored
with: shared by the tests of our harness backend and of the harness's own ``local-completions`` client against
``txl serve``."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from tests.helpers import REPO, eval_model
from transformer_xl.data import Vocab
from transformer_xl.inference.score import split_documents

VALID = REPO / "src" / "transformer_xl" / "assets" / "wikitext-2" / "wiki.valid.tokens.xz"

ROLLING_TASK = """task: txl_wikitext_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
"""
CHOICE_TASK = """task: txl_continuation_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
"""
GENERATE_TASK = """task: txl_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: [","]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
"""


def wiki_model(out: Path) -> tuple[Path, list[str]]:
    """A tiny random model over the words of the first lines of the embedded WikiText-2 valid text (a tenth of them
    left out, so that some words are <unk>), saved to ``out/model``; and that text's documents."""
    text = lzma.decompress(VALID.read_bytes()).decode("utf-8")
    docs = split_documents("\n".join(text.split("\n")[:30]))
    words = sorted({w for d in docs for w in d.split()} - {"<unk>"})
    vocab = Vocab(["<eos>", "<unk>", *words[: len(words) * 9 // 10]], special=["<eos>", "<unk>"], eos="<eos>",
                  unk="<unk>")
    eval_model(n_token=len(vocab), tgt_len=16, mem_len=16, init_std=0.3).save_pretrained(out / "model", vocab=vocab)
    return out / "model", docs


def write_tasks(root: Path, docs: list[str]) -> Path:
    """The local tasks: every document's perplexity; for each long paragraph, its own next five words after its first
    half against the five words after the first half of the paragraph before; the same contexts to generate after."""
    tasks = root / "tasks"
    tasks.mkdir()
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    paras = [d.split() for d in docs if len(d.split()) > 40]
    half = [len(p) // 2 for p in paras]
    items = [{"context": " ".join(p[:half[i]]), "label": 1,
              "choices": [" ".join(paras[i - 1][half[i - 1]:half[i - 1] + 5]), " ".join(p[half[i]:half[i] + 5])]}
             for i, p in enumerate(paras)]
    (root / "choice.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
    (tasks / "rolling.yaml").write_text(ROLLING_TASK.format(data=root / "docs.jsonl"))
    (tasks / "choice.yaml").write_text(CHOICE_TASK.format(data=root / "choice.jsonl"))
    (tasks / "generate.yaml").write_text(GENERATE_TASK.format(data=root / "choice.jsonl").replace("answer", "label"))
    return tasks


def samples(out: Path, task: str) -> list[dict]:
    """The harness's logged samples of ``task`` under ``out``, in document order."""
    path = next(out.rglob(f"samples_{task}_*.jsonl"))
    return sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda s: s["doc_id"])


def txl_score(args: list[str], capsys: object) -> list[dict]:
    """``txl score ARGS`` in this process: its JSON lines."""
    from transformer_xl.cli import main

    assert main(["score", *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]  # type: ignore[attr-defined]
