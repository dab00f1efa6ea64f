"""A txl model behind transformers 5's causal-LM interface: the same numbers as txl's own reading and generation,
padding that changes no real token's score, the memory carried by ``generate``, and files txl reads."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.17")

from tests.helpers import assert_same_outputs, tiny_model  # noqa: E402
from transformer_xl import TransformerXLLM  # noqa: E402
from transformer_xl.inference.generate import generate  # noqa: E402
from transformer_xl.integrations.hf import TransfoXLConfig, TransfoXLForCausalLM, TransfoXLMemory  # noqa: E402
from transformer_xl.integrations.hf.modeling import CACHE_NAME  # noqa: E402
from transformer_xl.model import Recurrence  # noqa: E402

PAD = 50  # one past the tiny vocabulary: the tokenizer's <pad>


def _wrapped(**overrides) -> TransfoXLForCausalLM:
    model = tiny_model(3, **overrides)
    config = TransfoXLConfig.from_txl(model.config, pad_token_id=PAD)
    return TransfoXLForCausalLM(config, model=model).eval()


def _txl_log_probs(model: TransformerXLLM, ids: torch.Tensor) -> torch.Tensor:
    """What txl reads: segments of tgt_len over the memory of mem_len positions."""
    rec = Recurrence(model, model.config.lengths(), inference_cache=False)
    with torch.no_grad():
        return torch.cat([rec(ids[:, s:s + model.config.tgt_len], return_log_probs=True).log_probs
                          for s in range(0, ids.size(1), model.config.tgt_len)], dim=1)


def _memory(out) -> TransfoXLMemory:
    """The memory an output carries (``cache`` from transformers 5.24 on, ``past_key_values`` before)."""
    return getattr(out, CACHE_NAME)


def _ids(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, PAD, shape, generator=torch.Generator().manual_seed(seed))


def test_logits_are_txls_log_probabilities_over_segments_and_the_loss_is_transformers() -> None:
    hf = _wrapped()
    ids = _ids(2, 11)
    labels = ids.clone()
    labels[0, 4] = -100
    with torch.no_grad():
        out = hf(ids, labels=labels)
    ref = _txl_log_probs(hf.transformer, ids)
    torch.testing.assert_close(out.logits, ref, rtol=0, atol=1e-6)
    # transformers' causal-LM loss on these logits: shift, ignore -100, mean
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, PAD), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected, rtol=0, atol=1e-6)
    with torch.no_grad():
        summed = hf(ids, labels=labels, num_items_in_batch=7).loss
    torch.testing.assert_close(summed, expected * 19 / 7, rtol=1e-6, atol=0)  # 20 targets, one ignored
    with torch.no_grad():
        last = hf(ids, logits_to_keep=3).logits
    torch.testing.assert_close(last, ref[:, -3:], rtol=0, atol=1e-6)
    assert isinstance(_memory(out), TransfoXLMemory) and _memory(out).seen == 11


def test_training_with_labels_forms_no_logits_and_learns() -> None:
    hf = _wrapped()
    hf.train()
    ids = _ids(2, 9)
    out = hf(ids, labels=ids)
    assert out.logits is None and out.loss.requires_grad
    out.loss.backward()
    assert hf.transformer.word_emb.emb_layers[0].weight.grad is not None


def test_the_memory_continues_a_text_as_one_reading() -> None:
    hf = _wrapped()
    ids = _ids(2, 10, seed=1)
    with torch.no_grad():  # a call ends a segment: split at a multiple of tgt_len (4) to read as txl reads
        first = hf(ids[:, :8])
        then = hf(ids[:, 8:], cache=_memory(first))
    torch.testing.assert_close(torch.cat([first.logits, then.logits], 1), _txl_log_probs(hf.transformer, ids),
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize("same_length", [False, True])
def test_right_padding_gives_every_real_token_its_score_alone(same_length: bool) -> None:
    hf = _wrapped(same_length=same_length)
    rows = [_ids(1, 9, seed=2)[0], _ids(1, 3, seed=3)[0], _ids(1, 6, seed=4)[0]]
    batch = torch.full((3, 9), PAD)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, :len(row)], mask[i, :len(row)] = row, 1
    with torch.no_grad():
        out = hf(batch, attention_mask=mask)
        for i, row in enumerate(rows):
            alone = hf(row[None]).logits[0]
            torch.testing.assert_close(out.logits[i, :len(row)], alone, rtol=0, atol=1e-5)
        nxt = torch.tensor([[7], [8], [9]])  # and each row continues from its own last token
        grown = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], 1)
        cont = hf(nxt, attention_mask=grown, cache=_memory(out))
        for i, row in enumerate(rows):
            alone = hf(nxt[i:i + 1], cache=_memory(hf(row[None]))).logits[0, -1]
            torch.testing.assert_close(cont.logits[i, 0], alone, rtol=0, atol=1e-5)


def test_left_padded_batched_generate_equals_each_prompt_alone_and_txl_generate() -> None:
    hf = _wrapped()
    long, short = _ids(1, 7, seed=5), _ids(1, 3, seed=6)
    batch = torch.cat([long, torch.cat([torch.full((1, 4), PAD), short], 1)])
    mask = (batch != PAD).long()
    out = hf.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=PAD)
    for i, prompt in enumerate((long, short)):
        alone = hf.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=PAD)
        assert out[i, 7:].tolist() == alone[0, prompt.size(1):].tolist()
        ours = generate(hf.transformer, prompt, max_new_tokens=6).sequences
        assert alone.tolist() == ours.tolist()


def test_beam_search_reorders_the_memory() -> None:
    hf = _wrapped()
    prompt = _ids(1, 5, seed=7)
    out = hf.generate(prompt, max_new_tokens=4, num_beams=3, do_sample=False, output_scores=True,
                      return_dict_in_generate=True, length_penalty=1.0, pad_token_id=PAD)
    seq = out.sequences[0]
    with torch.no_grad():  # the best beam's score is its log-probability, read again one new token at a time
        step = hf(prompt)
        lp = step.logits[0, -1, seq[5]]
        for i in range(5, 8):
            step = hf(seq[None, i:i + 1], cache=_memory(step))
            lp = lp + step.logits[0, -1, seq[i + 1]]
    torch.testing.assert_close(out.sequences_scores[0] * 4, lp, rtol=1e-5, atol=1e-5)
    sampled = hf.generate(prompt, max_new_tokens=3, do_sample=True, num_return_sequences=4, pad_token_id=PAD)
    assert sampled.shape == (4, 8) and (sampled[:, :5] == prompt).all()


def test_what_the_memory_cannot_do_is_refused_in_one_line() -> None:
    hf = _wrapped()
    ids = _ids(2, 4)
    with pytest.raises(ValueError, match="padding between real tokens"):
        hf(ids, attention_mask=torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]))
    first = hf(ids)
    with pytest.raises(ValueError, match="row 1 is padded on the left after text in its memory"):
        hf(ids, attention_mask=torch.tensor([[1] * 8, [1, 1, 1, 1, 0, 0, 1, 1]]), cache=_memory(first))
    with pytest.raises(ValueError, match="token id 51 is outside the model's vocabulary of 50"):
        hf(torch.tensor([[1, 51]]))
    with pytest.raises(ValueError, match="inputs_embeds is not supported"):
        hf(inputs_embeds=torch.zeros(1, 2, 16))
    with pytest.raises(ValueError, match="a TransfoXLMemory, got DynamicCache"):
        hf(ids, cache=transformers.DynamicCache())
    with pytest.raises(ValueError, match="cannot be cropped"):
        _memory(first).crop(2)
    with pytest.raises(ValueError, match="assisted generation is not supported with stateful models"):
        hf.generate(ids[:1], max_new_tokens=2, assistant_model=_wrapped())
    no_memory = _wrapped(mem_len=0)
    with pytest.raises(ValueError, match="mem_len 0: generation uses the memory as its cache"):
        no_memory.generate(ids[:1], max_new_tokens=2)


def test_saved_directory_is_a_txl_model_directory_and_loads_through_the_auto_class(tmp_path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = _wrapped(cutoffs=[10, 30], div_val=2, d_embed=16)
    hf.save_pretrained(tmp_path / "m")
    assert AutoConfig.from_pretrained(tmp_path / "m").model_type == "transfo-xl"
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert type(again) is TransfoXLForCausalLM and not again.training
    assert_same_outputs(again.transformer, hf.transformer)
    assert_same_outputs(TransformerXLLM.from_pretrained(tmp_path / "m"), hf.transformer)  # txl reads it as its own
    with pytest.raises(ValueError, match="does not take load_in_8bit"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "m", load_in_8bit=True)
    with pytest.raises(ValueError, match="push_to_hub is not supported"):
        hf.save_pretrained(tmp_path / "n", push_to_hub=True)


@pytest.mark.parametrize("same_length", [False, True])
def test_left_padding_by_any_count_gives_every_real_token_its_score_alone(same_length: bool) -> None:
    """Rows padded in front by 1, 2 and 3 positions (no multiple of tgt_len 4), longer than mem_len 6: each reads
    its segments from its own first token, as it does alone."""
    hf = _wrapped(same_length=same_length)
    rows = [_ids(1, 13, seed=8)[0], _ids(1, 12, seed=9)[0], _ids(1, 11, seed=10)[0], _ids(1, 10, seed=11)[0]]
    batch = torch.full((4, 13), PAD)
    mask = torch.zeros(4, 13, dtype=torch.long)
    for i, row in enumerate(rows):
        batch[i, 13 - len(row):], mask[i, 13 - len(row):] = row, 1
    with torch.no_grad():
        out = hf(batch, attention_mask=mask)
        last = hf(batch, attention_mask=mask, logits_to_keep=2).logits
        for i, row in enumerate(rows):
            alone = hf(row[None]).logits[0]
            torch.testing.assert_close(out.logits[i, 13 - len(row):], alone, rtol=0, atol=1e-5)
            torch.testing.assert_close(last[i], alone[-2:], rtol=0, atol=1e-5)
        labels = batch.clone()  # the common idiom: labels = input_ids, the padding id among them
        loss = hf(batch, attention_mask=mask, labels=labels).loss
    nll = [-hf(row[None]).logits[0, :-1].gather(1, row[1:, None]).sum() for row in rows]
    torch.testing.assert_close(loss, sum(nll) / sum(len(r) - 1 for r in rows), rtol=1e-5, atol=1e-5)


def test_labels_outside_the_vocabulary_or_of_another_shape_are_refused() -> None:
    hf = _wrapped(cutoffs=[10, 30])
    ids = _ids(2, 5)
    with pytest.raises(ValueError, match=r"label 60 is outside the model's vocabulary of 50 \(and is not -100"):
        hf(ids, labels=ids.masked_fill(ids == ids[0, 2], 60))
    with pytest.raises(ValueError, match=r"labels must have the shape of input_ids \(2, 5\), got \(2, 4\)"):
        hf(ids, labels=ids[:, :4])


def test_generate_continues_a_memory_it_is_given() -> None:
    hf = _wrapped()
    prompt = _ids(1, 6, seed=12)
    whole = hf.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=PAD)
    with torch.no_grad():
        memory = _memory(hf(prompt[:, :4]))
    # the text so far as the mask, the ids the memory has not read: what transformers allows after a cache
    more = hf.generate(prompt[:, 4:], attention_mask=torch.ones(1, 6, dtype=torch.long), max_new_tokens=4,
                       do_sample=False, pad_token_id=PAD, **{CACHE_NAME: memory})
    assert more[0, -4:].tolist() == whole[0, -4:].tolist()
    with torch.no_grad():
        shared = _memory(hf(prompt[:, :4]))
    samples = hf.generate(prompt, max_new_tokens=2, do_sample=True, num_return_sequences=3, pad_token_id=PAD,
                          **{CACHE_NAME: shared})
    assert samples.shape == (3, 8) and shared.mems[0].size(0) == 3  # the memory repeated for each sequence
    with pytest.raises(ValueError, match="the memory has read all 6 ids of input_ids: nothing new to read"):
        hf.generate(prompt, max_new_tokens=1, pad_token_id=PAD, **{CACHE_NAME: _memory(hf(prompt))})


def test_a_memory_read_in_two_calls_counts_every_token_it_has_read() -> None:
    """A memory that read the prompt in two calls has read both calls' tokens: ``generate`` after it takes the ids
    after them, for a batch of prompts and for several sequences per prompt, as it does from no memory at all."""
    hf = _wrapped()
    prompt = _ids(2, 7, seed=14)

    def read(*cuts: int) -> TransfoXLMemory:
        memory = None
        with torch.no_grad():
            for lo, hi in pairwise((0, *cuts)):
                memory = _memory(hf(prompt[:, lo:hi], **({} if memory is None else {CACHE_NAME: memory})))
        return memory

    memory = read(3, 5)
    assert memory.get_seq_length() == 5 and memory.seen == 5
    whole = hf.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=PAD)
    more = hf.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=PAD, **{CACHE_NAME: memory})
    assert more.tolist() == whole.tolist()
    assert memory.seen == 7 + 3  # the prompt and every generated token but the last
    sampled = []
    for given in ({}, {CACHE_NAME: read(2, 4, 5)}):
        torch.manual_seed(3)
        sampled.append(hf.generate(prompt, max_new_tokens=3, do_sample=True, num_return_sequences=2,
                                   pad_token_id=PAD, **given))
    assert sampled[0].shape == (4, 10) and sampled[1].tolist() == sampled[0].tolist()


def test_which_ids_are_new_to_the_memory() -> None:
    hf = _wrapped()
    ids = _ids(1, 6, seed=13)
    memory = _memory(hf(ids[:, :4]))
    mask = torch.ones(1, 6, dtype=torch.long)

    def new(input_ids, **kw):
        return hf.prepare_inputs_for_generation(input_ids, cache=memory, past_key_values=memory, **kw)["input_ids"]

    assert new(ids).tolist() == ids[:, 4:].tolist()  # the whole text: past the memory's
    assert new(ids[:, 4:]).tolist() == ids[:, 4:].tolist()  # the ids after the memory alone
    assert new(ids[:, 4:], attention_mask=mask).tolist() == ids[:, 4:].tolist()  # a mask of the whole text
    assert new(ids, next_sequence_length=1).tolist() == ids[:, 5:].tolist()  # generate's loop
    with pytest.raises(ValueError, match=r"read 4 tokens of a text of 9 \(the attention mask's length\): input_ids "
                                         r"\(2 ids\) must hold the 5 after them"):
        new(ids[:, 4:], attention_mask=torch.ones(1, 9, dtype=torch.long))


def test_a_right_padded_batch_of_prompts_is_refused_by_generate() -> None:
    hf = _wrapped()
    batch = torch.tensor([[1, 2, 3], [4, 5, PAD]])
    with pytest.raises(ValueError, match="pad prompts on the left"):
        hf.generate(batch, attention_mask=(batch != PAD).long(), max_new_tokens=2, pad_token_id=PAD)


def test_loading_with_other_lengths_and_saving_safely(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from tests.helpers import hf_checkpoint_dir, word_vocab

    hf = _wrapped()
    hf.save_pretrained(tmp_path / "m")
    longer = AutoModelForCausalLM.from_pretrained(tmp_path / "m", mem_len=12, same_length=True)
    assert (longer.transformer.config.mem_len, longer.transformer.config.same_length) == (12, True)
    assert_same_outputs(longer.transformer, hf.transformer)  # the same weights
    other = TransfoXLConfig.from_txl(hf.transformer.config.replace(d_inner=64))
    with pytest.raises(ValueError, match=r"other weights than the checkpoint's \(d_inner: 64, the checkpoint has 32"):
        TransfoXLForCausalLM.from_pretrained(tmp_path / "m", config=other)
    hf_dir = hf_checkpoint_dir(tmp_path / "hf", tiny_model(5, n_token=10, untie_r=True))
    before = sorted(p.name for p in hf_dir.iterdir())
    with pytest.raises(ValueError, match="holds a Hugging Face TransfoXL checkpoint: save into another directory"):
        hf.save_pretrained(hf_dir)
    assert sorted(p.name for p in hf_dir.iterdir()) == before
    with pytest.raises(ValueError, match="vocabulary"):
        hf.save_pretrained(tmp_path / "v", vocab=word_vocab())  # of another size than the model's 50
    hf.transformer.quantize()
    with pytest.raises(ValueError, match="int8-quantized model is not saved"):
        hf.save_pretrained(tmp_path / "q")


def test_a_directory_written_before_model_type_loads_by_class_not_by_auto_class(tmp_path) -> None:
    import json

    from transformers import AutoModelForCausalLM

    hf = _wrapped()
    hf.transformer.save_pretrained(tmp_path / "old")
    config = tmp_path / "old" / "config.json"
    config.write_text(json.dumps(hf.transformer.config.to_dict()))  # no model_type, as txl wrote before
    (tmp_path / "old" / "MANIFEST.json").unlink()  # (and a manifest of the config.json written now)
    assert_same_outputs(TransfoXLForCausalLM.from_pretrained(tmp_path / "old").transformer, hf.transformer)
    with pytest.raises(ValueError, match="model_type"):  # transformers' own message: the key is needed
        AutoModelForCausalLM.from_pretrained(tmp_path / "old")
