"""Using a trained model: evaluation with memory (official ``eval.py``), the vanilla sliding-window baseline,
incremental generation with the memory as cache, and text in and out.

==============  =================================================================================
module          what it holds
==============  =================================================================================
``evaluate``    :func:`evaluate` (loss/ppl/bpc with memory), memory sweeps, :class:`EvalResult`
``window``      the vanilla sliding window of Al-Rfou et al. (stride 1, no memory)
``sampling``    greedy choice, temperature, top-k and top-p filtering
``generate``    :func:`generate` / :func:`stream`: one forward per new token over cached memories
``text``        :func:`stream_text`: prompt text in, detokenized text out as it becomes final
``loading``     the model behind a model/checkpoint/run directory, and its vocabulary
==============  =================================================================================
"""

from transformer_xl.inference.evaluate import EvalResult, evaluate
from transformer_xl.inference.generate import GenerationOutput, GenerationStep, generate, stream
from transformer_xl.inference.loading import load_model, load_vocab
from transformer_xl.inference.text import stream_text

__all__ = ["EvalResult", "GenerationOutput", "GenerationStep", "evaluate", "generate", "load_model", "load_vocab",
           "stream", "stream_text"]
