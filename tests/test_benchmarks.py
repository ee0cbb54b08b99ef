"""The benchmark scripts run end to end at toy sizes and report what they say they report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_runner_throughput_trains_each_sae_through_saelens_runner(
    tiny_hf_llama_dir, tiny_corpus, tmp_path
):
    """Three SAELens runner trainings on the tiny Llama: every run trains on exactly the tokens
    asked for in steps of the batch, its time split adds up to its wall time, a BAE's codes are
    0/1 (its density is a firing rate) and the profiler's heaviest operators are listed."""
    out = tmp_path / "throughput"
    subprocess.run(
        [sys.executable, str(BENCHMARKS / "runner_throughput.py"), "--model",
         str(tiny_hf_llama_dir), "--hook", "blocks.1.hook_resid_post", "--dataset",
         str(tiny_corpus), "--context-size", "16", "--training-tokens", "640", "--batch-size",
         "64", "--device", "cpu", "--out", str(out)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    report = json.loads((out / "runner_throughput.json").read_text())
    runs = {run["architecture"]: run for run in report["runs"]}
    assert list(runs) == ["standard", "topk", "bae"]
    assert report["info"]["d_in"] == 32
    assert report["info"]["d_sae"] == 128
    for run in runs.values():
        assert run["calls"]["SAE step"] == 10  # 640 tokens / 64
        assert run["tokens"] == 640
        assert sum(run["seconds"].values()) == pytest.approx(run["wall_seconds"], rel=1e-9)
        assert run["seconds"]["model forward"] > 0
        assert len(run["top_operators"]) == 8
    assert len(runs["bae"]["density_every_10_steps"]) == 1
    assert 0 < runs["bae"]["density_first_last"][0] < 1
    assert (out / "runner_throughput.md").read_text().count("| bae |") == 1
