"""``txl serve``: an OpenAI-compatible completions server whose sessions keep a Transformer-XL memory.

===============  ==================================================================================
module           what it holds
===============  ==================================================================================
``protocol``     the completions protocol: request checking, error objects, response objects
``sessions``     :class:`SessionStore`: memories kept between requests (LRU, idle timeout)
``engine``       :class:`Engine`: one thread decoding every running request, one-token steps batched
``completions``  prompts to ids, engine events to responses and server-sent events
``app``          the FastAPI routes, the API key check, one log line per request
``server``       loading a model, binding a socket, running uvicorn
===============  ==================================================================================

Needs the ``serve`` extra (``pip install -e '.[serve]'`` in the checkout: FastAPI and uvicorn); ``protocol``,
``sessions`` and ``engine`` do not.
"""
