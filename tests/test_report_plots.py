"""Plots a reader would rather look at than read: every title names the workload and the device, the levers
plot shows measurements (not stand-ins) in most of its cells, and the median plot carries FlashMLA where a
same-run benchmark of that device and call is given."""

import json
import math
import shutil
from pathlib import Path

import pytest

from sparse_mla_tuner.db.store import Store
from sparse_mla_tuner.tuner.adapters.sparse_mla.report import load_bench
from sparse_mla_tuner.tuner.report import render_report
from tests.conftest import tuner_in_process as tuner

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ("results/bench_single_h200.json", "results/bench_call_h200.json")  # the newest same-run FlashMLA


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """render_report on a copy of the H200 results with the same-run benchmarks; what each plot drew."""
    import matplotlib.axes

    d = tmp_path_factory.mktemp("plots")
    shutil.copy(ROOT / "results" / "h200.db", d / "h200.db")
    seen = {"titles": [], "images": [], "lines": []}
    mp = pytest.MonkeyPatch()
    orig_title, orig_imshow, orig_plot = (matplotlib.axes.Axes.set_title, matplotlib.axes.Axes.imshow,
                                          matplotlib.axes.Axes.plot)  # fmt: skip

    def set_title(self, label, *a, **k):
        seen["titles"].append(str(label))
        return orig_title(self, label, *a, **k)

    def imshow(self, x, *a, **k):
        seen["images"].append(x)
        return orig_imshow(self, x, *a, **k)

    def plot(self, *a, **k):
        seen["lines"].append(str(k.get("label", "")))
        return orig_plot(self, *a, **k)

    mp.setattr(matplotlib.axes.Axes, "set_title", set_title)
    mp.setattr(matplotlib.axes.Axes, "imshow", imshow)
    mp.setattr(matplotlib.axes.Axes, "plot", plot)
    try:
        benches = tuple(load_bench(str(ROOT / f)) for f in BENCHES)
        text = render_report(Store(f"sqlite:///{d / 'h200.db'}", readonly=True), d / "plots", "plots/", benches)
    finally:
        mp.undo()
    return {**seen, "text": text}


def test_every_title_names_the_workload_and_the_device(drawn):
    sections = [ln[3:] for ln in drawn["text"].splitlines() if ln.startswith("## ")]
    assert drawn["titles"] and len(drawn["titles"]) == 2 * len(sections)  # a median and a levers plot each
    for title in drawn["titles"]:
        assert "NVIDIA H200" in title and any(w in title for w in ("v4_flash", "v32", "v41_flash", "glm53_nope")), title


def test_the_levers_plots_show_data_in_most_cells(drawn):
    import numpy as np

    assert drawn["images"]
    for image in drawn["images"]:
        data = np.ma.getdata(image)
        assert np.isfinite(data).mean() >= 0.5, np.isfinite(data).mean()  # not mostly grey


def test_the_median_plot_carries_flashmla_from_the_same_run_benchmark(drawn):
    flash = [label for label in drawn["lines"] if label.startswith("FlashMLA, same-run benchmark")]
    assert len(flash) == 3  # V4, V3.2 (kernels.bench) and the V4 layer call (kernels.bench_call)
    assert any("bench_call_h200.json" in label for label in flash)
    assert any("bench_single_h200.json" in label for label in flash)
    assert drawn["text"].count("FlashMLA in the plot:") == 3


def test_a_benchmark_points_match_its_call_only():
    bench = load_bench(str(ROOT / BENCHES[0]))
    from sparse_mla_tuner.kernels.workload import Workload

    v4 = bench.points(Workload("fp8_model1", 16, 512))
    assert v4 and all(math.isfinite(a) and math.isfinite(b) for a, b in v4.values())
    layer = Workload("fp8_model1", 16, 128, extra={"kv_format": "fp8_model1", "topk": 512}, attn_sink=True)
    assert bench.points(layer) == {}  # kernels.bench measures one cache, not the layer call
    assert load_bench(str(ROOT / BENCHES[1])).points(layer)


def test_a_file_that_is_no_benchmark_is_one_sentence(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"rows": 3}))
    shutil.copy(ROOT / "results" / "h200.db", tmp_path / "h200.db")  # the committed file is never opened
    proc = tuner("report", "--db", f"sqlite:///{tmp_path / 'h200.db'}", "--bench", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "is not a benchmark" in proc.stderr and proc.stderr.count("\n") == 1
