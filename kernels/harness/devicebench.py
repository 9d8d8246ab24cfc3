"""The device-run convention shared by every ``tools/device_*.py`` script.

A device script checks full DSv4-Flash shapes against the float32 reference and times our kernel
beside the upstream baseline *in the same run*, each inside a CUDA graph, then writes one JSON and
one markdown file (GPU, versions, date, every number) into the output folder (``$OUT`` on the lent
machine; the files are committed under ``benchmarks/``). Timings from different runs or machines
are never mixed: ratios are taken within one run.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
import time
from typing import Callable, Sequence


def environment() -> dict:
    """GPU, compute capability, versions and date of this run."""
    import torch
    import triton

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1))
    else:
        env["gpu"] = "no CUDA device"
    return env


def gpu_tag() -> str:
    """The card in a result file's name: 'h200', 'h100', ... (the model number of the GPU's name, lower case), 'gpu'
    for a name without one, 'cpu' with no CUDA device. The device lends an H100 for an H200 at times."""
    import re

    import torch

    if not torch.cuda.is_available():
        return "cpu"
    match = re.search(r"\b([A-Z]+\d{2,4})\b", torch.cuda.get_device_name(0))
    return match.group(1).lower() if match else "gpu"


L2_FLUSH_BYTES = 256 * 2**20  # past the H200's 60 MB L2 and any sm_12x L2


def capture_graph(fn: Callable[[], object], *, calls: int = 1, warmup: int = 3):
    """A CUDA graph of ``calls`` calls of ``fn()``, captured after ``warmup`` eager calls on a side stream (JIT
    compilation and lazy allocations happen there, not inside the capture)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def time_in_cuda_graph(fn: Callable[[], object], *, calls_per_graph: int = 20, replays: int = 30,
                       warmup: int = 3) -> float:
    """Median microseconds per ``fn()`` call, with ``calls_per_graph`` calls captured in one CUDA graph.

    Capturing proves the call is graph-capturable (no host sync, no data-dependent allocation) and
    removes launch overhead from the figure, as SGLang's decode graphs do. An L2-sized buffer is
    overwritten before each replay so that small working sets are not served from a warm cache
    across replays (within a replay the repeated calls do share L2, as consecutive layers would not;
    ``calls_per_graph=1`` gives the cold-cache figure).
    """
    import torch

    graph = capture_graph(fn, calls=calls_per_graph, warmup=warmup)
    flush = l2_flush_buffer()
    samples = [replay_us(graph, flush, calls_per_graph) for _ in range(replays)]
    del graph
    return statistics.median(samples)


def l2_flush_buffer():
    """A device buffer whose overwrite (``flush.zero_()``) evicts the L2 of any GPU this project targets."""
    import torch

    return torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")


def replay_us(graph, flush, calls: int = 1) -> float:
    """Microseconds per call of one replay of ``graph`` (``calls`` captured calls), after overwriting ``flush``."""
    import torch

    flush.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def time_rotating_calls(fns, *, dry_run: bool = False) -> float:
    """Median microseconds per call of a CUDA graph that calls ``fns`` in turn (each function typically reads
    its own weight copy, so that together they stream from HBM rather than L2), at least 20 calls per graph.
    Every function runs once first (JIT compilation, split-K counters); with ``dry_run`` (no GPU: the
    interpreter smoke runs) that is all, and the result is NaN."""
    for fn in fns:
        fn()
    if dry_run:
        return float("nan")
    turn = [0]

    def call():
        fn = fns[turn[0] % len(fns)]
        turn[0] += 1
        return fn()
    return time_in_cuda_graph(call, calls_per_graph=max(20, len(fns)), replays=10, warmup=1)


