"""The tools built on transformers, through their own entry points, against txl's own commands: minicons' word
surprisals against ``txl score``, ``pipeline("text-generation")`` against ``txl generate``, ``Trainer`` fine-tuning
into a directory ``txl`` reads, and lm-evaluation-harness's ``HFLM`` against txl's ``transformer-xl`` backend."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers", minversion="5.17")

from tests.harness_tasks import txl_score, wiki_model, write_tasks
from tests.helpers import REPO, assert_same_outputs, subprocess_env
from transformer_xl import TransformerXLLM


@pytest.fixture(scope="module")
def wiki(tmp_path_factory):
    """A tiny random model over WikiText-2 words (tgt_len 16, mem_len 16: long lines cross segments) and the
    documents of the text its words come from."""
    import transformer_xl.hf  # noqa: F401 - registers transfo-xl

    return wiki_model(tmp_path_factory.mktemp("hf-tools"))


def _sentences(docs: list[str]) -> list[str]:
    """Lines of different lengths, from 3 words to past two segments of 16 tokens."""
    words = " ".join(docs[1:]).split()
    return [" ".join(words[:40]), " ".join(words[40:43]), " ".join(words[43:60])]


def test_minicons_word_surprisals_are_txl_scores(wiki, tmp_path, capsys) -> None:
    """minicons pads its batch on the right; every word's surprisal is txl score's (each line alone)."""
    scorer = pytest.importorskip("minicons.scorer")
    model_dir, docs = wiki
    lm = scorer.IncrementalLMScorer(str(model_dir), device="cpu")
    sentences = _sentences(docs)
    got = lm.token_score(sentences, surprisal=True)
    (tmp_path / "lines.txt").write_text("\n".join(sentences) + "\n")
    want = txl_score([str(model_dir), str(tmp_path / "lines.txt"), "--memory", "reset"], capsys)
    for scored, record in zip(got, want):
        tokens = [tok for tok, _ in scored]
        assert tokens[0] == "<eos>" and tokens[1:] == record["tokens"][:-1]  # txl scores the line's end too
        surprisals = [s for _, s in scored[1:]]
        expected = [-lp for lp in record["log_probs"][:-1]]
        assert surprisals == pytest.approx(expected, rel=0, abs=1e-5)


def test_pipeline_greedy_text_is_txl_generates(wiki) -> None:
    from transformers import pipeline

    model_dir, docs = wiki
    prompt = " ".join(_sentences(docs)[0].split()[:20])
    pipe = pipeline("text-generation", model=str(model_dir))
    out = pipe(prompt, do_sample=False, max_new_tokens=12, add_special_tokens=False)[0]["generated_text"]
    run = subprocess.run([sys.executable, "-m", "transformer_xl", "generate", str(model_dir), "--prompt", prompt,
                          "--greedy", "--max-new-tokens", "12", "--json"], capture_output=True, text=True,
                         env=subprocess_env(REPO), timeout=120)
    assert run.returncode == 0, run.stderr
    sample = json.loads(run.stdout)["samples"][0]
    assert out == prompt + sample["text"]
    ids = pipe(prompt, do_sample=False, max_new_tokens=12, add_special_tokens=False, return_tensors=True)
    assert ids[0]["generated_token_ids"][-12:] == sample["token_ids"]


def test_trainer_fine_tunes_and_saves_a_directory_txl_reads(wiki, tmp_path) -> None:
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
    )

    model_dir, docs = wiki
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tokenizer("\n".join(docs)).input_ids
    blocks = [{"input_ids": ids[i:i + 40]} for i in range(0, len(ids) - 40, 40)][:16]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=12, per_device_train_batch_size=4,
                             learning_rate=3e-3, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                             seed=0, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=blocks,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 12 and sum(losses[-3:]) < sum(losses[:3]) * 0.95  # it learns (6.4 -> 5.8 nats here)
    trainer.save_model(str(tmp_path / "tuned"))
    tuned = TransformerXLLM.from_pretrained(tmp_path / "tuned")
    assert_same_outputs(tuned, trainer.model.transformer.eval())
    assert not torch.equal(tuned.state_dict()["layers.0.dec_attn.qkv_net.weight"],
                           TransformerXLLM.from_pretrained(model_dir).state_dict()["layers.0.dec_attn.qkv_net.weight"])


def _log_likelihood(resp: list) -> float:
    """The log-likelihood in a logged response: ``[ll]`` (rolling) or ``[(ll, is_greedy)]`` (a choice)."""
    first = resp[0]
    return float(first[0] if isinstance(first, (list, tuple)) else first)


@pytest.mark.slow
def test_the_harness_hf_backend_matches_txls_own_backend(wiki, tmp_path, monkeypatch) -> None:
    """``HFLM`` over our model and tokenizer gives each document's and each choice's log-likelihood as txl's own
    backend does. Two of the harness's conventions set ``add_bos_token``: a document is read after the harness's
    prefix token (our start symbol) and its own tokens, so the tokenizer must not add the start symbol again
    (``add_bos_token=False``); a choice's context is encoded as it stands, so it takes the start symbol from the
    tokenizer (``add_bos_token=True``), as txl's backend reads every text after it. (Documents end with a newline
    here: a text's last line end is a token txl scores and the harness's encoding of a text without one lacks.)"""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from transformer_xl.integrations.harness import TransformerXLHarness

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    model_dir, docs = wiki
    tasks = write_tasks(tmp_path, [d + "\n" for d in docs])
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    for task, add_bos, metric in (("txl_wikitext_rolling", False, "word_perplexity,none"),
                                  ("txl_continuation_choice", True, "acc,none")):
        def run(lm, task=task):
            return lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=TaskManager(include_path=str(tasks)),
                                           log_samples=True, bootstrap_iters=0)

        hf = HFLM(pretrained=model, backend="causal", tokenizer=tokenizer, add_bos_token=add_bos, batch_size=4,
                  device="cpu")
        theirs, ours = run(hf), run(TransformerXLHarness(str(model_dir), batch_size=4))
        got = {s["doc_id"]: s for s in theirs["samples"][task]}
        assert len(got) == len(ours["samples"][task]) > 3
        for want in ours["samples"][task]:
            for a, b in zip(got[want["doc_id"]]["resps"], want["resps"], strict=True):
                assert _log_likelihood(a) == pytest.approx(_log_likelihood(b), rel=1e-5, abs=1e-4)
        assert math.isclose(theirs["results"][task][metric], ours["results"][task][metric], rel_tol=1e-5)


def test_the_hub_shaped_wt103_checkpoint_through_minicons_and_pipeline(tmp_path, hub_cache, capsys) -> None:
    """The orphaned checkpoint's layout (config.json, pytorch_model.bin, vocab.pkl) by its Hub id, offline: minicons'
    surprisals are txl score's and the pipeline's greedy text is txl generate's, both reading the same id."""
    scorer = pytest.importorskip("minicons.scorer")
    from transformers import pipeline

    import transformer_xl.hf  # noqa: F401
    from tests.helpers import HF_SYMS, hf_checkpoint_dir, hub_repo, tiny_model
    from transformer_xl.cli import main

    model = tiny_model(5, n_token=len(HF_SYMS), untie_r=True, tgt_len=4, mem_len=4, same_length=True, clamp_len=3)
    hub_repo(hub_cache, "transfo-xl/transfo-xl-wt103", hf_checkpoint_dir(tmp_path / "src", model))
    name = "transfo-xl/transfo-xl-wt103"
    sentences = ["the Valkyria of the , and", "é and the"]
    got = scorer.IncrementalLMScorer(name, device="cpu").token_score(sentences, surprisal=True)
    (tmp_path / "lines.txt").write_text("\n".join(sentences) + "\n")
    want = txl_score([name, str(tmp_path / "lines.txt"), "--memory", "reset"], capsys)
    for scored, record in zip(got, want, strict=True):
        assert [s for _, s in scored[1:]] == pytest.approx([-lp for lp in record["log_probs"][:-1]], abs=1e-5)
    prompt = "the Valkyria of"
    text = pipeline("text-generation", model=name)(prompt, do_sample=False, max_new_tokens=6,
                                                    add_special_tokens=False)[0]["generated_text"]
    assert main(["generate", name, "--prompt", prompt, "--greedy", "--max-new-tokens", "6", "--json"]) == 0
    assert text == prompt + json.loads(capsys.readouterr().out)["samples"][0]["text"]
