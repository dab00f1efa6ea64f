"""The vanilla sliding-window evaluation (Al-Rfou et al.): one forward per window, stride 1, exactly the window."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import TINY
from tests.helpers import eval_model as _model
from tests.helpers import token_data as _data
from transformer_xl.errors import ConfigError
from transformer_xl.inference.window import evaluate_sliding_window, sliding_window_nll

V = TINY["n_token"]


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_sliding_window_equals_one_forward_per_window(attn_type) -> None:
    model, data, window = _model(attn_type), _data(80), 8
    got = sliding_window_nll(model, data, window=window, first=1, last=60, rows=5)
    with torch.no_grad():
        no_mem = model.config.lengths(mem_len=0, same_length=False)
        naive = [model(torch.tensor(data[max(0, t - window) : t])[None], torch.tensor(data[t : t + 1])[None],
                       lengths=no_mem).nll.item() for t in range(1, 60)]
    np.testing.assert_allclose(got, naive, rtol=1e-5, atol=1e-6)


def test_sliding_window_sees_exactly_the_window() -> None:
    """Changing a token just outside the window changes nothing; just inside, the prediction changes."""
    model, data, window = _model(0), _data(60), 6
    t = 40
    a = sliding_window_nll(model, data, window=window, first=t, last=t + 1)
    outside, inside = data.copy(), data.copy()
    outside[t - window - 1] = (outside[t - window - 1] + 1) % V
    inside[t - window] = (inside[t - window] + 1) % V
    assert sliding_window_nll(model, outside, window=window, first=t, last=t + 1)[0] == a[0]
    assert sliding_window_nll(model, inside, window=window, first=t, last=t + 1)[0] != a[0]


def test_sliding_window_errors_and_whole_split() -> None:
    model = _model(3, tgt_len=8)
    with pytest.raises(ConfigError, match="learned 8 positions"):
        sliding_window_nll(model, _data(), window=9)
    res = evaluate_sliding_window(_model(2), _data(40), window=8, return_nll=True)
    assert res.tokens == 39 and res.unscored == 1 and np.isnan(res.nll[0])
