"""The device-run result format: every file carries the GPU, versions, date and every row."""

import json
import os
import re

import pytest
import torch

from sglang_sm120.kernels.harness.devicebench import BenchResult, environment, gpu_tag, relative_error


def test_environment_names_gpu_versions_and_date():
    env = environment()
    for key in ("date", "torch", "triton", "gpu"):
        assert env[key]
    if not torch.cuda.is_available():
        assert env["gpu"] == "no CUDA device"


def test_result_files_carry_environment_and_rows(tmp_path):
    result = BenchResult("demo", "Demo kernel", columns=("B", "ours_us", "upstream_us", "speedup"))
    result.add(B=1, ours_us=10.5, upstream_us=300.0, speedup=300 / 10.5)
    result.extra["copy bandwidth GB/s"] = 4245.0
    result.notes.append("timed in CUDA graphs")
    json_path, md_path = result.write(str(tmp_path))
    data = json.loads(open(json_path).read())
    assert data["rows"] == [{"B": 1, "ours_us": 10.5, "upstream_us": 300.0, "speedup": 300 / 10.5}]
    assert data["env"]["torch"] == torch.__version__
    md = open(md_path).read()
    assert md.startswith("# Demo kernel")
    assert "| B | ours_us | upstream_us | speedup |" in md and "| 1 | 10.5 | 300 | 28.57 |" in md
    assert "copy bandwidth GB/s: 4245" in md and "timed in CUDA graphs" in md


def test_finish_records_wall_time_writes_and_prints(tmp_path, capsys):
    import time

    result = BenchResult("demo", "Demo kernel", columns=("B",))
    result.add(B=3)
    json_path, md_path = result.finish(str(tmp_path), time.time() - 2.0)
    data = json.loads(open(json_path).read())
    assert data["rows"] == [{"B": 3}] and data["extra"]["wall seconds"] >= 2.0
    printed = capsys.readouterr().out
    assert "# Demo kernel" in printed and "| 3 |" in printed and md_path in printed


def test_result_without_gpu_never_defaults_to_benchmarks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    json_path, md_path = BenchResult("demo", "Demo", columns=("B",)).write()
    assert json_path == "bench-results/demo.json" and md_path == "bench-results/demo.md"
    assert not (tmp_path / "benchmarks").exists()


def test_undeclared_column_is_rejected():
    with pytest.raises(KeyError, match="not declared"):
        BenchResult("demo", "Demo", columns=("B",)).add(B=1, extra=2)


def test_relative_error_ignores_non_finite_reference_entries():
    expected = torch.tensor([1.0, float("-inf"), 2.0])
    actual = torch.tensor([1.0, 5.0, 2.2])
    assert relative_error(actual, expected) == pytest.approx(0.2 / 5 ** 0.5)


@pytest.mark.parametrize("name, tag", [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "gpu"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
])
def test_gpu_tag_names_the_card(monkeypatch, name, tag):
    """Result files are named by the card that ran them (the device lends an H100 for an H200 at times)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: name)
    assert gpu_tag() == tag


def test_gpu_tag_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_tag() == "cpu"


def test_a_name_already_committed_is_not_written_again(tmp_path, monkeypatch):
    """A device script run from the repository root whose result name is already under benchmarks/ writes its files
    under the name with the run's UTC time appended and says so; its later writes (partial results) keep that name.
    A name not committed is written as given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "demo-h200-run1.md").write_text("an earlier run\n")
    out = tmp_path / "out"
    result = BenchResult("demo-h200-run1", "Demo", columns=("B",))
    result.add(B=1)
    json_path, md_path = result.write(str(out))
    stem = os.path.basename(md_path)[:-len(".md")]
    assert re.fullmatch(r"demo-h200-run1-\d{8}T\d{6}", stem), stem
    assert json_path == str(out / f"{stem}.json")
    assert (tmp_path / "benchmarks" / "demo-h200-run1.md").read_text() == "an earlier run\n"
    data = json.loads(open(json_path).read())
    assert data["name"] == stem and "_stem" not in data
    assert any("benchmarks/demo-h200-run1 already holds an earlier run" in note for note in data["notes"])
    result.add(B=2)
    assert result.write(str(out)) == (json_path, md_path)  # the partial result's name is kept
    assert json.loads(open(json_path).read())["rows"] == [{"B": 1}, {"B": 2}]
    fresh = BenchResult("demo-h200-run2", "Demo", columns=("B",))
    assert fresh.write(str(out)) == (str(out / "demo-h200-run2.json"), str(out / "demo-h200-run2.md"))
    assert fresh.notes == []