def copy_bandwidth_gbs(nbytes: int = 2 * 2**30, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written.

    Timed eagerly (median of ``repeats`` copies between CUDA events), not inside a CUDA graph:
    our first H200 runs timed a graph-captured ``copy_`` at 2.72-2.78 TB/s, below what our own
    kernels then read (3.7 TB/s), while the baseline reference reports 4245 GB/s; a captured copy
    is a graph memcpy node, which need not run the way an eager copy does. Device scripts record
    both figures (:func:`copy_bandwidth_in_graph_gbs`) so the difference is measured, not assumed.
    At 2 GiB, launch overhead is noise.
    """
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3)
    return 2 * nbytes / statistics.median(samples) / 1e9


def copy_bandwidth_in_graph_gbs(nbytes: int = 2 * 2**30) -> float:
    """The same copy captured in a CUDA graph (what the first device runs reported as the copy
    bandwidth); kept for comparison with :func:`copy_bandwidth_gbs`."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_in_cuda_graph(lambda: dst.copy_(src), calls_per_graph=5, replays=10)
    return 2 * nbytes / (us * 1e-6) / 1e9


def bf16_matmul_tflops(n: int = 8192) -> float:
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    us = time_in_cuda_graph(lambda: a @ b, calls_per_graph=5, replays=10)
    return 2 * n**3 / (us * 1e-6) / 1e12


def relative_error(actual, expected) -> float:
    """||actual - expected|| / ||expected|| in float64, over finite reference entries."""
    import torch

    a = actual.double()
    e = expected.double()
    finite = torch.isfinite(e)
    denom = e[finite].norm().item()
    return (a[finite] - e[finite]).norm().item() / max(denom, 1e-30)


COMMITTED_RESULTS_DIR = "benchmarks"  # where device results are committed, relative to the repository root


@dataclasses.dataclass
class BenchResult:
    """What one device script produced: rows of measurements plus the run's environment."""

    name: str
    title: str
    columns: Sequence[str]
    rows: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    env: dict = dataclasses.field(default_factory=environment)
    extra: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stem: str | None = None  # the files' name, fixed at the first write (not a field: not in the JSON)

    def add(self, **row) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:
            raise KeyError(f"row has columns {sorted(unknown)} not declared in {list(self.columns)}")
        self.rows.append(row)

    def markdown(self) -> str:
        env = self.env
        lines = [f"# {self.title}", "",
                 f"{env.get('gpu')} (cc {env.get('capability', '-')}), torch {env['torch']}, triton {env['triton']},"
                 f" CUDA {env.get('cuda')}, {env['date']}.", ""]
        for key, value in self.extra.items():
            lines.append(f"- {key}: {value}")
        if self.extra:
            lines.append("")
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "---|" * len(self.columns))
        for row in self.rows:
            lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in self.columns) + " |")
        if self.notes:
            lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def finish(self, out_dir: str | None, t_start: float) -> tuple[str, str]:
        """A device script's last step: the wall time since ``t_start`` (time.time()), the files, the table on
        stdout."""
        self.extra["wall seconds"] = round(time.time() - t_start, 1)
        paths = self.write(out_dir)
        print(self.markdown())
        print("wrote", paths)
        return paths

    def _file_stem(self) -> str:
        """The files' name: ``name``, unless a committed result under ``benchmarks/`` of the working directory
        (the repository root, where the device scripts run) already has it; then ``name`` with this run's UTC time
        appended, and a note saying so, so that copying the files into ``benchmarks/`` cannot replace an earlier
        run (several device calls had written e.g. ``indexer-h200-run1`` again). Chosen at the first write: a
        script's later writes (partial results) keep it."""
        if self._stem is None:
            if any(os.path.exists(os.path.join(COMMITTED_RESULTS_DIR, self.name + ext)) for ext in (".md", ".json")):
                taken = self.name
                self.name = f"{taken}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%S}"
                self.notes.append(f"written as {self.name}: {COMMITTED_RESULTS_DIR}/{taken} already holds an "
                                  "earlier run (give it a run number when committing)")
            self._stem = self.name
        return self._stem

    def write(self, out_dir: str | None = None) -> tuple[str, str]:
        # a run without a GPU (a device script's --smoke) must not land among the committed device results
        default_dir = "benchmarks" if _cuda_available() else "bench-results"
        out_dir = out_dir or os.environ.get("OUT") or default_dir
        os.makedirs(out_dir, exist_ok=True)
        stem = self._file_stem()
        json_path = os.path.join(out_dir, f"{stem}.json")
        md_path = os.path.join(out_dir, f"{stem}.md")
        with open(json_path, "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=1, default=str)
        with open(md_path, "w") as f:
            f.write(self.markdown())
        return json_path, md_path


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _fmt(value) -> str:
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:.4g}"
        return f"{value:.3e}"
    return str(value)
