"""Other libraries' formats: the official PyTorch code (:mod:`~transformer_xl.interop.official`), Hugging Face's
TransfoXL (:mod:`~transformer_xl.interop.hf`, :mod:`~transformer_xl.interop.hf_vocab`), reading their state dicts
without unpickling code (:mod:`~transformer_xl.interop.state_dicts`), and models on the Hugging Face Hub
(:mod:`~transformer_xl.interop.hub`); the official TensorFlow code's checkpoints, the paper's released models
(:mod:`~transformer_xl.interop.tf`, :mod:`~transformer_xl.interop.tensorbundle`,
:mod:`~transformer_xl.interop.tf_vocab`); ONNX graphs for ONNX Runtime (:mod:`~transformer_xl.interop.onnx_export`,
:mod:`~transformer_xl.interop.onnx_runtime`)."""

from transformer_xl.interop.hf import from_hf, hf_config_dict, to_hf_state_dict
from transformer_xl.interop.hf_vocab import load_hf_vocab
from transformer_xl.interop.hub import fetch, hub_model_dir, parse_hub_id
from transformer_xl.interop.official import load_official, to_official
from transformer_xl.interop.onnx_export import export_onnx
from transformer_xl.interop.onnx_runtime import OnnxRuntimeLM
from transformer_xl.interop.tensorbundle import TensorBundle
from transformer_xl.interop.tf import load_tf

__all__ = ["OnnxRuntimeLM", "TensorBundle", "export_onnx", "fetch", "from_hf", "hf_config_dict", "hub_model_dir",
           "load_hf_vocab", "load_official", "load_tf", "parse_hub_id", "to_hf_state_dict", "to_official"]
