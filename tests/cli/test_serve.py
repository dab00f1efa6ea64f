"""txl serve: the command a user runs, answering the openai client; one-line refusals."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers import one_line_error, subprocess_env
from transformer_xl.cli import main

pytest.importorskip("fastapi")


def test_serve_refuses_a_public_address_without_a_key(tmp_path, capsys, monkeypatch) -> None:
    from tests.serve.conftest import save_served_model

    monkeypatch.delenv("TXL_API_KEY", raising=False)
    model_dir = save_served_model(tmp_path)
    assert main(["serve", str(model_dir), "--host", "0.0.0.0"]) == 2
    assert "--allow-no-key" in one_line_error(capsys, "txl serve: error: ")
    assert main(["serve", str(tmp_path / "missing")]) != 0
    capsys.readouterr()
    assert main(["serve", str(model_dir), "--max-batch", "0"]) == 2
    assert "--max-batch" in capsys.readouterr().err


@pytest.mark.integration
def test_txl_serve_answers_the_openai_client_and_logs_each_request(tmp_path) -> None:
    openai = pytest.importorskip("openai")
    from tests.serve.conftest import save_served_model

    model_dir = save_served_model(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "transformer_xl", "serve", str(model_dir), "--port", "0",
                             "--model-name", "tiny"], stderr=subprocess.PIPE, text=True, env=subprocess_env(tmp_path))
    try:
        line = ""
        while "serving" not in line:
            line = proc.stderr.readline()
            assert line, "txl serve exited before listening"
        url = re.search(r"http://[\d.]+:\d+", line).group(0)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        out = client.completions.create(model="tiny", prompt="the cat", max_tokens=5, temperature=0)
        assert out.usage.completion_tokens == 5
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="tiny", prompt="the cat", max_tokens=-1)
        log_lines = [proc.stderr.readline() for _ in range(2)]
        assert "POST /v1/completions 200" in log_lines[0] and "2+5 tokens" in log_lines[0]
        assert "POST /v1/completions 400" in log_lines[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
