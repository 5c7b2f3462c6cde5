"""The compile for the search's own GPU runs in the background while the first level measures
(`tuner.feasibility.BackgroundWarm`): it finishes on its own, or is stopped with no process left behind."""

import os
import time

from sparse_mla_tuner.kernels import KernelConfig
from sparse_mla_tuner.kernels import Workload
from sparse_mla_tuner.tuner.feasibility import BackgroundWarm

V4 = Workload("fp8_model1", heads=16, topk=512, page_size=64, context=8192)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_background_compile_finishes_and_reports_its_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    configs = [KernelConfig.parse("T16-w4-s1-c256"), KernelConfig.parse("T16-w4-s1-c512")]  # one binary
    bg = BackgroundWarm(configs, V4, 90)
    bg.thread.join(timeout=300)
    assert bg.done() and bg.seconds is not None and bg.seconds > 0
    assert bg.errors == []
    assert any(p.is_file() for p in (tmp_path / "triton").rglob("*.cubin"))  # what the measurement process reads


def test_closing_a_background_compile_stops_its_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    configs = [KernelConfig.parse(k) for k in ("T16-w4-s1-c256", "T32-w4-s1-c256", "T64-w8-s1-c256")]
    bg = BackgroundWarm(configs, V4, 90)
    deadline = time.monotonic() + 60
    while bg.proc is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert bg.proc is not None, "the compile process did not start"
    pid = bg.proc.pid
    bg.close()
    assert bg.done()
    assert not _alive(pid)
    assert bg.errors and "background compile" in bg.errors[0]  # stopped: the search does not wait for it
    assert os.environ.get("TUNER_COMPILE_JOBS") is None  # its core count went to its own process only
