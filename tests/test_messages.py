"""A message names what happened: the baseline is announced as the baseline, and a Python warning that the
warnings filter turned into an error is reported as that warning, never as a crash of the config or a GPU."""

import threading
from types import SimpleNamespace

import pytest

from sparse_mla_tuner.db.verdicts import Verdict
from sparse_mla_tuner.kernels.config import KernelConfig
from sparse_mla_tuner.tuner import calibrate
from sparse_mla_tuner.tuner.errors import TunerError
from sparse_mla_tuner.tuner.protocol import WARNING_AS_ERROR
from sparse_mla_tuner.tuner.protocol import MeasureReply
from sparse_mla_tuner.tuner.study import StudyRun

BASELINE = KernelConfig.parse("T16-w4-s2-c4")
OTHER = KernelConfig.parse("T32-w4-s1-c4")


class _Proc:
    def __init__(self, reply: MeasureReply, backend: str) -> None:
        self.reply, self.backend, self.gpu_index = reply, backend, 0
        self.info = {"host": "box", "gpu_name": "cpu"}

    def measure(self, req, timeout_s):
        return self.reply


MEASUREMENT = {"finalists": 3, "finalist_rounds": 7}
SPACE = SimpleNamespace(
    measurement={"trial_timeout_s": 1, "rounds": 5, "finalist_rounds": 5}, adapter=SimpleNamespace(spec="sparse_mla")
)


def test_a_warning_turned_error_is_reported_as_the_warning_not_a_crash():
    reason = f"{WARNING_AS_ERROR}: DeprecationWarning: Conversion of an array with ndim > 0 to a scalar"
    proc = _Proc(MeasureReply(Verdict.CRASHED, reason), "interpreter")
    with pytest.raises(TunerError) as err:
        calibrate.measure(proc, SPACE, None, 1, BASELINE, 6)
    text = str(err.value)
    assert "DeprecationWarning: Conversion of an array" in text and "warnings filter" in text
    assert "crashed" not in text and "GPU" not in text and "pick another" not in text


def test_a_crash_on_the_cpu_names_no_gpu_and_on_cuda_names_the_gpu():
    for backend, want, unwanted in (("interpreter", "interpreter worker 0", "GPU"), ("cuda", "box GPU 0", "worker")):
        proc = _Proc(MeasureReply(Verdict.CRASHED, "RuntimeError: boom"), backend)
        with pytest.raises(TunerError) as err:
            calibrate.measure(proc, SPACE, None, 1, BASELINE, 6)
        assert want in str(err.value) and unwanted not in str(err.value)
        assert "pick another `baseline`" in str(err.value)  # a crash of the baseline itself: another one helps


def test_the_measurement_process_finds_a_warning_inside_a_wrapped_error():
    from sparse_mla_tuner.tuner.measure_main import _warning_in

    try:
        try:
            raise DeprecationWarning("old API")
        except DeprecationWarning as w:
            raise RuntimeError(repr(w)) from w  # as Triton's interpreter wraps it
    except RuntimeError as e:
        found = _warning_in(e)
    assert isinstance(found, DeprecationWarning) and str(found) == "old API"
    assert _warning_in(ValueError("x")) is None


@pytest.mark.parametrize(("cfg", "told", "want"), [
    (BASELINE, None, "baseline T16-w4-s2-c4: 7 more rounds"),
    (OTHER, None, "finalist: T32-w4-s1-c4 is the first ok config, 7 more rounds"),
    (OTHER, 0.9, "finalist: T32-w4-s1-c4 beats all so far, 7 more rounds"),
])  # fmt: skip
def test_the_baseline_is_announced_as_the_baseline(cfg, told, want):
    phases = []
    run = SimpleNamespace(
        plan=SimpleNamespace(space=SimpleNamespace(measurement=MEASUREMENT, baseline=BASELINE)),
        progress=SimpleNamespace(lock=threading.Lock(), bar=SimpleNamespace(phase=phases.append)),
        optuna=SimpleNamespace(record_low=lambda ratio: (told is None, told is None or ratio < told)),
        measurer=SimpleNamespace(finalist=lambda proc, cfg: "reply"),
        records=SimpleNamespace(finalist=lambda proc, trial_id, reply, band: "stat" if reply == "reply" else None),
    )
    assert StudyRun._record_finalist(run, None, 1, cfg, SimpleNamespace(ratio=0.5), 0.01) == "stat"
    assert phases == [want]
