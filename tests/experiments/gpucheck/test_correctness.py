"""Part a of the GPU check: its comparisons catch a path that computes other numbers, and the suite's GPU tests
are counted as pytest ran them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from transformer_xl.experiments.gpucheck import correctness as corr
from transformer_xl.experiments.gpucheck.options import CheckOptions
from transformer_xl.model import TransformerXLLM

GPU_MARK = "mark." + "gpu"  # spelled apart: this file must not be one of the files the check runs with -m gpu


def _opts(tmp_path: Path, **kw) -> CheckOptions:
    return CheckOptions(device="cpu", tiny=True, out_dir=tmp_path, log=lambda _: None, **kw)


def test_rel_err() -> None:
    assert corr.rel_err(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])) == 0.5
    assert corr.rel_err(torch.zeros(2), torch.zeros(2)) == 0.0


def test_every_case_is_a_valid_config_at_both_sizes() -> None:
    for name in corr.CASES:
        for tiny in (True, False):
            cfg, batch = corr.case_config(name, tiny)
            assert cfg.dropout == cfg.dropatt == 0.0 and batch >= 2
    assert {corr.case_config(n, True)[0].attn_type for n in corr.CASES} == {0, 1, 2, 3}


def _perturbing_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """``reference()`` that also changes the first layer's attention weights by 1 %: a "plain path" that computes
    other numbers."""
    real = TransformerXLLM.reference

    def reference(self: TransformerXLLM, enabled: bool = True) -> None:
        real(self, enabled)
        with torch.no_grad():
            for p in self.layers[0].dec_attn.parameters():
                p.mul_(1.01)

    monkeypatch.setattr(TransformerXLLM, "reference", reference)


def test_forward_and_gradient_comparisons_pass_and_catch_a_wrong_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(corr, "CASES", {"attn0 adaptive": {}, "attn3": {"attn_type": 3}})
    opts = _opts(tmp_path)
    assert all(r["ok"] for r in corr.forward_agreement(opts) + corr.attention_paths_gradients(opts))
    _perturbing_reference(monkeypatch)
    fwd = corr.forward_agreement(opts)
    assert [r["ok"] for r in fwd] == [False, False] and all(r["against"] == "reference" for r in fwd)
    assert all(r["fp32_logprob_rel"] > corr.FP32_TOL for r in fwd)
    grads = corr.attention_paths_gradients(opts)
    assert [r["ok"] for r in grads] == [False, False] and all(r["worst_rel"] > corr.GRAD_TOL for r in grads)


class _DeviceIsCpu(CheckOptions):
    """Options that take the device branch (``cuda``) with the CPU as the device: the code a GPU run takes."""

    @property
    def cuda(self) -> bool:
        return True


def test_the_device_branch_compares_against_the_cpu(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(corr, "CASES", {"attn1": {"attn_type": 1}})
    opts = _DeviceIsCpu(device="cpu", tiny=True, out_dir=tmp_path, log=lambda _: None)
    (row,) = corr.forward_agreement(opts)
    assert row["against"] == "cpu" and row["ok"] and row["fp32_logprob_rel"] == 0.0  # the same device: equal


def test_mixed_precision_training_steps(tmp_path: Path) -> None:
    rows = corr.amp_training(_opts(tmp_path), steps=4)
    assert [r["precision"] for r in rows] == ["fp16 + GradScaler", "bf16"]
    assert all(r["ok"] and len(r["losses"]) == 4 for r in rows)
    assert rows[0]["scale"] == 65536.0 and rows[1]["scale"] is None


def test_gpu_test_files_and_junit_counts(tmp_path: Path) -> None:
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "sub" / "test_g.py").write_text(f"import pytest\n@pytest.{GPU_MARK}\ndef test_x(): pass\n")
    (tmp_path / "tests" / "test_cpu.py").write_text("def test_y(): pass\n")
    (tmp_path / "tests" / "helper.py").write_text(f"# {GPU_MARK}\n")
    assert corr.gpu_test_files(tmp_path) == [tmp_path / "tests" / "sub" / "test_g.py"]
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="t" name="a"/><testcase classname="t" name="b">'
                   '<failure message="x"/></testcase><testcase classname="t" name="c"><skipped/></testcase>'
                   '<testcase classname="u" name="d"><error/></testcase><testcase classname="u" name="e">'
                   '<failure/></testcase></testsuite></testsuites>')
    assert corr.junit_counts(xml) == {"passed": 1, "failed": 2, "errors": 1, "skipped": 1,
                                      "failures": ["t::b", "u::d", "u::e"]}


def _fake_repo(root: Path, body: str) -> None:
    (root / "tests").mkdir(parents=True)
    (root / "src").mkdir()
    (root / "tests" / "test_dev.py").write_text(f"import pytest\nimport time\n\n{body}")


@pytest.mark.integration
def test_pytest_gpu_counts_a_failure(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "repo"
    _fake_repo(root, f"@pytest.{GPU_MARK}\ndef test_ok(): pass\n\n@pytest.{GPU_MARK}\ndef test_bad(): assert False\n\n"
               f"@pytest.{GPU_MARK}\ndef test_skip(): pytest.skip('no CUDA')\n\ndef test_not_gpu(): assert False\n")
    monkeypatch.setattr(corr, "repo_root", lambda: root)
    res = corr.gpu_tests(_opts(tmp_path), cap=60)
    assert res["status"] == "failed" and res["files"] == ["tests/test_dev.py"]
    assert (res["passed"], res["failed"], res["errors"], res["skipped"]) == (1, 1, 0, 1)
    assert res["failures"] == ["tests.test_dev::test_bad"] and res["checks"][0]["ok"] is False


@pytest.mark.integration
def test_pytest_gpu_past_its_cap_is_stopped(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "repo"
    _fake_repo(root, f"@pytest.{GPU_MARK}\ndef test_slow(): time.sleep(60)\n")
    monkeypatch.setattr(corr, "repo_root", lambda: root)
    start = time.monotonic()
    res = corr.gpu_tests(_opts(tmp_path), cap=4)
    assert res["status"] == "timed_out" and res["checks"][0]["ok"] is False
    assert time.monotonic() - start < 15


def test_no_tests_directory_is_no_tests(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(corr, "repo_root", lambda: tmp_path)
    assert corr.gpu_tests(_opts(tmp_path), cap=10) == {"status": "no tests", "files": [], "checks": []}


def test_a_step_that_raises_is_one_failed_check_and_the_others_are_kept(tmp_path, monkeypatch) -> None:
    """A kernel the device refuses in one step of part a fails that step alone: the forward rows and the training
    rows computed around it stay in the part's result."""
    def refuses(opts):
        raise RuntimeError("the device refused\nmore")

    monkeypatch.setattr(corr, "attention_paths_gradients", refuses)
    monkeypatch.setattr(corr, "gpu_tests", lambda opts, cap: {"status": "ok", "checks": []})
    out = corr.run(_opts(tmp_path))
    assert out["forward"] and out["amp_training"] and out["gradients"] == []
    failed = [c for c in out["checks"] if not c["ok"]]
    assert failed == [{"name": "gradients ran", "ok": False, "error": "RuntimeError: the device refused"}]
