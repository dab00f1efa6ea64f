"""txl: Transformer-XL (Dai et al., ACL 2019) as an installable library.

Public API::

    from txl import TXLConfig, TransformerXLLM
    model = TransformerXLLM(TXLConfig(n_token=204, n_layer=4, n_head=4, d_model=64, d_head=16, d_inner=256))
    out = model(input_ids, targets=targets, mems=mems)   # out.nll, out.loss, out.mems
"""

__version__ = "0.1.0"

from txl.config import TXLConfig
from txl.errors import CheckpointError, ConfigError, DataError, TXLError
from txl.model import LMOutput, TransformerXLLM

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "LMOutput",
    "TXLConfig",
    "TXLError",
    "TransformerXLLM",
    "__version__",
]
