"""Tokens per second of training through SAELens' ``LanguageModelSAETrainingRunner`` (live
activations from a HookedTransformer), for a BAE against a ``standard`` and a ``topk`` SAE of the
same width on the same model, hook, tokens and batch, and where the time goes.

    python benchmarks/runner_throughput.py                      # SmolLM2-135M, layer 15, CPU
    python benchmarks/runner_throughput.py --device cuda --training-tokens 2000000 --out DIR

Every run happens in this process, one after the other, on one loaded model. Wall time is split
by wrapping SAELens' own methods: ``ActivationsStore.get_activations`` (the model's forward
passes), the rest of ``ActivationsStore.__next__`` (tokenised batches, the shuffling buffer) and
``SAETrainer.step`` (the SAE's forward, backward and Adam step); what is left is the trainer's own
bookkeeping. With ``--profile`` (the default) the runs are under the torch profiler, with the same
three regions as ``record_function`` labels, and the report lists each run's heaviest operators.
Writes ``DIR/runner_throughput.json`` and ``.md``; ratios are to the ``standard`` run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner, LoggingConfig
from sae_lens.saes.standard_sae import StandardTrainingSAEConfig
from sae_lens.saes.topk_sae import TopKTrainingSAEConfig
from sae_lens.training.activations_store import ActivationsStore
from sae_lens.training.sae_trainer import SAETrainer
from torch.profiler import ProfilerActivity, profile, record_function

import sae_lens_bae  # noqa: F401  (registers the BAE with SAELens)
from sae_lens_bae.data import default_corpus, load_token_dataset
from sae_lens_bae.models import load_model
from sae_lens_bae.saes.bae_recipes import BAE_RECIPES, bae_config

REGIONS = {
    "model forward": (ActivationsStore, "get_activations"),
    "activation store": (ActivationsStore, "__next__"),
    "SAE step": (SAETrainer, "step"),
}
"""Region name -> the SAELens method whose calls it times. ``activation store`` includes the
model's forward passes it triggers; the report subtracts them."""


class RegionTimer:
    """Wraps the methods of ``REGIONS`` for the duration of a ``with``: seconds and calls per
    region, each call inside a profiler ``record_function`` of the region's name; the codes'
    density of every step (a BAE's firing rate) is kept too."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(REGIONS, 0.0)
        self.calls = dict.fromkeys(REGIONS, 0)
        self.density: list[float] = []

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            with record_function(name):
                result = method(*args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            if name == "SAE step":
                self.density.append(float((result.feature_acts != 0).float().mean()))
            return result

        return timed

    @contextlib.contextmanager
    def installed(self) -> Iterator[RegionTimer]:
        originals = {name: getattr(cls, attr) for name, (cls, attr) in REGIONS.items()}
        try:
            for name, (cls, attr) in REGIONS.items():
                setattr(cls, attr, self._wrap(name, originals[name]))
            yield self
        finally:
            for name, (cls, attr) in REGIONS.items():
                setattr(cls, attr, originals[name])


def sae_config(
    architecture: str, d_in: int, d_sae: int, device: str, steps: int
) -> tuple[Any, float]:
    """(SAELens training config, learning rate) of each compared architecture for a run of
    ``steps`` steps (the BAE's phases in them)."""
    if architecture == "standard":
        return StandardTrainingSAEConfig(d_in=d_in, d_sae=d_sae, device=device), 5e-4
    if architecture == "topk":
        return TopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae, k=32, device=device), 5e-4
    return bae_config(d_in, d_sae, training_steps=steps, device=device), BAE_RECIPES["default"].lr


