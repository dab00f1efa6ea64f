"""``TransfoXLTokenizerFast``: the text -> ids rules of ``txl score`` as a transformers 5 fast tokenizer.

transformers 5 removed TransfoXL and its pickled ``TransfoXLTokenizer``. This tokenizer holds the ``tokenizers``
pipeline of :func:`~transformer_xl.integrations.hf.tokenizer_build.build_tokenizer`, so
``tok(text, add_special_tokens=False).input_ids`` is exactly :meth:`LineEncoder.string_ids` of ``text`` and
``tok(text).input_ids`` puts the start symbol first, as ``txl score`` scores every token after it (Dai et al.,
2019, train on lines that each follow ``<eos>``). It saves to ``tokenizer.json`` + ``tokenizer_config.json``
(no pickle) and loads back with ``from_pretrained`` or, once registered, ``AutoTokenizer``.

* ``pad_token`` is a new ``<pad>`` with the id ``len(vocab)``, one past the model's vocabulary: text never
  encodes to it (special tokens are never matched in text: ``split_special_tokens=True``), the model masks it.
* ``padding_side`` is ``"right"``; ``model_max_length`` is transformers' "no limit" (``int(1e30)``): a
  Transformer-XL carries memory across segments and has no position limit.
* ``decode`` joins words with spaces and writes ``<eos>`` as a newline (characters and bytes are joined as
  they are); ``skip_special_tokens=True`` drops only the pad, since start and end-of-line symbols are text here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from transformer_xl.errors import CheckpointError, DataError
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.integrations.hf.resolve import is_hf_layout, load_directory_vocab, model_dir
from transformer_xl.integrations.hf.tokenizer_build import build_tokenizer, special_keys

__all__ = ["MODEL_MAX_LENGTH", "TransfoXLTokenizerFast", "tokenizer_from_model_dir"]

#: transformers' own "no length limit" value (``VERY_LARGE_INTEGER``): the model has no maximum length.
MODEL_MAX_LENGTH = int(1e30)
_NO_UNK = "Missing [UNK] token"


class TransfoXLTokenizerFast(PreTrainedTokenizerFast):
    """A txl model's tokenizer (see the module docstring); build one with :meth:`from_encoder` or
    :func:`tokenizer_from_model_dir`, or load a saved one with ``from_pretrained``."""

    vocab_files_names: ClassVar[dict[str, str]] = {"tokenizer_file": "tokenizer.json"}
    model_input_names: ClassVar[list[str]] = ["input_ids", "attention_mask"]
    padding_side = "right"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("split_special_tokens", True)  # "<pad>", "<eos>" in text are text, as txl reads them
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        kwargs.setdefault("model_max_length", MODEL_MAX_LENGTH)
        kwargs.setdefault("padding_side", "right")
        # from_pretrained passes tokenizer.json's own added tokens back, and transformers would re-add the named
        # ones as special: a subword model's <eos> must stay an ordinary added token (matched where a newline was)
        kwargs.pop("added_tokens_decoder", None)
        #: The encoder's level (``word``, ``char``, ``text8``, ``byte``, ``subword``), kept in tokenizer_config.json.
        self.txl_level: str | None = kwargs.get("txl_level")
        self._codec: Any = None
        super().__init__(*args, **kwargs)

    @classmethod
    def convert_to_native_format(cls, trust_remote_code: bool = False, **kwargs: Any) -> dict[str, Any]:
        """The saved ``tokenizer.json`` is the whole pipeline: load it as it is (no rebuilding from a vocab)."""
        return kwargs

    @property
    def can_save_slow_tokenizer(self) -> bool:
        """There is no slow tokenizer: the config keeps the name ``TransfoXLTokenizerFast``."""
        return False

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any,
                        **kwargs: Any) -> TransfoXLTokenizerFast:
        """A saved tokenizer (``tokenizer.json``), else the tokenizer of the model ``pretrained_model_name_or_path``
        names: a txl model directory, a Hugging Face TransfoXL directory (its ``vocab.pkl`` read without running it)
        or a Hub id (``transfo-xl/transfo-xl-wt103``), resolved as the model is
        (:mod:`transformer_xl.integrations.hf.resolve`)."""
        directory = model_dir(pretrained_model_name_or_path, kwargs.get("revision"))
        if (directory / "tokenizer.json").is_file():
            return super().from_pretrained(directory, *args, **kwargs)
        if not is_hf_layout(directory):
            return tokenizer_from_model_dir(directory)
        vocab = load_directory_vocab(directory)
        if vocab is None:
            raise CheckpointError(f"{pretrained_model_name_or_path}: no vocabulary (vocab.pkl, vocab.bin, vocab.txt) "
                                  "to build a tokenizer from")
        return cls.from_encoder(LineEncoder(vocab))

    @classmethod
    def from_encoder(cls, encoder: LineEncoder) -> TransfoXLTokenizerFast:
        """The tokenizer equal to ``encoder`` (a one-line :class:`ConfigError` where no exact one exists)."""
        tok = build_tokenizer(encoder)
        specials = {k: v for k, v in special_keys(encoder, tok).items() if v is not None}
        return cls(tokenizer_object=tok, txl_level=encoder.level, **specials)

    def _encode_plus(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._encode_plus(*args, **kwargs)
        except Exception as exc:  # the Rust tokenizer raises a bare Exception
            if _NO_UNK in str(exc):
                raise DataError("the text has a symbol that is not in the model's vocabulary, which has no unknown "
                                "symbol") from None
            raise

    def _decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        if isinstance(token_ids, dict):
            token_ids = token_ids["input_ids"]
        ids = [int(token_ids)] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        if skip_special_tokens:
            ids = [i for i in ids if i != self.pad_token_id]
        if self.txl_level == "word" and self.pad_token_id not in ids:
            return self._continuation_text(ids)
        return super()._decode(ids, skip_special_tokens=False, **kwargs)

    def _continuation_text(self, ids: list[int]) -> str:
        """Words as ``txl generate`` prints them after a prompt (txl's own detokenizer,
        :class:`~transformer_xl.data.codec.TextCodec`): each word after a space unless it follows a line end or the
        rules glue it (WikiText's ``@-@``, punctuation), ``<eos>`` as a newline. The ids are read as a continuation
        of a line, so the first word has its space too: ``pipeline("text-generation")`` appends the decoded new
        tokens to the prompt text, and gets ``txl generate``'s text."""
        if self._codec is None:
            from transformer_xl.data import Vocab
            from transformer_xl.data.codec import TextCodec

            symbols = self.convert_ids_to_tokens(list(range(self.pad_token_id)))
            specials = [t for t in (self.eos_token, self.unk_token) if t is not None]
            codec = TextCodec(Vocab(symbols, special=specials, eos=self.eos_token, unk=self.unk_token), "word")
            plain = next((i for i, sym in enumerate(symbols) if sym.isalnum()), None)
            self._codec = (codec, [] if plain is None else [plain])
        codec, context = self._codec
        dec = codec.decoder(context)
        return dec.feed(ids) + dec.flush()

    def _save_pretrained(self, save_directory: str | os.PathLike, file_names: tuple[str, ...],
                         legacy_format: bool | None = None, filename_prefix: str | None = None) -> tuple[str, ...]:
        """``tokenizer.json`` without the padding or truncation the last call left on the backend."""
        path = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "tokenizer.json")
        clean = Tokenizer.from_str(self.backend_tokenizer.to_str())
        clean.no_padding()
        clean.no_truncation()
        clean.save(path)
        return (*file_names, path)


def tokenizer_from_model_dir(path: str | Path, **options: Any) -> TransfoXLTokenizerFast:
    """The tokenizer of the txl model in ``path`` (its vocabulary and the level or tokenizer its run used;
    ``options`` are :meth:`LineEncoder.for_model`'s ``vocab``, ``level``, ``tokenizer``)."""
    return TransfoXLTokenizerFast.from_encoder(LineEncoder.for_model(path, **options))
