"""Other libraries' formats: the official PyTorch code (:mod:`~txl.interop.official`), Hugging Face's
TransfoXL (:mod:`~txl.interop.hf`, :mod:`~txl.interop.hf_vocab`), and reading their state dicts without
unpickling code (:mod:`~txl.interop.state_dicts`)."""
