"""Registry of the known datasets: where their files come from, where they live, how they are prepared.

Facts follow the official Transformer-XL ``getdata.sh`` / ``data_utils.py`` and ``shared/data/README.md``.
Only checksums that are published and verified there are used; where none is known the code says so
and verifies sizes or extracted members instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from transformer_xl.errors import DataError

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"


@dataclass(frozen=True)
class Member:
    """A file inside a archive: extracted to ``dest``, or verified in place if ``dest`` is None."""

    name: str
    dest: str | None = None
    sha256: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class Resource:
    """One download: canonical URL, file name in the dataset folder, and what is known to verify it.

    ``mirrors``: other URLs serving the same bytes, tried in order after ``url`` (the same checks apply)."""

    url: str
    filename: str
    sha256: str | None = None  # None: no published checksum for the archive itself
    size: int | None = None
    members: tuple[Member, ...] = ()
    extract_all: bool = False  # unpack the whole archive (One Billion Word)
    mirrors: tuple[str, ...] = ()

    @property
    def urls(self) -> tuple[str, ...]:
        """Every URL of this file, in the order they are tried."""
        return (self.url, *self.mirrors)


@dataclass(frozen=True)
class HubSplit:
    """One original file rebuilt from a Hub dataset's Parquet shards (one row per line of the original; a
    whitespace-only line is an empty row), with what is published about the original to verify the result."""

    dest: str  # the original file name in the dataset folder (wiki.train.tokens)
    files: tuple[str, ...]  # Parquet shards in the repository, in order
    lines: int
    tokens: int  # whitespace words + one <eos> per line
    sha256: str | None = None  # of the original file, where published
    sha1: str | None = None  # where only a SHA-1 is published


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face Hub dataset holding the same text: repository, pinned revision, the splits it rebuilds."""

    repo_id: str
    revision: str  # a commit: the files are pinned, and an offline cache needs no refs lookup
    config: str
    splits: tuple[HubSplit, ...]
    column: str = "text"
    blank_line: str = " \n"  # what an empty row stood for in the original file

    def describe(self) -> str:
        """``hf://datasets/REPO@REV/CONFIG``: the source as recorded in manifests."""
        return f"hf://datasets/{self.repo_id}@{self.revision}/{self.config}"


@dataclass(frozen=True)
class DatasetSpec:
    """A named dataset: files per split (relative to the data dir, ``!`` names a zip member) and rules."""

    name: str
    title: str
    kind: str  # word | char | enwik8 | text8 | lm1b
    subdir: str
    files: dict[str, tuple[str, ...]]
    resources: tuple[Resource, ...] = ()
    lower: bool = False
    count_splits: tuple[str, ...] = ("train", "valid", "test")
    embedded: str | None = None  # folder under txl/assets used when the data dir lacks the files
    aliases: tuple[str, ...] = ()
    license: str = ""
    notes: str = ""
    extra_files: dict[str, str] = field(default_factory=dict)
    hub: HubSource | None = None  # tried after every URL of ``resources`` failed

    @property
    def char_level(self) -> bool:
        """True when results are reported in bits per character."""
        return self.kind in ("char", "enwik8", "text8")


def _split_files(*patterns: str) -> dict[str, tuple[str, ...]]:
    return {s: tuple(p.format(split=s) for p in patterns) for s in ("train", "valid", "test")}


_PTB_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
_PTB_SHA = {
    "train": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "valid": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "test": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
}
# WikiText: the original S3 bucket (403 since 2024), then the author's (Stephen Merity's) own mirror of the same zip
# files, then the Hugging Face Hub dataset Salesforce/wikitext (Parquet) at a pinned commit.
_WT_S3 = "https://s3.amazonaws.com/research.metamind.io/wikitext"
_WT_MIRROR = "https://wikitext.smerity.com"
_WT_HUB_REPO, _WT_HUB_REV = "Salesforce/wikitext", "b08601e04326c79dfdd32d625aee71d232d685c3"
# SHA-256 of the zip archives as recorded by independent loaders (Julia DataDeps registrations and Python
# loaders agree); the mirror's ETag for WikiText-103 equals torchtext's MD5 of the S3 file (the same bytes).
_WT2_ZIP_SHA = "92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c"
_WT103_ZIP_SHA = "242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590"
# WikiText-103 members: only SHA-1 values are published (Apache MXNet / GluonNLP's WikiText103); counts: Merity et
# al. 2016 (tokens) and torchtext / the Hub dataset card (lines).
_WT103_SHA1 = {
    "train": "b7497e2dfe77e72cfef5e3dbc61b7b53712ac211",
    "valid": "c326ac59dc587676d58c422eb8a03e119582f92b",
    "test": "8a5befc548865cec54ed4273cf87dbbad60d1e47",
}
_WT_LINES = {"wikitext-2": {"train": 36_718, "valid": 3_760, "test": 4_358},
             "wikitext-103": {"train": 1_801_350, "valid": 3_760, "test": 4_358}}
