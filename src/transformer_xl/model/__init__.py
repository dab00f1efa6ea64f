"""The Transformer-XL model (paper Sec. 3): pure modules that never touch argparse, files of their own or print.

==================  ===========================================================================================
module              what it holds
==================  ===========================================================================================
``config``          :class:`TXLConfig` (official names, frozen) and the per-forward :class:`Lengths`
``positional``      the four position-encoding strategies (``attn_type`` 0-3), the only reader of ``attn_type``
``memory``          memory update (stop-gradient, ``mem_len``, ``ext_len``) and causal masks (``same_length``)
``attention``       the one multi-head attention over ``[memory; segment]``, feed-forward, decoder layer
``adaptive``        adaptive input embedding, projected adaptive log-softmax, sampled softmax
``segment``         what the layers of one forward share (lengths, mask, position table, cache)
``lm``              :class:`TransformerXLLM` and :class:`LMOutput`
``sequence``        :class:`TransformerXLSequence`: the same layers over vectors, episode resets, GTrXL gates
``gating``          the gates of GTrXL (Parisotto et al., 2020) in place of the residual additions
``dispatch``        the one place that chooses how a step runs: :func:`~transformer_xl.model.dispatch.choose`
``fastpath``        faster implementations of plain formulas (each tested equal to its formula)
``blocked``         evaluation attention over a long memory, the position term formed in blocks
``int8``            int8 linear layers for CPU inference (``TransformerXLLM.quantize``)
``cache``           :class:`InferenceCache`: memory keys/values and ``W_kR R`` reused between segments
``recurrence``      :class:`Recurrence`: memories carried over the segments of one text
``presets``         the paper's architectures and CPU sizes as functions
==================  ===========================================================================================
"""

from transformer_xl.model.cache import InferenceCache
from transformer_xl.model.config import Lengths, TXLConfig
from transformer_xl.model.lm import LMOutput, TransformerXLLM
from transformer_xl.model.recurrence import Recurrence, eval_mode
from transformer_xl.model.sequence import SequenceConfig, SequenceOutput, SequenceState, TransformerXLSequence

__all__ = ["InferenceCache", "LMOutput", "Lengths", "Recurrence", "SequenceConfig", "SequenceOutput", "SequenceState",
           "TXLConfig", "TransformerXLLM", "TransformerXLSequence", "eval_mode"]
