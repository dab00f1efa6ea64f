"""``AutoModelForCausalLM`` for ``model_type="transfo-xl"``: a txl model behind transformers' causal-LM interface.

:class:`TransfoXLForCausalLM` wraps :class:`transformer_xl.model.TransformerXLLM` (``.transformer``); every number
comes from it. ``forward(input_ids, attention_mask=None, labels=None, cache=None, ...)``:

* reads the ids in segments of ``tgt_len`` tokens, each attending to the memory of the ``mem_len`` positions before
  it, as ``txl score`` and the paper's evaluation read a text (Sec. 3.2); the lengths are the txl model's
  (``model.transformer.config``: ``tgt_len``, ``mem_len``, ``clamp_len``, ``same_length``);
* returns ``logits``: the next-token **log-probabilities** ``[B, T, vocab_size]`` (float32; the adaptive softmax
  gives log-probabilities, not logits: ``softmax`` of them is the distribution, and ``log_softmax`` leaves them as
  they are), the last ``logits_to_keep`` positions only when that is given;
* with ``labels``: the loss transformers computes for a causal LM (the next token's negative log-likelihood,
  ``-100`` ignored, averaged, or summed over ``num_items_in_batch``), through the adaptive softmax's own NLL; in
  training mode with labels the logits are not formed (``logits`` is None: a 267,735-word vocabulary would cost a
  ``[B, T, V]`` tensor per step);
* with ``attention_mask``: padding is masked and left out of the memory (left padding as batched ``generate`` sends
  it, right padding as a batch of sentences), so every real token gets the log-probability it gets alone;
* carries the memory as :class:`~transformer_xl.integrations.hf.cache.TransfoXLMemory` (``cache``; transformers
  before 5.24 called it ``past_key_values``): pass it back to continue the text, as ``generate`` does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from transformer_xl.errors import ConfigError
from transformer_xl.integrations.hf.cache import TransfoXLMemory
from transformer_xl.integrations.hf.config import TransfoXLConfig
from transformer_xl.integrations.hf.padding import real_tokens
from transformer_xl.integrations.hf.reading import left_aligned, read, targets_of
from transformer_xl.integrations.hf.resolve import is_hf_layout, load_directory_vocab, load_model, model_dir
from transformer_xl.model import TransformerXLLM, TXLConfig

#: What this transformers release calls the cache in ``forward`` and in a model's output (5.24 renamed it).
CACHE_NAME = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"
#: ``from_pretrained`` options that only matter to transformers' own loader (accepted and not needed here).
_LOADER_OPTIONS = {"return_dict", "trust_remote_code", "low_cpu_mem_usage", "use_safetensors", "cache_dir",
                   "local_files_only", "token", "subfolder", "attn_implementation", "force_download", "proxies",
                   "output_loading_info", "_from_auto", "_from_pipeline", "code_revision", "adapter_kwargs",
                   "key_mapping"}


class TransfoXLForCausalLM(PreTrainedModel, GenerationMixin):
    """Transformer-XL (Dai et al., 2019) as a transformers causal language model (see the module docstring)."""

    config_class = TransfoXLConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    _is_stateful = True
    supports_gradient_checkpointing = False

    def __init__(self, config: TransfoXLConfig, model: TransformerXLLM | None = None) -> None:
        super().__init__(config)
        self.transformer = model if model is not None else TransformerXLLM(config.to_txl())
        self.post_init()

    # -- transformers' hooks ------------------------------------------------------------------------------------
    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the memory is hidden states, not keys and values: the model builds its own cache

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: :class:`TransformerXLLM` initializes its weights as the official code does."""

    def get_input_embeddings(self) -> torch.nn.Module:
        """The adaptive input embedding."""
        return self.transformer.word_emb

    def get_output_embeddings(self) -> None:
        """None: the adaptive softmax is no single matrix to tie or resize."""
        return None

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Also takes a txl state dict (keys without ``transformer.``: a saved directory's ``model.safetensors``)."""
        prefix = self.base_model_prefix + "."
        if state_dict and not any(k.startswith(prefix) for k in state_dict):
            state_dict = {prefix + k: v for k, v in state_dict.items()}
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    # -- forward ------------------------------------------------------------------------------------------------
    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                labels: Tensor | None = None, cache: TransfoXLMemory | None = None,
                past_key_values: TransfoXLMemory | None = None, use_cache: bool | None = None,
                inputs_embeds: Tensor | None = None, logits_to_keep: int = 0,
                num_items_in_batch: int | Tensor | None = None, return_dict: bool | None = None,
                **kwargs: Any) -> CausalLMOutputWithPast:
        """Log-probabilities (``logits``), the loss with ``labels``, and the memory (see the module docstring)."""
        if inputs_embeds is not None:
            raise ConfigError("inputs_embeds is not supported: Transformer-XL's adaptive input embedding reads ids")
        if input_ids is None or input_ids.dim() != 2:
            raise ConfigError("input_ids must be given as [batch, length]")
        memory = cache if cache is not None else past_key_values
        if memory is not None and not isinstance(memory, TransfoXLMemory):
            raise ConfigError(f"the cache of a Transformer-XL model is a TransfoXLMemory, got {type(memory).__name__}")
        memory = memory if memory is not None else TransfoXLMemory()
        txl = self.transformer
        bsz, qlen = input_ids.shape
        if memory.mems and memory.mems[0].size(0) != bsz:
            raise ConfigError(f"the memory holds {memory.mems[0].size(0)} rows, input_ids {bsz}")
        ids, real = real_tokens(input_ids, attention_mask, memory, n_token=txl.config.n_token,
                                pad_id=self.config.pad_token_id)
        targets = None
        if labels is not None:
            targets = targets_of(labels.to(ids.device), input_ids, n_token=txl.config.n_token,
                                 pad_id=self.config.pad_token_id)
        order = left_aligned(real)  # rows padded in front read as rows padded at the end
        if order is not None:
            ids, real = ids.gather(1, order), real.gather(1, order)
            targets = targets.gather(1, order) if targets is not None else None
        keep = qlen - logits_to_keep if logits_to_keep and order is None else 0
        got = read(txl, ids, real, targets, memory, keep=keep,
                   form_log_probs=not (self.training and labels is not None))
        logits = got.log_probs
        if logits is not None and order is not None:  # back to the rows' own positions
            back = (torch.arange(qlen, device=ids.device) - order[:, :1]) % qlen
            logits = logits.gather(1, back[..., None].expand(-1, -1, logits.size(-1)))
            logits = logits[:, qlen - logits_to_keep:] if logits_to_keep else logits
        loss = None
        if targets is not None:
            denom = num_items_in_batch if num_items_in_batch is not None else max(got.count, 1)
            loss = got.nll_sum / (denom.to(got.nll_sum.device) if isinstance(denom, Tensor) else denom)
        kept = None
        if use_cache is not False:
            memory.update_memory(got.mems, got.mem_mask, qlen)
            kept = memory
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_NAME: kept})

    # -- generation ---------------------------------------------------------------------------------------------
    def prepare_inputs_for_generation(self, input_ids: Tensor, next_sequence_length: int | None = None,
                                      cache: TransfoXLMemory | None = None,
                                      past_key_values: TransfoXLMemory | None = None,
                                      attention_mask: Tensor | None = None, **kwargs: Any) -> dict[str, Any]:
        """The ids the memory has not read yet, the attention mask and the memory (a new one at the start)."""
        if self.transformer.config.mem_len == 0:
            raise ConfigError("this model has mem_len 0: generation uses the memory as its cache; set "
                             "model.transformer.config.mem_len >= 1")
        memory = cache if cache is not None else past_key_values
        memory = memory if memory is not None else TransfoXLMemory()
        rows = input_ids.size(0)
        if memory.mems and memory.mems[0].size(0) != rows and rows % memory.mems[0].size(0) == 0:
            memory.batch_repeat_interleave(rows // memory.mems[0].size(0))  # num_return_sequences after a memory
        new = self._unread(input_ids, memory, next_sequence_length, attention_mask)
        if memory.seen == 0 and attention_mask is not None and not bool(attention_mask[:, -1].bool().all()):
            raise ConfigError("a batch of prompts padded on the right: generate continues from each row's last "
                              "position, so pad prompts on the left (tokenizer.padding_side = 'left')")
        inputs: dict[str, Any] = {"input_ids": new, "attention_mask": attention_mask, CACHE_NAME: memory,
                                  "use_cache": True}
        if kwargs.get("logits_to_keep") is not None:
            inputs["logits_to_keep"] = kwargs["logits_to_keep"]
        return inputs

    @staticmethod
    def _unread(input_ids: Tensor, memory: TransfoXLMemory, next_sequence_length: int | None,
                attention_mask: Tensor | None) -> Tensor:
        """The ids after the memory, by transformers' conventions: the last ``next_sequence_length`` when
        ``generate`` says so; else, with an attention mask (as long as the whole text), the ids past the memory's;
        else ``input_ids`` past the memory's when it is the whole text, or all of it when it is shorter (the ids
        after a memory the caller passed)."""
        if next_sequence_length is not None:
            if next_sequence_length <= 0:
                raise ConfigError(f"the memory has read all {memory.seen} ids of input_ids: nothing new to read")
            return input_ids[:, input_ids.size(1) - next_sequence_length:]
        if attention_mask is not None:
            fresh = attention_mask.size(1) - memory.seen
            if not 0 < fresh <= input_ids.size(1):
                raise ConfigError(f"the memory has read {memory.seen} tokens of a text of {attention_mask.size(1)} "
                                  f"(the attention mask's length): input_ids ({input_ids.size(1)} ids) must hold "
                                  f"the {max(fresh, 0)} after them")
            return input_ids[:, input_ids.size(1) - fresh:]
        return input_ids[:, memory.seen:] if input_ids.size(1) > memory.seen else input_ids

    # -- files --------------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *model_args: Any,
                        config: TransfoXLConfig | None = None, revision: str | None = None, dtype: Any = None,
                        torch_dtype: Any = None, device_map: Any = None, **kwargs: Any) -> TransfoXLForCausalLM:
        """A txl model directory, a Hugging Face TransfoXL directory or a Hub id (``transfo-xl/transfo-xl-wt103``),
        read by txl's safe readers (:mod:`~transformer_xl.integrations.hf.resolve`), in eval mode."""
        unknown = sorted(set(kwargs) - _LOADER_OPTIONS)
        if model_args or unknown:
            raise ConfigError(f"TransfoXLForCausalLM.from_pretrained does not take {(unknown or ['positional'])[0]}")
        directory = model_dir(pretrained_model_name_or_path, revision)
        txl = load_model(directory)
        if config is not None:  # e.g. AutoModelForCausalLM.from_pretrained(NAME, mem_len=1600): other lengths
            txl.config = with_lengths(txl.config, config.to_txl())
        hf_config = TransfoXLConfig.from_txl(txl.config, name_or_path=str(pretrained_model_name_or_path))
        vocab = load_directory_vocab(directory)
        set_token_ids(hf_config, vocab)
        model = cls(hf_config, model=txl)
        model.generation_config.pad_token_id = hf_config.pad_token_id
        model.generation_config.bos_token_id = hf_config.bos_token_id
        chosen = dtype if dtype is not None else torch_dtype
        if chosen not in (None, "auto"):
            model = model.to(getattr(torch, chosen) if isinstance(chosen, str) else chosen)
        if isinstance(device_map, (str, torch.device)) and str(device_map) != "auto":
            model = model.to(device_map)
        return model.eval()

    def save_pretrained(self, save_directory: str | Path, *args: Any, vocab: Any = None, **kwargs: Any) -> None:
        """A txl model directory, as :meth:`TransformerXLLM.save_pretrained` writes it (``config.json`` with
        ``model_type``, ``model.safetensors``, ``MANIFEST.json``; ``vocab`` as ``vocab.json`` when given, of the
        model's size): ``txl`` commands and :meth:`from_pretrained` read it. Trainer's arguments (``state_dict``,
        ``safe_serialization``, ...) are accepted; the weights are always the model's own, as safetensors. A
        directory holding a Hugging Face TransfoXL checkpoint is refused (its files would be left beside ours)."""
        if kwargs.get("push_to_hub"):
            raise ConfigError("push_to_hub is not supported here: save, then upload the directory with huggingface_hub")
        if is_hf_layout(Path(save_directory)):
            raise ConfigError(f"{save_directory} holds a Hugging Face TransfoXL checkpoint: save into another "
                              "directory")
        self.transformer.save_pretrained(save_directory, vocab=vocab)


