"""``txl serve``: an OpenAI-compatible completions server whose sessions keep a Transformer-XL memory.

===============  ==================================================================================
module           what it holds
===============  ==================================================================================
``protocol``     the completions protocol: request checking, error objects, response objects
``sessions``     :class:`SessionStore`: memories kept between requests (LRU, idle timeout)
``engine``       :class:`Engine`: one thread decoding every running request, one-token steps batched
``completions``  prompts to ids, engine events to responses and server-sent events
``tokens``       the tokenizer routes' work (``/tokenize``, ``/detokenize``, ``/tokenizer_info``, as vLLM's)
``guard``        pure-ASGI guards: Host and Origin, API keys, request bodies (JSON only, bounded in size and time)
``app``          the FastAPI routes behind the guards, one log line per request
``server``       loading a model, binding a socket, running uvicorn within its bounds
===============  ==================================================================================

Needs the ``serve`` extra (``pip install -e '.[serve]'`` in the checkout: FastAPI and uvicorn); ``protocol``,
``sessions`` and ``engine`` do not.
"""
