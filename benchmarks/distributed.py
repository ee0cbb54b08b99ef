"""Data-parallel BAE training: steps per second for 1 and N processes at one global batch.

    python benchmarks/distributed.py                    # CPU (gloo): 1 process vs 2 processes
    python benchmarks/distributed.py --device cuda      # NCCL, on every GPU there is (if > 1)

Every configuration trains the same BAE on the same global minibatch (``--batch`` rows) through
``SAETrainer.step`` for ``--steps`` timed steps after 3 warm-up steps; medians are reported. The
baseline is one process with all the threads (CPU) or one GPU; the ratio is its step time over the
configuration's. ``1 process, local batch`` is one rank's share alone (batch / N, 1 thread on
CPU): the gap between it and the N-rank step is the cost of the collectives. Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from sae_lens.config import SAETrainerConfig

from sae_lens_bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.parallel.distributed import data_parallel, spawn_local
from sae_lens_bae.training.trainer import RecordingTrainer


def _step_times(d_in: int, batch: int, steps: int, device: str, parallel: bool) -> list[float]:
    """Seconds per step of a BAE trained on ``batch`` rows per process."""
    world = dist.get_world_size() if parallel else 1
    torch.manual_seed(0)
    sae = BAETrainingSAE(BAETrainingSAEConfig(d_in=d_in, d_sae=4 * d_in, device=device))
    data = torch.randn(batch, d_in, device=device, generator=None)
    trainer = RecordingTrainer(
        cfg=SAETrainerConfig(
            total_training_samples=batch * world * (steps + 3),
            train_batch_size_samples=batch * world,
            lr=5e-4,
            lr_end=5e-4,
            device=device,
        ),  # fmt: skip
        sae=sae,
        data_provider=iter(()),
        record_every=10**9,
    )
    if parallel:
        data_parallel(trainer)
    times = []
    for i in range(steps + 3):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.step(data)
        trainer.n_training_steps += 1
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return times


def _rank(rank: int, world: int, args: Any, out: str) -> None:
    if args.device == "cpu":
        torch.set_num_threads(max(1, args.threads // world))
    device = f"cuda:{rank}" if args.device == "cuda" else "cpu"
    times = _step_times(args.d_in, args.batch // world, args.steps, device, parallel=True)
    if rank == 0:
        Path(out).write_text(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--d-in", type=int, default=576)
    parser.add_argument("--batch", type=int, default=1024, help="global minibatch")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", default="runs/bench-distributed.json")
    args = parser.parse_args()
    worlds = [2] if args.device == "cpu" else list(range(2, torch.cuda.device_count() + 1))
    device = "cuda:0" if args.device == "cuda" else "cpu"
    torch.set_num_threads(args.threads)
    rows: list[dict[str, Any]] = []
    base = statistics.median(_step_times(args.d_in, args.batch, args.steps, device, False))
    rows.append({"configuration": "1 process", "processes": 1, "step_s": base})
    for world in worlds:
        if args.device == "cpu":
            torch.set_num_threads(max(1, args.threads // world))
        alone = statistics.median(
            _step_times(args.d_in, args.batch // world, args.steps, device, False)
        )
        rows.append({"configuration": f"1 process, local batch {args.batch // world}",
                     "processes": 1, "step_s": alone})  # fmt: skip
        path = Path(args.out).with_suffix(f".rank0-{world}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        spawn_local(_rank, world, world, args, str(path),
                    backend="nccl" if args.device == "cuda" else "gloo")  # fmt: skip
        step = statistics.median(json.loads(path.read_text()))
        path.unlink()
        rows.append({"configuration": f"{world} processes", "processes": world, "step_s": step})
    for row in rows:
        row["steps_per_s"] = 1.0 / row["step_s"]
        row["speed_vs_1_process"] = base / row["step_s"]
    report = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "cpu": platform.processor() or platform.machine(),
        "threads": args.threads,
        "d_in": args.d_in,
        "d_sae": 4 * args.d_in,
        "global_batch": args.batch,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(out)
    print(f"| {report['device']}, d = {args.d_in}, global batch {args.batch} | s/step | steps/s "
          "| speed vs 1 process |")  # fmt: skip
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['configuration']} | {row['step_s']:.3f} | {row['steps_per_s']:.2f} "
              f"| {row['speed_vs_1_process']:.2f}x |")  # fmt: skip
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        print(f"only {torch.cuda.device_count()} GPU here: no multi-GPU figure")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
