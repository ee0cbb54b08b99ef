"""Speed of a BAE training step against SAELens' `standard` and `topk`, and the memory of the
tiled covariance penalty against the dense one.

    python benchmarks/train_step.py                       # CPU defaults, prints a markdown report
    python benchmarks/train_step.py --device cuda --d-in 2048 --out bench.json

Every figure is measured in this process (or, for peak memory, in a fresh child process per
measurement) and reported as a ratio to a baseline measured the same way. Timings are medians over
``--steps`` full training steps (forward, backward, clipping, Adam) through ``SAETrainer.step``,
the models taking turns step by step; each ratio to ``standard`` comes with a bootstrap 95%
interval over those paired rounds (``median_ratio_interval``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sae_lens.config import SAETrainerConfig
from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
from sae_lens.training.sae_trainer import SAETrainer
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from sae_lens_bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.kernels import covariance_penalty
from sae_lens_bae.kernels import fused as fused_covariance
from sae_lens_bae.kernels import products as covariance_products
from sae_lens_bae.saes.input_frame import fix_frame, module_frame
from sae_lens_bae.saes.objective import dense_covariance_penalty


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


NOMINAL_STEPS = 1_000_000
"""The length of training every timed trainer is told: the timed steps are then ordinary steps
of a long run, whatever ``--steps`` times."""


def _trainer(sae: Any, batch: torch.Tensor) -> SAETrainer:
    """SAELens' trainer of a long run (``NOMINAL_STEPS``) on ``batch`` at learning rate 0: Adam
    does the same arithmetic, and the weights (so a BAE's code density, on which the covariance
    penalty's cost depends) stay where they were set."""
    return SAETrainer(
        cfg=SAETrainerConfig(
            total_training_samples=batch.shape[0] * NOMINAL_STEPS,
            train_batch_size_samples=batch.shape[0],
            lr=0.0,
            lr_end=0.0,
            device=str(batch.device),
        ),
        sae=sae,
        data_provider=iter(()),
    )


@contextlib.contextmanager
def products_of(name: str) -> Iterator[None]:
    """The covariance products a model's name asks for: ``_int8`` the int8 CPU matmuls alone
    (sparse sums off), ``_fp32`` the CPU products before the int8 matmuls, ``_tiled`` the tiled
    PyTorch path on CUDA instead of the fused kernels, ``_atomic`` the fused kernels without the
    kept sign matrix (backward recomputes the tiles and adds with atomics), ``_cast`` the codes
    cast to bf16 before the forward kernel (``CODES_IN_KERNEL`` off); anything else the
    defaults."""
    products = covariance_products
    fused = fused_covariance
    saved = (products.SPARSE_DENSITY, products.CPU_INT8, fused.SIGN_CACHE_LIMIT,
             fused.CODES_IN_KERNEL)  # fmt: skip
    if name.endswith("_int8"):
        products.SPARSE_DENSITY = -1.0
    if name.endswith("_fp32"):
        products.CPU_INT8 = False
    if name.endswith("_atomic"):
        fused.SIGN_CACHE_LIMIT = 0
    if name.endswith("_cast"):
        fused.CODES_IN_KERNEL = False
    kernels = () if name.endswith("_tiled") else tuple(fused.FUSED_DEVICES)
    try:
        with fused.fused_on(*kernels):
            yield
    finally:
        (products.SPARSE_DENSITY, products.CPU_INT8, fused.SIGN_CACHE_LIMIT,
         fused.CODES_IN_KERNEL) = saved  # fmt: skip


def median_ratio_interval(
    times: list[float], base: list[float], level: float = 0.95, draws: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A bootstrap interval of median(times) / median(base) over rounds (``timed_rounds``): the
    rounds are drawn with replacement, each keeping its two steps, which ran back to back. It
    says how far a ratio near a target (1.3x) is from it within one run; the spread between
    machines of one kind (``standard`` 6% apart on two H200s) is not in it."""
    if len(times) != len(base) or not times:
        raise ValueError(f"paired rounds needed, got {len(times)} and {len(base)} times")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(times), size=(draws, len(times)))
    ratios = np.median(np.asarray(times)[picks], 1) / np.median(np.asarray(base)[picks], 1)
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def timed_rounds(
    saes: dict[str, Any], batch: torch.Tensor, steps: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Seconds of each SAELens training step (``SAETrainer.step``) of each model on one fixed
    batch, ``steps`` rounds after ``warmup``. The models take turns, one step each per round, so
    that a machine whose speed drifts (a shared or throttled CPU) slows every model alike and
    the ratios stay fair."""
    trainers = {name: _trainer(sae, batch) for name, sae in saes.items()}
    times: dict[str, list[float]] = {name: [] for name in saes}
    for i in range(warmup + steps):
        for name, trainer in trainers.items():
            with products_of(name):
                _sync(str(batch.device))
                start = time.perf_counter()
                trainer.step(batch)
                _sync(str(batch.device))
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


_NO_KERNEL = ("view", "_unsafe_view", "t", "transpose", "expand", "unsqueeze", "squeeze",
              "slice", "select", "as_strided", "permute", "alias", "detach", "empty",
              "empty_like", "empty_strided", "lift_fresh", "_reshape_alias", "reshape",
              "promote_types", "result_type")  # fmt: skip
"""Dispatched ops that move no data (views, allocations, dtype queries): not counted."""


class _OpCounter(TorchDispatchMode):
    """Counts the ATen ops dispatched inside the block that do work on tensors (not
    ``_NO_KERNEL``): each is at least one kernel launch on a GPU, where the step of a small SAE
    costs its launches more than its FLOPs. Kernels launched outside ATen (Triton's) are not
    seen. ``ops`` names them in dispatch order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    @property
    def count(self) -> int:
        return len(self.ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.overloadpacket.__name__ not in _NO_KERNEL:
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def ops_per_step(saes: dict[str, Any], batch: torch.Tensor) -> dict[str, int]:
    """ATen ops (``_OpCounter``) of one SAELens training step of each model, after one step of
    warm-up: a count that does not depend on the machine, and on a GPU the launches the step
    pays for whatever its size."""
    counts = {}
    for name, sae in saes.items():
        trainer = _trainer(sae, batch)
        with products_of(name):
            trainer.step(batch)
            with _OpCounter() as counter:
                trainer.step(batch)
        counts[name] = counter.count
    return counts


def bae_at_density(
    d_in: int, d_sae: int, batch: torch.Tensor, density: float | None, **config: Any
) -> BAETrainingSAE:
    """A fresh BAE; with ``density``, its encoder bias set to every bit's (1 - density)
    quantile on ``batch`` so that each bit fires on that fraction of it (None: as initialised,
    about half). A trained default BAE at d_sae = 2304 fires 16% of its bits (L0 369 in
    docs/research/feature-study.md)."""
    cfg = BAETrainingSAEConfig(
        d_in=d_in,
        d_sae=d_sae,
        **config,
    )
    sae = BAETrainingSAE(cfg).to(batch.device)
    if cfg.input_variance is not None:  # framed before training, as train_sae frames it
        fix_frame(module_frame(sae), batch, cfg.input_variance)  # type: ignore[arg-type]
    if density is not None:
        with torch.no_grad():
            sae.b_enc.zero_()
            sae.b_enc.copy_(-torch.quantile(sae.hidden_pre(batch), 1.0 - density, dim=0))
    return sae


COMPILED = ("standard", "topk", "bae", "bae_no_covariance")
"""The models timed again with their step compiled (``--compile``)."""


def compile_step(sae: Any, backend: str = "inductor", mode: str | None = None) -> Any:
    """What SAELens' runner does with ``compile_sae=True`` (and ``bae train --compile``):
    ``torch.compile`` of the instance's ``training_forward_pass``, which ``SAETrainer.step``
    calls. Where a small SAE's step costs its kernel launches, fusing them is what can bring it
    down (``mode="reduce-overhead"``: replayed as a CUDA graph, ``bae train --compile-mode``);
    ``backend="eager"`` traces without compiling (a quick check of the wiring)."""
    sae.training_forward_pass = torch.compile(sae.training_forward_pass, backend=backend, mode=mode)
    return sae


def compiled_row(name: str, mode: str | None) -> str:
    """``name_compiled`` for torch's default mode, ``name_compiled_MODE`` for another."""
    return f"{name}_compiled" if mode in (None, "default") else f"{name}_compiled_{mode}"


def step_batch(batch_size: int, d_in: int, device: str) -> torch.Tensor:
    """The one batch every model steps on (seed 0)."""
    torch.manual_seed(0)
    return torch.randn(batch_size, d_in, device=device)


def base_models(d_in: int, d_sae: int, batch: torch.Tensor) -> dict[str, Any]:
    """Builders of the models every run times: SAELens' ``standard`` and ``topk`` (k = 32), the
    BAE as initialised, and the BAE without its covariance term (the one term ``standard`` has
    no counterpart of)."""
    return {
        "standard": lambda: StandardTrainingSAE(StandardTrainingSAEConfig(d_in=d_in, d_sae=d_sae)),
        "topk": lambda: TopKTrainingSAE(TopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae, k=32)),
        "bae": lambda: bae_at_density(d_in, d_sae, batch, None),
        "bae_no_covariance": lambda: bae_at_density(
            d_in, d_sae, batch, None, covariance_coefficient=0.0
        ),
    }


PROFILED = ("standard", "bae", "bae_no_covariance")
"""The models ``--profile`` looks inside (``base_models``)."""


def step_timings(
    d_in: int, d_sae: int, batch_size: int, steps: int, device: str, densities: list[float],
    compile_backend: str | None = None, compile_modes: tuple[str | None, ...] = (None,),
) -> dict:  # fmt: skip
    """Seconds per step of SAELens' standard and topk SAEs and of BAEs: as initialised, at each
    of ``densities``, without the covariance term; on CPU each BAE also through the products it
    had before the int8 matmuls (``_fp32``: fp32 matmuls, sparse sums below
    ``SPARSE_DENSITY_FP32``) and, at each density, through the int8 matmuls alone (``_int8``:
    the sparse sums off); on CUDA through the tiled path and the fused kernels without their
    sign matrix (``_atomic``) and with the codes cast before the forward kernel (``_cast``) as
    well as the default fused kernels. With ``compile_backend``,
    ``COMPILED`` again with their step compiled in each of ``compile_modes`` (``compiled_row``
    names them, ``compile_step``; their ATen ops are not counted: a compiled graph runs its own
    kernels)."""
    batch = step_batch(batch_size, d_in, device)
    models = base_models(d_in, d_sae, batch)
    cpu = not device.startswith("cuda")
    if not cpu and fused_covariance.HAS_TRITON:  # before/after the kernels, and the sign cache
        models["bae_tiled"] = models["bae"]
        models["bae_atomic"] = models["bae"]
        models["bae_cast"] = models["bae"]
    if cpu:
        models["bae_fp32"] = models["bae"]
    for density in densities:
        models[f"bae_density_{density:g}"] = lambda p=density: bae_at_density(d_in, d_sae, batch, p)
        if cpu:
            for path in ("int8", "fp32"):
                models[f"bae_density_{density:g}_{path}"] = models[f"bae_density_{density:g}"]
    saes = {name: make().to(device) for name, make in models.items()}
    if compile_backend is not None:
        for mode in compile_modes:
            for name in COMPILED:
                saes[compiled_row(name, mode)] = compile_step(
                    models[name]().to(device), compile_backend, mode
                )
    rounds = timed_rounds(saes, batch, steps)
    seconds = {name: statistics.median(values) for name, values in rounds.items()}
    ops: dict[str, int | None] = {
        **ops_per_step({name: make().to(device) for name, make in models.items()}, batch),
        **{name: None for name in saes if name not in models},
    }
    code_density = {}
    for name, sae in saes.items():
        if isinstance(sae, BAETrainingSAE):
            with torch.no_grad():
                code_density[name] = float(sae.encode_bits(batch).mean())
        shown = "-" if ops[name] is None else ops[name]
        print(f"  {name:28s} {seconds[name] * 1e3:9.2f} ms/step {shown:>5} ops", flush=True)
    return {
        "seconds_per_step": seconds,
        "ops_per_step": ops,
        "ops_over_standard": {
            name: count / ops["standard"] for name, count in ops.items() if count is not None
        },
        "code_density_after_timing": code_density,
        "over_standard": {name: sec / seconds["standard"] for name, sec in seconds.items()},
        "over_standard_interval_95": {
            name: median_ratio_interval(values, rounds["standard"])
            for name, values in rounds.items()
        },
        "bae_over_standard": seconds["bae"] / seconds["standard"],
        "bae_over_topk": seconds["bae"] / seconds["topk"],
        "bae_without_covariance_over_standard": seconds["bae_no_covariance"] / seconds["standard"],
    }


def profile_steps(
    saes: dict[str, Any], batch: torch.Tensor, steps: int, top: int = 12,
    trace_dir: Path | None = None,
) -> dict[str, dict]:  # fmt: skip
    """Where each model's SAELens step spends its time, from ``torch.profiler`` over ``steps``
    steps after 3 of warm-up: the wall time, the device's busy time (the self time of its
    kernels, Triton's too; 0 on a CPU), the host's time inside profiled calls (ATen ops, the
    autograd engine, CUDA launches) and outside them (Python: the trainer, autograd Functions,
    Triton's launcher), the ``top`` calls by self host time (with the device time of the kernels
    each launched) and the ``top`` kernels by device time, per step.
    A small SAE's GPU step is host-bound, so its ratio to ``standard`` is set by these rows, not
    by FLOPs. With ``trace_dir`` each model's Chrome trace is written there as well."""
    cuda = batch.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    report = {}
    for name, sae in saes.items():
        trainer = _trainer(sae, batch)
        with products_of(name):
            for _ in range(3):
                trainer.step(batch)
            _sync(str(batch.device))
            with profile(activities=activities) as prof:
                start = time.perf_counter()
                for _ in range(steps):
                    trainer.step(batch)
                _sync(str(batch.device))
                wall = time.perf_counter() - start
        events = prof.key_averages()
        # kernels (and copies) are device events; a host op's device time is its kernels' again
        kernels = [e for e in events if e.device_type != DeviceType.CPU]
        host = sum(e.self_cpu_time_total for e in events) / steps / 1e3
        device = sum(e.self_device_time_total for e in kernels) / steps / 1e3

        def rows(key: str, events: Any) -> list[dict]:
            ranked = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]
            return [{"call": e.key, "calls_per_step": e.count / steps,
                     "self_host_us_per_step": e.self_cpu_time_total / steps,
                     "device_us_per_step": e.self_device_time_total / steps}
                    for e in ranked if getattr(e, key) > 0]  # fmt: skip

        report[name] = {
            "wall_ms_per_step": wall / steps * 1e3,
            "device_busy_ms_per_step": device,
            "host_in_calls_ms_per_step": host,
            "host_outside_calls_ms_per_step": wall / steps * 1e3 - host,
            "by_host_time": rows("self_cpu_time_total", events),
            "by_device_time": rows("self_device_time_total", kernels),
        }
        if trace_dir is not None:
            prof.export_chrome_trace(str(trace_dir / f"trace_{name}.json"))
    return report


