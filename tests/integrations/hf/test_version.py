"""transformers 5 or later, or one line saying how to get it."""

from __future__ import annotations

import sys

import pytest

transformers = pytest.importorskip("transformers", minversion="5.17")

from transformer_xl import ConfigError  # noqa: E402
from transformer_xl.integrations.hf.version import check_transformers  # noqa: E402


def test_transformers_4_or_none_is_refused_in_one_line(monkeypatch) -> None:
    assert check_transformers() == transformers.__version__
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.57.6")
    with pytest.raises(ConfigError, match=r"needs transformers >= 5.17 \(found 4.57.6; transformers 4 has its own"):
        check_transformers()
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.3.0")
    with pytest.raises(ConfigError, match=r"needs transformers >= 5.17 \(found 5.3.0\): pip install"):
        check_transformers()
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "5.17.0.dev0")
    assert check_transformers() == "5.17.0.dev0"
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ConfigError, match=r"needs Hugging Face transformers >= 5.17: pip install -e '.\[hf\]'"):
        check_transformers()


def test_the_registration_checks_each_auto_class_and_a_refusal_is_one_line(monkeypatch) -> None:
    """A future transformers may refuse ``"transfo-xl"`` (a removed model type) or not let ``register`` replace a
    name it knows: both are one line naming the fallback, and the resolution itself is checked, not assumed."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from transformer_xl.integrations import hf

    assert hf._registered()
    hf.register()  # again: nothing to do
    monkeypatch.setitem(MODEL_FOR_CAUSAL_LM_MAPPING._extra_content, hf.TransfoXLConfig, AutoModelForCausalLM)
    assert not hf._registered()  # the model class resolved to another one is seen
    monkeypatch.undo()
    monkeypatch.setattr(hf, "_registered", lambda: False)
    fallback = r"load them with transformer_xl\.hf\.TransfoXLForCausalLM\.from_pretrained and TransfoXLTokenizer"

    def removed(*args, **kwargs):
        raise ValueError("model type 'transfo-xl' was removed from transformers\nsee the docs")

    with monkeypatch.context() as m:
        m.setattr(AutoConfig, "register", removed)
        with pytest.raises(ConfigError, match=rf"^transformers {transformers.__version__} refuses to register it "
                                              rf"\(model type 'transfo-xl' was removed from transformers\) for "
                                              rf"model_type 'transfo-xl': the Auto classes .*{fallback}"):
            hf.register()
    with pytest.raises(ConfigError, match=rf"registered it, but its Auto classes resolve it to another.*{fallback}"):
        hf.register()  # registered, and still not resolved


def test_with_the_registration_refused_the_import_warns_once_and_the_classes_load(tmp_path) -> None:
    """The documented fallback, in a process whose transformers refuses the registration."""
    import subprocess

    from tests.helpers import subprocess_env, tiny_model
    from transformer_xl.integrations.hf import TransfoXLConfig, TransfoXLForCausalLM

    model = tiny_model(3)
    TransfoXLForCausalLM(TransfoXLConfig.from_txl(model.config), model=model).save_pretrained(tmp_path / "m")
    code = ("import transformers\n"
            "def removed(*a, **k): raise ValueError('model type transfo-xl was removed')\n"
            "transformers.AutoConfig.register = removed\n"
            "import transformer_xl.hf as hf\n"
            f"m = hf.TransfoXLForCausalLM.from_pretrained({str(tmp_path / 'm')!r})\n"
            "print(type(m).__name__, m.config.model_type)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=subprocess_env(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["TransfoXLForCausalLM", "transfo-xl"]
    warned = [line for line in out.stderr.splitlines() if "refuses to register it" in line]
    assert len(warned) == 1 and "TransfoXLForCausalLM.from_pretrained" in warned[0], out.stderr
