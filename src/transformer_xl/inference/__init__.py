"""Using a trained model: evaluation with memory (official ``eval.py``), the vanilla sliding-window baseline,
incremental generation with the memory as cache, and text in and out.

==============  =================================================================================
module          what it holds
==============  =================================================================================
``evaluate``    :func:`evaluate` (loss/ppl/bpc with memory), memory sweeps, :class:`EvalResult`
``window``      the vanilla sliding window of Al-Rfou et al. (stride 1, no memory)
``sampling``    greedy choice, temperature, top-k and top-p filtering
``generate``    :func:`generate` / :func:`stream`: one forward per new token over cached memories
``decode``      the one-token step as one static-shape function over packed weights and a key/value ring
``captured``    :class:`CapturedDecoder`: that step compiled once per model shape, over fixed buffers
``text``        :func:`stream_text`: prompt text in, detokenized text out as it becomes final
``loading``     the model behind a model/checkpoint/run directory, and its vocabulary
``lines``       :class:`LineEncoder`: a line of text as the corpus preparation turned it into ids
``score``       :func:`score_text`: the log-probability of every token of each line or document
==============  =================================================================================

The functions stay in their modules (``transformer_xl.inference.generate.generate``; the model's own
``model.generate`` / ``model.stream`` call them): a name here would hide the module of the same name.
"""

from transformer_xl.inference.evaluate import EvalResult
from transformer_xl.inference.generate import GenerationOutput, GenerationStep
from transformer_xl.inference.lines import LineEncoder
from transformer_xl.inference.loading import load_model, load_vocab
from transformer_xl.inference.score import ScoredText, score_text

__all__ = ["EvalResult", "GenerationOutput", "GenerationStep", "LineEncoder", "ScoredText", "load_model", "load_vocab",
           "score_text"]
