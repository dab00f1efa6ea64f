"""The long-range corpus generator: deterministic for a seed, copies exactly at the stated distances, metadata that
indexes the character-level reading of the written folder."""

import numpy as np
import pytest

from transformer_xl.data import load_corpus
from transformer_xl.data.long_range import (
    LongRangeSpec,
    generate,
    parse_spec,
    read_spans,
    span_positions,
)
from transformer_xl.errors import ConfigError, DataError

SMALL = dict(tokens={"train": 6000, "valid": 3000, "test": 2000})


def test_same_seed_same_text_other_seed_other_text():
    a, b = generate(LongRangeSpec(**SMALL)), generate(LongRangeSpec(**SMALL))
    c = generate(LongRangeSpec(seed=1, **SMALL))
    for split in ("train", "valid", "test"):
        assert np.array_equal(a.ids[split], b.ids[split]) and np.array_equal(a.spans[split], b.spans[split])
    assert not np.array_equal(a.ids["train"], c.ids["train"])
    assert not np.array_equal(a.ids["valid"], a.ids["test"][: len(a.ids["valid"])])  # splits differ


def test_spans_are_copies_at_their_distance_and_sources_do_not_overlap():
    spec = LongRangeSpec(distances=(5, 20, 40), span_lens=(3, 5), density=0.5, **SMALL)
    text = generate(spec)
    for split, spans in text.spans.items():
        ids = text.ids[split]
        assert len(spans) > 20
        assert set(spans[:, 2]) == {5, 20, 40} and set(spans[:, 1]) <= {3, 5}
        used = np.zeros(len(ids), dtype=int)
        for start, length, d in spans:
            assert np.array_equal(ids[start : start + length], ids[start - d : start - d + length])
            used[start : start + length] += 1
            used[start - d : start - d + length] += 1
        assert used.max() == 1  # no copy or source shares a position with another
        dist, offset = span_positions(spans, len(ids))
        assert (dist > 0).sum() == spans[:, 1].sum() and (offset >= 0).sum() == spans[:, 1].sum()
        assert 0.15 < (dist > 0).mean() < 0.5


def test_random_letters_are_not_copies_by_construction():
    text = generate(LongRangeSpec(**SMALL))
    ids = text.ids["train"]
    dist, _ = span_positions(text.spans["train"], len(ids))
    other = np.flatnonzero((dist == 0) & (np.arange(len(ids)) >= 24))
    match = np.mean(ids[other] == ids[other - 24])  # the letter 24 back agrees by chance only
    assert match < 1.5 / len(text.spec.alphabet)


def test_filler_and_alphabet_make_the_vocabulary():
    text = generate(LongRangeSpec(alphabet="ab", filler="xyz", distances=(4,), span_lens=(2,), **SMALL))
    assert text.spec.symbols == ["a", "b", "x", "y", "z"]
    dist, _ = span_positions(text.spans["valid"], len(text.ids["valid"]))
    assert set(text.text("valid")[i] for i in np.flatnonzero(dist)) <= {"a", "b"}
    assert set(text.text("valid")[i] for i in np.flatnonzero(dist == 0)) <= set("abxyz")


def test_written_folder_reads_back_with_the_same_positions(tmp_path):
    text = generate(LongRangeSpec(**SMALL))
    folder = text.write(tmp_path / "lr")
    spec, spans = read_spans(folder)
    assert spec == text.spec
    corpus = load_corpus(str(folder), level="char", cache_dir=str(tmp_path / "cache"))
    for split in ("train", "valid", "test"):
        assert np.array_equal(spans[split], text.spans[split])
        ids = np.asarray(corpus.splits[split])
        assert len(ids) == len(text.ids[split]) + 1  # the line's <eos>
        for start, length, d in spans[split][:50]:
            assert np.array_equal(ids[start : start + length], ids[start - d : start - d + length])
    assert text.corpus().char_level and len(text.corpus().vocab) == len(text.spec.alphabet)


@pytest.mark.parametrize("kw, match", [
    (dict(distances=(4,), span_lens=(8,)), "longer than a distance"),
    (dict(distances=(0,)), "distances"),
    (dict(alphabet="a"), "alphabet"),
    (dict(filler="a b"), "filler"),
    (dict(density=1.0), "density"),
    (dict(tokens={"train": 10}), "tokens"),
])
def test_bad_parameters_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        LongRangeSpec(**kw)


def test_parse_spec_and_unreadable_metadata(tmp_path):
    assert parse_spec([17, 19], None, alphabet="xyz").distances == (17, 19)
    with pytest.raises(DataError, match="not found"):
        read_spans(tmp_path)
    (tmp_path / "long-range.json").write_text("{}")
    with pytest.raises(DataError, match="unreadable"):
        read_spans(tmp_path)
    with pytest.raises(DataError, match="beyond"):
        span_positions(np.array([[5, 4, 2]]), 8)