def with_lengths(config: TXLConfig, wanted: TXLConfig) -> TXLConfig:
    """``config`` with the lengths of ``wanted`` (``tgt_len``, ``mem_len``, ``ext_len``, ``clamp_len``,
    ``same_length``: how a text is read, not the weights); a one-line :class:`ConfigError` when ``wanted`` describes
    other weights."""
    names = ("tgt_len", "mem_len", "ext_len", "clamp_len", "same_length")
    ignored = (*names, "dropout", "dropatt")
    differ = [f for f in TXLConfig.__dataclass_fields__ if f not in ignored
              and getattr(config, f) != getattr(wanted, f)]
    if differ:
        raise ConfigError(f"the config given describes other weights than the checkpoint's ({differ[0]}: "
                          f"{getattr(wanted, differ[0])!r}, the checkpoint has {getattr(config, differ[0])!r}); only "
                          f"the lengths ({', '.join(names)}) may differ")
    return config.replace(**{n: getattr(wanted, n) for n in names})


def set_token_ids(config: TransfoXLConfig, vocab: Any) -> None:
    """The special ids of a model's vocabulary in its config: padding one past the vocabulary, the start symbol as
    ``bos``; ``eos_token_id`` stays unset, so ``generate`` does not stop at ``<eos>`` (a line end in Transformer-XL's
    corpora), as ``txl generate`` does not: pass ``eos_token_id=`` to stop at one."""
    config.pad_token_id = config.vocab_size  # the model's n_token
    if vocab is not None:
        from transformer_xl.inference.lines import LineEncoder

        config.bos_token_id = LineEncoder(vocab).start_ids()[0]
