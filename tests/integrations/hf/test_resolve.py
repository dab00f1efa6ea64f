"""Loading through the Auto classes goes through txl's safe readers: a Hub id (the orphaned
``transfo-xl/transfo-xl-wt103`` layout, offline from a Hub cache), a Hugging Face TransfoXL directory, a txl
directory; a pickle is never run."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", minversion="5.17")

from tests.helpers import (
    HF_SYMS,
    HostilePickle,
    assert_same_outputs,
    hf_checkpoint_dir,
    hf_tokenizer_dict,
    hub_repo,
    tiny_model,
)
from transformer_xl import CheckpointError
from transformer_xl.integrations.hf import TransfoXLForCausalLM
from transformer_xl.integrations.hf.resolve import is_hf_layout, load_directory_vocab, model_dir


def _wt103_shaped(tmp_path, weights: str = "pytorch_model.bin", vocab=None):
    model = tiny_model(5, n_token=len(HF_SYMS), untie_r=True, cutoffs=[3, 6], div_val=2, d_embed=16)
    return model, hf_checkpoint_dir(tmp_path / "hf-src", model, weights=weights, vocab=vocab)


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "model.safetensors"])
def test_the_hub_checkpoint_loads_through_auto_model_offline(tmp_path, hub_cache, weights) -> None:
    from transformers import AutoModelForCausalLM

    model, source = _wt103_shaped(tmp_path, weights)
    hub_repo(hub_cache, "transfo-xl/transfo-xl-wt103", source)
    hf = AutoModelForCausalLM.from_pretrained("transfo-xl/transfo-xl-wt103")
    assert type(hf) is TransfoXLForCausalLM and not hf.training
    assert_same_outputs(hf.transformer, model)
    assert hf.config.pad_token_id == len(HF_SYMS) and hf.config.bos_token_id == HF_SYMS.index("<eos>")
    ids = torch.tensor([[0, 1, 4, 2, 9]])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids, return_log_probs=True).log_probs, rtol=0, atol=1e-6)


def test_a_hostile_vocabulary_pickle_is_never_run(tmp_path, hub_cache) -> None:
    from transformers import AutoModelForCausalLM

    marker = tmp_path / "pwned"
    _, source = _wt103_shaped(tmp_path, vocab=HostilePickle(marker))
    hub_repo(hub_cache, "evil/wt103", source)
    with pytest.raises(CheckpointError):
        AutoModelForCausalLM.from_pretrained("evil/wt103")
    assert not marker.exists()


def test_a_local_hugging_face_directory_and_a_missing_one(tmp_path) -> None:
    model, source = _wt103_shaped(tmp_path)
    assert is_hf_layout(source) and model_dir(source) == source
    assert_same_outputs(TransfoXLForCausalLM.from_pretrained(source).transformer, model)
    assert load_directory_vocab(source).idx2sym == hf_tokenizer_dict()["idx2sym"]
    with pytest.raises(CheckpointError, match="no such model directory"):
        model_dir(tmp_path / "nowhere")


def test_the_hub_checkpoints_tokenizer_through_auto_tokenizer(tmp_path, hub_cache) -> None:
    from transformers import AutoTokenizer

    _, source = _wt103_shaped(tmp_path)
    hub_repo(hub_cache, "transfo-xl/transfo-xl-wt103", source)
    tok = AutoTokenizer.from_pretrained("transfo-xl/transfo-xl-wt103")
    assert type(tok).__name__ == "TransfoXLTokenizerFast"
    # the start symbol, then txl score's ids (a symbol outside the vocabulary is <unk>)
    assert tok("the Valkyria , and zzz").input_ids == [0, 1, 8, 2, 6, 5]
    assert tok.pad_token_id == len(HF_SYMS)


def test_a_txl_directory_without_tokenizer_json_gets_its_vocabularys_tokenizer(tmp_path) -> None:
    from tests.helpers import word_vocab
    from transformer_xl.integrations.hf import TransfoXLTokenizerFast
    from transformer_xl.integrations.hf.tokenizer import tokenizer_from_model_dir

    vocab = word_vocab()
    tiny_model(n_token=len(vocab)).save_pretrained(tmp_path / "m", vocab=vocab)
    tok = TransfoXLTokenizerFast.from_pretrained(tmp_path / "m")
    text = " ".join(vocab.idx2sym[2:6]) + "\nnowhere"
    ids = tok(text).input_ids
    assert ids == tokenizer_from_model_dir(tmp_path / "m")(text).input_ids
    assert ids == [vocab.eos_idx, 2, 3, 4, 5, vocab.eos_idx, vocab.unk_idx]
    tok.save_pretrained(tmp_path / "m")  # with tokenizer.json beside the model, that one is read
    assert (tmp_path / "m" / "tokenizer.json").is_file()
    assert TransfoXLTokenizerFast.from_pretrained(tmp_path / "m")(text).input_ids == ids
