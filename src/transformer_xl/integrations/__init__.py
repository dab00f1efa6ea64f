"""Other tools reaching txl models: :mod:`transformer_xl.integrations.harness` is the ``transformer-xl`` backend of
EleutherAI's lm-evaluation-harness (the ``eval`` extra; the core package does not need it), and
:mod:`transformer_xl.integrations.rl` is TorchRL's recurrent-module interface over the GTrXL sequence module
(the ``rl`` extra), and :mod:`transformer_xl.integrations.hf` gives transformers 5's Auto classes txl models (the
``hf`` extra; :mod:`transformer_xl.hf` registers them).

This layer sits above :mod:`transformer_xl.inference` (it scores and generates through it) and beside
:mod:`transformer_xl.train`: nothing in the package imports it but :mod:`transformer_xl.hf`.
"""