_WT_TOKENS = {"wikitext-2": {"train": 2_088_628, "valid": 217_646, "test": 245_569},
              "wikitext-103": {"train": 103_227_021, "valid": 217_646, "test": 245_569}}
_WT2_URL = f"{_WT_S3}/wikitext-2-v1.zip"
_WT2_SHA = {
    "train": "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f",
    "valid": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
    "test": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
}
ENWIK8_SHA256 = "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"
LM1B_ROOT = "1-billion-word-language-modeling-benchmark-r13output"
LM1B_HELDOUT = f"{LM1B_ROOT}/heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050"
LM1B_TRAIN_GLOB = f"{LM1B_ROOT}/training-monolingual.tokenized.shuffled/news.en-*"

def _mahoney(name: str, title: str, sha256: str | None, archive_size: int | None, notes: str) -> DatasetSpec:
    """enwik8 / text8: one 10^8-byte file zipped at mattmahoney.net (the archive's checksum is not published;
    the member's is, for enwik8)."""
    files = {s: (f"{name}/{name}.zip!{name}", f"{name}/{name}") for s in ("train", "valid", "test")}
    archive = Resource(f"http://mattmahoney.net/dc/{name}.zip", f"{name}.zip", size=archive_size,
                       members=(Member(name, None, sha256, 100_000_000),))
    return DatasetSpec(name, title, name, name, files, (archive,), license="Wikipedia text, CC BY-SA / GFDL",
                       notes=notes)


_PTB_RES = Resource(
    _PTB_URL,
    "simple-examples.tgz",
    members=tuple(Member(f"simple-examples/data/ptb.{s}.txt", f"ptb.{s}.txt", _PTB_SHA[s]) for s in _PTB_SHA),
)
_WT2_RES = Resource(
    _WT2_URL,
    "wikitext-2-v1.zip",
    sha256=_WT2_ZIP_SHA,
    members=tuple(Member(f"wikitext-2/wiki.{s}.tokens", f"wiki.{s}.tokens", _WT2_SHA[s]) for s in _WT2_SHA),
    mirrors=(f"{_WT_MIRROR}/wikitext-2-v1.zip",),
)


def _wt_hub(name: str, shards: int) -> HubSource:
    """The Parquet layout of ``Salesforce/wikitext``: CONFIG/{train,validation,test}-0000i-of-0000n.parquet."""
    config = f"{name}-v1"
    splits = []
    for split, hub_split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        n = shards if split == "train" else 1
        files = tuple(f"{config}/{hub_split}-{i:05d}-of-{n:05d}.parquet" for i in range(n))
        known = _WT2_SHA if name == "wikitext-2" else {}
        splits.append(HubSplit(f"wiki.{split}.tokens", files, _WT_LINES[name][split], _WT_TOKENS[name][split],
                               sha256=known.get(split), sha1=_WT103_SHA1[split] if name == "wikitext-103" else None))
    return HubSource(_WT_HUB_REPO, _WT_HUB_REV, config, tuple(splits))


_WT2_HUB = _wt_hub("wikitext-2", 1)
_PTB_FILES = _split_files("ptb/ptb.{split}.txt", "penn/{split}.txt")
_WT2_FILES = _split_files("wikitext-2/wiki.{split}.tokens", "wikitext-2/{split}.txt")
_WT_LICENSE = "CC BY-SA 3.0 (Merity et al. 2016, text from Wikipedia)"
_PTB_LICENSE = "Penn Treebank (LDC99T42) derived; research use"

DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "ptb",
            "Penn Treebank (Mikolov)",
            "word",
            "ptb",
            _PTB_FILES,
            (_PTB_RES,),
            lower=True,
            aliases=("penn", "penntreebank"),
            license=_PTB_LICENSE,
            notes="10k vocabulary, <eos> per line, lower-cased; vocab counts train+valid+test",
        ),
        DatasetSpec(
            "wt2",
            "WikiText-2 (v1, tokenized)",
            "word",
            "wikitext-2",
            _WT2_FILES,
            (_WT2_RES,),
            embedded="wikitext-2",
            aliases=("wikitext-2", "wikitext2"),
            hub=_WT2_HUB,
            license=_WT_LICENSE,
            notes="33,278 vocabulary, <eos> per line; falls back to the copy embedded in the package",
        ),
        DatasetSpec(
            "wt2-char",
            "WikiText-2 characters",
            "char",
            "wikitext-2",
            _WT2_FILES,
            (_WT2_RES,),
            embedded="wikitext-2",
            aliases=("wikitext-2-char",),
            hub=_WT2_HUB,
            license=_WT_LICENSE,
            notes="characters of each stripped line of WikiText-2 (spaces are symbols) + <eos> per line",
        ),
        DatasetSpec(
            "ptb-char",
            "Penn Treebank characters",
            "char",
            "ptb",
            _PTB_FILES,
            (_PTB_RES,),
            lower=True,
            license=_PTB_LICENSE,
            notes="characters of each stripped line of word-level PTB + <eos> per line (not ptb.char)",
        ),
        DatasetSpec(
            "wt103",
            "WikiText-103 (v1, tokenized)",
            "word",
            "wikitext-103",
            _split_files("wikitext-103/wiki.{split}.tokens", "wikitext-103/{split}.txt"),
            (
                Resource(
                    f"{_WT_S3}/wikitext-103-v1.zip",
                    "wikitext-103-v1.zip",
                    sha256=_WT103_ZIP_SHA,
                    size=190_229_076,  # the download size of the HF dataset card
                    members=tuple(
                        Member(f"wikitext-103/wiki.{s}.tokens", f"wiki.{s}.tokens") for s in ("train", "valid", "test")
                    ),
                    mirrors=(f"{_WT_MIRROR}/wikitext-103-v1.zip",),
                ),
            ),
            hub=_wt_hub("wikitext-103", 2),
            count_splits=("train",),
            aliases=("wikitext-103", "wikitext103"),
            license=_WT_LICENSE,
            notes="267,735 vocabulary counted on train only, <eos> per line",
        ),
        _mahoney("enwik8", "enwik8 (Hutter Prize)", ENWIK8_SHA256, 36_445_475,
                 "bytes; last 2x5M are valid/test; newline bytes dropped (official scripts); 204 symbols"),
        # No checksum of text8.zip or text8 is published in shared/data/README.md: the member is verified by its
        # size (10^8 characters) only.
        _mahoney("text8", "text8", None, None, "characters a-z and '_' (space); last 2x5M are valid/test; 27 symbols"),
        DatasetSpec(
            "lm1b",
            "One Billion Word",
            "lm1b",
            "lm1b",
            {
                "train": (f"lm1b/{LM1B_TRAIN_GLOB}",),
                "valid": (f"lm1b/{LM1B_HELDOUT}",),
                "test": (f"lm1b/{LM1B_HELDOUT}",),
            },
            (
                Resource(
                    "http://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz",
                    "1-billion-word-language-modeling-benchmark-r13output.tar.gz",
                    extract_all=True,  # no published checksum known here
                ),
                Resource("https://github.com/rafaljozefowicz/lm/raw/master/1b_word_vocab.txt", "1b_word_vocab.txt"),
            ),
            aliases=("1b", "one-billion-word", "lm1b-word"),
            license="WMT11 news text; see statmt.org/lm-benchmark",
            notes="793,471-symbol vocabulary file; <S> w.. <S> per sentence; valid = test = heldout-00000 "
            "as the official getdata.sh",
            extra_files={"vocab": "lm1b/1b_word_vocab.txt"},
        ),
    )
}

_ALIASES = {alias: spec.name for spec in DATASETS.values() for alias in (spec.name, *spec.aliases)}


def dataset_aliases() -> set[str]:
    """Every name a built-in dataset answers to (canonical names and aliases, lower case)."""
    return set(_ALIASES)


def known_datasets() -> list[str]:
    """Canonical names of the built-in datasets."""
    return sorted(DATASETS)


def get_spec(name: str) -> DatasetSpec:
    """The spec of a dataset name or alias (case-insensitive), or a :class:`DataError` listing known names."""
    key = _ALIASES.get(name.lower())
    if key is None:
        raise DataError(
            f"unknown dataset {name!r}; known: {', '.join(known_datasets())} (or a path to your own text files)"
        )
    return DATASETS[key]


def find_resource(spec: DatasetSpec, filename: str) -> tuple[Resource, Member | None] | None:
    """The download (and archive member) that provides ``filename`` of ``spec``'s folder."""
    for res in spec.resources:
        if res.filename == filename:
            return res, None
        for m in res.members:
            if m.dest == filename:
                return res, m
    for res in spec.resources:
        if res.extract_all:
            return res, None
    return None
