"""The model's methods reach the layers above it through transformer_xl.hooks, which the package root binds."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.helpers import REPO, subprocess_env, tiny_model
from transformer_xl import hooks


def test_the_root_binds_the_layers_and_a_binding_can_be_replaced() -> None:
    bound = hooks.layers()
    assert type(bound).__module__ == "transformer_xl"

    class Fake:
        def generate(self, model, input_ids, **kwargs):
            return ("generate", input_ids, kwargs)

        def stream(self, model, input_ids, **kwargs):
            return iter([("stream", kwargs)])

        def pretrained_dir(self, name, revision):
            return None

    previous = hooks.bind(Fake())
    try:
        model = tiny_model()
        assert model.generate([1, 2], top_k=3) == ("generate", [1, 2], {"max_new_tokens": 100, "top_k": 3})
        assert list(model.stream([1], max_new_tokens=2)) == [("stream", {"max_new_tokens": 2})]
    finally:
        assert hooks.bind(previous) is not None
    assert hooks.layers() is bound


def test_unbound_layers_are_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(hooks, "_bound", None)
    with pytest.raises(RuntimeError, match="no layers bound"):
        tiny_model().generate(torch.tensor([[1]]))


@pytest.mark.integration
def test_importing_the_model_loads_neither_inference_nor_the_hub(tmp_path) -> None:
    """The binding is lazy: the model layer alone imports no upper layer (nor huggingface_hub) until a method
    needs it."""
    code = ("import sys, transformer_xl.model; "
            "print(sorted(m for m in sys.modules if m.startswith(('transformer_xl.inference', "
            "'transformer_xl.interop', 'huggingface_hub'))))")
    out = subprocess.run([sys.executable, "-c", code], env=subprocess_env(tmp_path), capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
