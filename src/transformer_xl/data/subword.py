"""Subword corpora: user text encoded with a Hugging Face ``tokenizers`` JSON (``--tokenizer tok.json``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from transformer_xl.data.builders import Built, Source, check_nonempty, cut_lines
from transformer_xl.data.rawtext import iter_text_chunks
from transformer_xl.data.vocab import Vocab, smallest_dtype
from transformer_xl.errors import DataError, install_hint


def build_with_tokenizer(
    name: str,
    sources: Sequence[Source] | dict[str, Sequence[Source]],
    tokenizer_file: Path,
    *,
    eos_token: str | None = "<eos>",
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
    errors: str = "strict",
) -> Built:
    """Subword ids from a Hugging Face ``tokenizers`` JSON, line by line (+ ``eos_token`` if it exists)."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - tokenizers is an optional extra
        raise DataError(f"a tokenizer JSON needs the 'tokenizers' package: {install_hint('data')}") from exc
    try:
        tok = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:
        raise DataError(f"{tokenizer_file}: not a tokenizers JSON ({exc})") from None
    size = tok.get_vocab_size(with_added_tokens=True)
    symbols = [tok.id_to_token(i) or f"<id{i}>" for i in range(size)]
    eos_id = tok.token_to_id(eos_token) if eos_token else None
    vocab = Vocab(symbols, eos=eos_token if eos_id is not None else None)
    dtype = smallest_dtype(len(vocab))
    if isinstance(sources, dict):  # given train / valid / test files
        ids = {k: _tokenize_lines(tok, v, eos_id, errors).astype(dtype) for k, v in sources.items()}
        check_nonempty(name, ids, ", ".join(str(s) for srcs in sources.values() for s in srcs))
        return Built(vocab, ids)
    stream = _tokenize_lines(tok, sources, eos_id, errors)
    if stream.size == 0:
        raise DataError(f"{name}: the corpus is empty ({', '.join(map(str, sources))})")
    return Built(vocab, cut_lines(stream.astype(dtype), valid_fraction, test_fraction, name, eos_id))


def _tokenize_lines(tok: object, sources: Sequence[Source], eos_id: int | None, errors: str) -> np.ndarray:
    parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    for src in sources:
        for text in iter_text_chunks(src.read(), str(src), errors):
            lines = text.split("\n")
            if text.endswith("\n"):
                lines.pop()
            encs = tok.encode_batch([ln.strip() for ln in lines], add_special_tokens=False)  # type: ignore[attr-defined]
            for enc in encs:
                parts.append(np.asarray(enc.ids, dtype=np.int64))
                if eos_id is not None:
                    parts.append(np.asarray([eos_id], dtype=np.int64))
    return np.concatenate(parts)


class SubwordCodec:
    """Prompts and generated ids of a model trained with ``--tokenizer tok.json`` (what ``txl generate`` uses in
    place of :class:`transformer_xl.data.codec.TextCodec`): the vocabulary is the tokenizer's, id for id; each line is
    encoded by the tokenizer and lines are joined by the vocabulary's ``<eos>``, as :func:`build_with_tokenizer`
    prepared the training text."""

    level = "subword"

    def __init__(self, vocab: Vocab, tokenizer_file: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - tokenizers is an optional extra
            raise DataError(f"a tokenizer JSON needs the 'tokenizers' package: {install_hint('data')}") from exc
        try:
            self.tok = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:
            raise DataError(f"{tokenizer_file}: not a tokenizers JSON ({exc})") from None
        size = self.tok.get_vocab_size(with_added_tokens=True)
        if size != len(vocab) or any(self.tok.id_to_token(i) not in (s, None) for i, s in enumerate(vocab.idx2sym)):
            raise DataError(f"{tokenizer_file} is not the tokenizer of this model's vocabulary ({size} vs "
                            f"{len(vocab)} symbols, or other tokens)")
        self.vocab = vocab

    def start_ids(self) -> list[int]:
        if self.vocab.eos_idx is None:
            raise DataError("the prompt is empty and the vocabulary has no <eos> to start from; give a prompt")
        return [self.vocab.eos_idx]

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``: each line through the tokenizer, ``<eos>`` between lines."""
        if not text:
            return self.start_ids()
        ids: list[int] = []
        for n, line in enumerate(text.split("\n")):
            if n and self.vocab.eos_idx is not None:
                ids.append(self.vocab.eos_idx)
            ids += self.tok.encode(line, add_special_tokens=False).ids
        return ids

    def decoder(self, context: Iterable[int] = ()) -> SubwordDecoder:
        """A fresh incremental decoder that has seen ``context`` (the prompt ids print nothing)."""
        dec = SubwordDecoder(self)
        dec.feed(context)
        return dec

    def decode(self, ids: Iterable[int]) -> str:
        dec = SubwordDecoder(self)
        return dec.feed(ids) + dec.flush()


class SubwordDecoder:
    """Text of subword ids as they come: the current line is decoded whole by the tokenizer (a subword's text
    depends on its neighbours) and only what is new is returned; ``<eos>`` ends the line."""

    def __init__(self, codec: SubwordCodec) -> None:
        self.codec = codec
        self._line: list[int] = []
        self._shown = ""

    def feed(self, ids: Iterable[int]) -> str:
        out = []
        for i in (int(i) for i in ids):
            if i == self.codec.vocab.eos_idx:
                out.append(self._new_text() + "\n")
                self._line, self._shown = [], ""
            else:
                self._line.append(i)
        out.append(self._new_text())
        return "".join(out)

    def _new_text(self) -> str:
        text = self.codec.tok.decode(self._line)
        new = text[len(self._shown):] if text.startswith(self._shown) else text
        self._shown = text
        return new

    def flush(self) -> str:
        return ""
