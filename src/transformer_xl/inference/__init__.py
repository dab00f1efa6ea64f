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
==============  =================================================================================
"""