def print_profile(report: dict[str, dict]) -> None:
    """``profile_steps``'s figures as markdown: one summary table, then each model's top calls."""
    print("\n| model | wall ms/step | device busy | host in calls | host outside calls |")
    print("|---|---|---|---|---|")
    for name, row in report.items():
        print(f"| {name} | {row['wall_ms_per_step']:.3f} | {row['device_busy_ms_per_step']:.3f} "
              f"| {row['host_in_calls_ms_per_step']:.3f} "
              f"| {row['host_outside_calls_ms_per_step']:.3f} |")  # fmt: skip
    for name, row in report.items():
        for key in ("by_host_time", "by_device_time"):
            if not row[key]:
                continue
            print(f"\n{name}, {key.replace('_', ' ')} (per step)\n")
            print("| call | calls | self host us | device us |\n|---|---|---|---|")
            for call in row[key]:
                host, device = call["self_host_us_per_step"], call["device_us_per_step"]
                print(f"| {call['call'][:80]} | {call['calls_per_step']:g} "
                      f"| {host:.1f} | {device:.1f} |")  # fmt: skip


def _probe(n: int, batch: int, kind: str, device: str, density: float) -> tuple[float, float]:
    """Extra peak memory (MiB) and seconds of one forward + backward of the penalty, measured in
    this fresh process: peak RSS over the RSS after the inputs exist (CPU) or CUDA's peak
    allocation. ``kind``: ``tiled``, ``tiled_fp32`` (the CPU products before the int8 matmuls)
    or ``dense`` (``torch.cov``), on random codes of that ``density``."""
    torch.manual_seed(0)
    codes = (torch.rand(batch, n, device=device) < density).float().requires_grad_()
    fn = dense_covariance_penalty if kind == "dense" else covariance_penalty
    covariance_products.CPU_INT8 = kind != "tiled_fp32"
    # warm-up on a slice of the codes: the kernels' code pages (file-backed, counted in RSS) and
    # the library's one-time buffers belong to the baseline, not to the penalty's memory
    fn(codes[:64].detach().requires_grad_()).backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        fn(codes).backward()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        return (torch.cuda.max_memory_allocated() - base) / 2**20, seconds
    with open("/proc/self/statm") as f:
        base_mib = int(f.read().split()[1]) * resource.getpagesize() / 2**20
    try:  # reset the peak (VmHWM) so transients of the imports and the set-up do not count
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    start = time.perf_counter()
    fn(codes).backward()
    seconds = time.perf_counter() - start
    with open("/proc/self/status") as f:
        peak_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return peak_kib / 1024 - base_mib, seconds


