"""Training checkpoints: step directories without pickle, SHA-256 manifests, corruption detected."""

from __future__ import annotations

import json

import torch

from txl.store.checkpoint import join_tensors, split_tensors


def test_split_join_tensors_round_trip() -> None:
    state = {"a": torch.arange(3.0), "b": [torch.tensor(2.0), {"c": 1, 5: torch.ones(2, 2)}], "d": None}
    meta, tensors = split_tensors(state)
    json.dumps(meta)
    back = join_tensors(json.loads(json.dumps(meta)), tensors)
    assert back["b"][0].shape == () and back["b"][1][5].equal(torch.ones(2, 2)) and back["b"][1]["c"] == 1
