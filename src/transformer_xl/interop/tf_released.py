"""The paper's four released TensorFlow models (``tf/sota/download.sh``): where they are, their architecture
(``tf/sota/*.sh``; the vocabulary sizes of the corpora), the paper's figure, and the evaluation settings the paper
used for each (``tf/sota/*.sh``), which ``txl convert --from tf`` writes into a converted model's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformer_xl.model import TXLConfig

#: The TF code's LayerNorm epsilon (``tf.contrib.layers.layer_norm``).
TF_LAYER_NORM_EPS = 1e-12


@dataclass(frozen=True)
class Released:
    """One of the paper's released TensorFlow models (``tf/sota/download.sh``, evaluated by ``tf/sota/*.sh``)."""

    dataset: str
    folder: str  # under the download root
    metric: str
    paper: float  # the paper's test figure (Tables 1-4)
    tgt_len: int
    mem_len: int
    clamp_len: int
    same_length: bool = True
    model: tuple[tuple[str, Any], ...] = ()  # the architecture (tf/sota/*.sh), for estimates before a download

    def config(self) -> TXLConfig:
        """The released model's :class:`TXLConfig`, as ``txl convert --from tf`` writes it."""
        return TXLConfig(**dict(self.model), tie_weight=True, layer_norm_epsilon=TF_LAYER_NORM_EPS, tf_memory=True,
                         tgt_len=self.tgt_len, mem_len=self.mem_len, clamp_len=self.clamp_len,
                         same_length=self.same_length)


def _arch(n_token: int, n_layer: int, d_model: int, n_head: int, d_head: int, d_inner: int, *,
          cutoffs: tuple[int, ...] = (), div_val: int = 1, tie_projs: tuple[bool, ...] = (False,),
          untie_r: bool = False) -> tuple[tuple[str, Any], ...]:
    return (("n_token", n_token), ("n_layer", n_layer), ("d_model", d_model), ("n_head", n_head),
            ("d_head", d_head), ("d_inner", d_inner), ("d_embed", d_model), ("cutoffs", cutoffs),
            ("div_val", div_val), ("tie_projs", tie_projs), ("untie_r", untie_r))


#: The four released models, their architecture (``tf/sota/*.sh``; the vocabulary sizes of the corpora) and the
#: paper's evaluation settings for each.
RELEASED: dict[str, Released] = {
    "enwik8": Released("enwik8", "tf_enwik8", "bpc", 0.99, tgt_len=128, mem_len=3800, clamp_len=1000,
                       model=_arch(204, 24, 1024, 8, 128, 3072)),
    "text8": Released("text8", "tf_text8", "bpc", 1.08, tgt_len=128, mem_len=3800, clamp_len=1000,
                      model=_arch(27, 24, 1024, 8, 128, 3072)),
    "wt103": Released("wt103", "tf_wt103", "ppl", 18.3, tgt_len=128, mem_len=1600, clamp_len=1000,
                      model=_arch(267735, 18, 1024, 16, 64, 4096, cutoffs=(20000, 40000, 200000), div_val=4,
                                  tie_projs=(False, True, True, True), untie_r=True)),
    "lm1b": Released("lm1b", "tf_lm1b", "ppl", 21.8, tgt_len=32, mem_len=128, clamp_len=-1,
                     model=_arch(793471, 24, 1280, 16, 80, 8192, cutoffs=(60000, 100000, 640000), div_val=4,
                                 tie_projs=(False, False, False, False), untie_r=True)),
}
#: ``proj_same_dim`` of each released model (One Billion Word's leaves its first cluster unprojected).
PROJ_SAME_DIM = {"enwik8": True, "text8": True, "wt103": True, "lm1b": False}
#: The download root of ``tf/sota/download.sh``: ``URL/<folder>/data/{cache.pkl,corpus-info.json}`` and
#: ``URL/<folder>/model/{checkpoint,model.ckpt-*}``.
RELEASE_URL = "http://curtis.ml.cmu.edu/datasets/pretrained_xl"
#: Lengths of a checkpoint whose dataset is unknown (no ``data/``, no ``--preset``): the training lengths of the
#: TF scripts' base models.
GENERIC_LENGTHS = {"tgt_len": 128, "mem_len": 128, "clamp_len": -1, "same_length": False}


def lengths_for(dataset: str | None) -> dict[str, Any]:
    """The config lengths a converted model gets: the paper's evaluation settings of a released dataset, else
    :data:`GENERIC_LENGTHS`."""
    r = RELEASED.get(dataset or "")
    if r is None:
        return dict(GENERIC_LENGTHS)
    return {"tgt_len": r.tgt_len, "mem_len": r.mem_len, "clamp_len": r.clamp_len, "same_length": r.same_length}