# glibc raises its mmap threshold after a large free (up to 32 MiB), after which freed tiles stay
# in the heap and the peak RSS depends on fragmentation (89 to 340 MiB seen for one 67 MiB
# workload); a fixed threshold returns every large block, so RSS follows the live memory.
PROBE_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}


def probe_penalty(
    n: int, batch: int, kind: str, device: str = "cpu", density: float = 0.05
) -> tuple[float, float]:
    """(extra peak MiB, seconds) of :func:`_probe`, run in a child process so that each
    measurement starts from a clean peak."""
    result = subprocess.run(
        [sys.executable, __file__, "--probe", str(n), str(batch), kind, device, str(density)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **PROBE_ENV},
    )
    peak, seconds = result.stdout.strip().splitlines()[-1].split()
    return float(peak), float(seconds)


def covariance_memory(
    sizes: list[int], batch: int, device: str, budget_gib: float, density: float
) -> list[dict]:
    rows = []
    for n in sizes:
        # torch.cov keeps ~4 n x n fp32 matrices alive (cov, abs, grad, sign) at its peak
        dense_estimate_gib = 4 * n * n * 4 / 2**30
        row: dict[str, Any] = {"d_sae": n, "batch": batch, "density": density}
        for kind in ("tiled", "tiled_fp32", "dense"):
            if kind == "tiled_fp32" and device.startswith("cuda"):  # int8 products: CPU only
                continue
            if kind == "dense" and dense_estimate_gib > budget_gib:
                row["dense_peak_mib"] = None
                row["dense_note"] = f"not run: needs about {dense_estimate_gib:.0f} GiB"
                continue
            row[f"{kind}_peak_mib"], row[f"{kind}_seconds"] = probe_penalty(
                n, batch, kind, device, density
            )
        if row["dense_peak_mib"] is not None:
            row["tiled_over_dense"] = row["tiled_peak_mib"] / row["dense_peak_mib"]
        print(f"  d_sae={n}: {row}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-in", type=int, default=576, help="576 = SmolLM2-135M's d_model")
    parser.add_argument("--expansion", type=int, default=4)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--memory-sizes", default="4096,16384,65536")
    parser.add_argument(
        "--densities",
        default="0.16,0.05",
        help="code densities to time BAEs at besides their initial ~0.5 (0.16: a trained default)",
    )
    parser.add_argument("--dense-budget-gib", type=float, default=8.0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--memory-density", type=float, default=0.05, help="code density of the memory probes"
    )
    parser.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        metavar="BACKEND",
        help="also time standard, topk and the BAEs with their step compiled, as SAELens' "
        "compile_sae does (torch.compile backend, default inductor; the first steps compile)",
    )
    parser.add_argument(
        "--compile-modes",
        default="default",
        help="with --compile: the torch.compile modes of its rows, comma-separated (default, "
        "reduce-overhead: CUDA graphs, max-autotune, max-autotune-no-cudagraphs)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="instead of timing: profile this many steps of standard, the BAE and the BAE without "
        "its covariance term (torch.profiler; with --out, their Chrome traces beside the JSON)",
    )
    parser.add_argument("--probe", nargs=5, metavar=("N", "BATCH", "KIND", "DEVICE", "DENSITY"))
    args = parser.parse_args()
    if args.probe:
        n, batch, kind, device, density = args.probe
        print(*_probe(int(n), int(batch), kind, device, float(density)))
        return

    d_sae = args.expansion * args.d_in
    if args.profile:
        batch = step_batch(args.batch, args.d_in, args.device)
        models = base_models(args.d_in, d_sae, batch)
        profiled = {name: models[name]().to(args.device) for name in PROFILED}
        trace_dir = args.out.parent if args.out else None
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
        report = profile_steps(profiled, batch, args.profile, trace_dir=trace_dir)
        print_profile(report)
        if args.out:
            args.out.write_text(json.dumps(report, indent=2))
        return
    info = {
        "device": args.device,
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_int8_products": covariance_products.cpu_int8_products(),
    }
    if args.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
    print(f"Training step, d_in={args.d_in} d_sae={d_sae} batch={args.batch} on {info}")
    densities = [float(p) for p in args.densities.split(",") if p]
    timings = step_timings(
        args.d_in, d_sae, args.batch, args.steps, args.device, densities, args.compile,
        tuple(mode for mode in args.compile_modes.split(",") if mode),
    )  # fmt: skip
    print("Covariance penalty peak memory (forward + backward), batch", args.batch)
    sizes = [int(s) for s in args.memory_sizes.split(",") if s]
    memory = covariance_memory(
        sizes, args.batch, args.device, args.dense_budget_gib, args.memory_density
    )

    print("\n| model | code density | ms/step | ratio to standard (95% interval) | ratio to topk "
          "| ATen ops |\n|---|---|---|---|---|---|")  # fmt: skip
    for name, sec in timings["seconds_per_step"].items():
        std, topk = timings["seconds_per_step"]["standard"], timings["seconds_per_step"]["topk"]
        density = timings["code_density_after_timing"].get(name)
        shown = f"{density:.3f}" if density is not None else "-"
        ops = timings["ops_per_step"][name]
        ops = "-" if ops is None else ops
        low, high = timings["over_standard_interval_95"][name]
        print(
            f"| {name} | {shown} | {sec * 1e3:.2f} | {sec / std:.3f} ({low:.3f}-{high:.3f}) "
            f"| {sec / topk:.2f} | {ops} |"
        )
    print("\n| d_sae | tiled peak MiB | dense peak MiB | tiled / dense | tiled s | fp32 tiles s |")
    print("|---|---|---|---|---|---|")
    for row in memory:
        dense = row["dense_peak_mib"]
        dense_s = f"{dense:.0f}" if dense is not None else row["dense_note"]
        ratio = f"{row['tiled_over_dense']:.3f}" if dense is not None else "-"
        fp32 = row.get("tiled_fp32_seconds")
        print(
            f"| {row['d_sae']} | {row['tiled_peak_mib']:.0f} | {dense_s} | {ratio} "
            f"| {row['tiled_seconds']:.2f} | {f'{fp32:.2f}' if fp32 is not None else '-'} |"
        )
    if args.out:
        args.out.write_text(
            json.dumps({"info": info, "timings": timings, "memory": memory}, indent=2)
        )
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
