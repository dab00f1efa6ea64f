"""Other tools reaching txl models: :mod:`transformer_xl.integrations.harness` is the ``transformer-xl`` backend of
EleutherAI's lm-evaluation-harness (the ``eval`` extra; the core package does not need it), and
:mod:`transformer_xl.integrations.rl` is TorchRL's recurrent-module interface over the GTrXL sequence module
(the ``rl`` extra).

This layer sits above :mod:`transformer_xl.inference` (it scores and generates through it) and beside
:mod:`transformer_xl.train`: nothing in the package imports it.
"""