def run_one(
    architecture: str, model: Any, tokens: Any, args: argparse.Namespace, d_in: int
) -> dict[str, Any]:
    """Train one SAE through SAELens' runner; tokens/s and the split of its wall time."""
    steps = args.training_tokens // args.batch_size  # SAELens' total_training_steps
    cfg, lr = sae_config(architecture, d_in, args.expansion * d_in, args.device, steps)
    runner_cfg = LanguageModelSAERunnerConfig(
        sae=cfg,
        model_name=args.model,
        hook_name=args.hook,
        dataset_path="",
        is_dataset_tokenized=True,
        streaming=False,
        context_size=args.context_size,
        prepend_bos=False,
        training_tokens=args.training_tokens,
        train_batch_size_tokens=args.batch_size,
        lr=lr,
        device=args.device,
        seed=args.seed,
        logger=LoggingConfig(log_to_wandb=False),
        output_path=None,
        checkpoint_path=None,
        n_checkpoints=0,
    )
    timer = RegionTimer()
    torch.manual_seed(args.seed)
    activities = [ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    profiler = profile(activities=activities) if args.profile else contextlib.nullcontext()
    with timer.installed(), profiler as prof:
        runner = LanguageModelSAETrainingRunner(
            runner_cfg, override_dataset=tokens, override_model=model
        )
        start = time.perf_counter()
        runner.run()
        wall = time.perf_counter() - start
    seconds = dict(timer.seconds)
    seconds["activation store"] -= seconds["model forward"]  # its own work only
    seconds["other"] = wall - sum(seconds.values())
    result: dict[str, Any] = {
        "architecture": architecture,
        "wall_seconds": wall,
        "tokens": args.training_tokens,
        "tokens_per_second": args.training_tokens / wall,
        "seconds": seconds,
        "share": {name: value / wall for name, value in seconds.items()},
        "calls": timer.calls,
        "sae_step_ms": 1e3 * timer.seconds["SAE step"] / max(timer.calls["SAE step"], 1),
        "density_first_last": [timer.density[0], timer.density[-1]] if timer.density else None,
        "density_every_10_steps": timer.density[::10],
    }
    if prof is not None:
        events = prof.key_averages()
        result["top_operators"] = [
            {"name": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3, "calls": e.count}
            for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
        ]
    print(
        f"{architecture:9s} {result['tokens_per_second']:9.0f} tokens/s  "
        + "  ".join(f"{k} {v:.1f} s" for k, v in seconds.items()),
        flush=True,
    )
    return result


def markdown(info: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    base = runs[0]["tokens_per_second"]
    lines = [
        "# Training throughput through SAELens' runner",
        "",
        "; ".join(f"{k}: {v}" for k, v in info.items()),
        "",
        "| SAE | tokens/s | vs standard | SAE step ms | model forward | activation store | "
        "SAE step | other | code density first -> last |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        share = run["share"]
        density = run["density_first_last"]
        shown = f"{density[0]:.3f} -> {density[1]:.3f}" if density else "-"
        lines.append(
            f"| {run['architecture']} | {run['tokens_per_second']:.0f} | "
            f"{run['tokens_per_second'] / base:.2f} | {run['sae_step_ms']:.1f} | "
            f"{share['model forward']:.0%} | {share['activation store']:.0%} | "
            f"{share['SAE step']:.0%} | {share['other']:.0%} | {shown} |"
        )
    for run in runs:
        if "top_operators" in run:
            lines += ["", f"Heaviest operators, {run['architecture']} (self CPU ms, calls):", ""]
            lines += [
                f"- `{op['name']}` {op['self_cpu_ms']:.0f} ms, {op['calls']}"
                for op in run["top_operators"]
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--hook", default="blocks.15.hook_resid_post")
    parser.add_argument("--dataset", default=None, help="text source (default: embedded corpus)")
    parser.add_argument("--context-size", type=int, default=128)
    parser.add_argument("--training-tokens", type=int, default=102_400)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--expansion", type=int, default=4)
    parser.add_argument("--architectures", default="standard,topk,bae")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", type=Path, default=Path("runner_throughput"))
    args = parser.parse_args(argv)

    model = load_model(args.model, device=args.device)
    tokens = load_token_dataset(
        args.dataset or str(default_corpus()), model.tokenizer, args.context_size
    )
    d_in = model.cfg.d_model
    info = {
        "model": args.model,
        "hook": args.hook,
        "d_in": d_in,
        "d_sae": args.expansion * d_in,
        "batch": args.batch_size,
        "tokens": args.training_tokens,
        "sequences available": len(tokens),
        "device": args.device,
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "profiler": args.profile,
    }
    if args.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
    print(info, flush=True)
    runs = [run_one(a, model, tokens, args, d_in) for a in args.architectures.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    report = markdown(info, runs)
    payload = json.dumps({"info": info, "runs": runs}, indent=2)
    for name, text in (("runner_throughput.json", payload), ("runner_throughput.md", report)):
        tmp = args.out / (name + ".tmp")
        tmp.write_text(text)
        tmp.replace(args.out / name)
    print(report)


if __name__ == "__main__":
    main()
