"""Other libraries' formats: the official PyTorch code (:mod:`~transformer_xl.interop.official`), Hugging Face's
TransfoXL (:mod:`~transformer_xl.interop.hf`, :mod:`~transformer_xl.interop.hf_vocab`), and reading their state dicts
without
unpickling code (:mod:`~transformer_xl.interop.state_dicts`)."""
