"""``bae bench synth-sae``: the BAE beside SAELens' architectures on SAELens' SynthSAEBench.

A SAELens ``SyntheticModel`` (features in superposition with a known truth: Zipfian firing, a
hierarchy of mutually exclusive children, low-rank correlation, magnitudes) streams the data;
the BAE and SAELens' ``batchtopk``, ``jumprelu``, ``matryoshka_batchtopk`` and ``standard`` SAEs
train on it side by side through SAELens' ``MultiSAETrainer`` (one generated stream per seed
for every model), and every model is scored by ``eval_sae_on_synthetic_data`` on one fixed set,
during training (to show convergence) and at the end. Families are compared at matched L0 by
protocol v2's frontier verdicts. Beside it, feature-set entropy with a known answer: the exact
entropy of a model's support pattern (``support_entropy``) against the BAE's reading.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import torch
from sae_lens import (
    BatchTopKTrainingSAEConfig,
    JumpReLUTrainingSAEConfig,
    LoggingConfig,
    MatryoshkaBatchTopKTrainingSAEConfig,
    StandardTrainingSAEConfig,
)
from sae_lens.registry import get_sae_training_class
from sae_lens.synthetic import (
    FoldedNormalMagnitudeConfig,
    HierarchyConfig,
    LinearMagnitudeConfig,
    LowRankCorrelationConfig,
    OrthogonalizationConfig,
    SyntheticModel,
    SyntheticModelConfig,
    SyntheticSAERunnerConfig,
    ZipfianFiringProbabilityConfig,
)
from sae_lens.training.multi_sae_trainer import MultiSAETrainer
from tqdm.auto import tqdm

from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.experiments.synth_entropy import entropy_rows
from sae_lens_bae.experiments.synth_sae_report import write_outputs
from sae_lens_bae.experiments.synth_sae_score import (
    EvalSet,
    binary_ceiling,
    converged,
    score,
    target_l0,
)
from sae_lens_bae.models import cache_dir
from sae_lens_bae.reports import read_json, write_json
from sae_lens_bae.saes.bae_recipes import BAERecipe, bae_config
from sae_lens_bae.training.baselines import shared_schedule

__all__ = [
    "FAMILIES",
    "PRESETS",
    "REPORT",
    "Preset",
    "SynthSAEConfig",
    "Variant",
    "run",
    "synthetic_model",
]

REPORT = "synth.md"
FAMILIES = ("bae", "batchtopk", "jumprelu", "matryoshka_batchtopk", "standard")
"""The compared families, each at sparsity settings of its own knob (``Preset.settings``)."""


def bench_model_config(num_features: int, hidden_dim: int, seed: int) -> SyntheticModelConfig:
    """SynthSAEBench-16k's recipe (SAELens' published config) at ``num_features`` features in
    ``hidden_dim`` dimensions: its roots scale with the features (128 of 16,384), every other
    setting is the published one."""
    return SyntheticModelConfig(
        num_features=num_features,
        hidden_dim=hidden_dim,
        firing_probability=ZipfianFiringProbabilityConfig(
            exponent=0.5, max_prob=0.4, min_prob=5e-4
        ),
        hierarchy=HierarchyConfig(
            total_root_nodes=max(1, 128 * num_features // 16_384),
            branching_factor=4,
            max_depth=3,
            mutually_exclusive_portion=1.0,
            mutually_exclusive_min_depth=0,
            compensate_probabilities=True,
            scale_children_by_parent=True,
        ),
        orthogonalization=OrthogonalizationConfig(num_steps=100, lr=3e-4),
        correlation=LowRankCorrelationConfig(rank=25, correlation_scale=0.1),
        mean_firing_magnitudes=LinearMagnitudeConfig(start=5.0, end=4.0),
        std_firing_magnitudes=FoldedNormalMagnitudeConfig(mean=0.5, std=0.5),
        bias=0.5,
        seed=seed,
    )


@dataclass(frozen=True)
class Preset:
    """A benchmark size: the model, the SAEs' width, the training and each family's settings
    (TopK-like families by k relative to the target L0, the others by their own knob)."""

    num_features: int
    hidden_dim: int
    width: int
    training_samples: int
    lr: float
    settings: dict[str, tuple[float, ...]]
    batch_size: int = 1024
    evaluations: int = 16
    eval_samples: int = 16_384
    published: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)


PRESETS = {
    "cpu": Preset(
        num_features=1024,
        hidden_dim=48,
        width=256,
        training_samples=12_288_000,
        lr=3e-3,
        settings={
            "bae": (215.0, 256.0, 304.0, 362.0, 431.0),
            "batchtopk": (0.71, 1.0, 1.41),
            "jumprelu": (2.0, 2.83, 4.0),
            "matryoshka_batchtopk": (0.71, 1.0, 1.41),
            "standard": (2.83, 4.0, 5.66),
        },
    ),
    "16k": Preset(
        num_features=16_384,
        hidden_dim=768,
        width=4096,
        training_samples=20_480_000,
        lr=3e-4,
        settings={
            "bae": (0.25, 0.5, 1.0),
            "batchtopk": (0.8, 1.0, 1.25),
            "jumprelu": (0.5, 1.0, 2.0),
            "matryoshka_batchtopk": (0.8, 1.0, 1.25),
            "standard": (1.0, 2.0, 4.0),
        },
        eval_samples=100_000,
        published={
            25: {
                "batchtopk": {"f1": 0.7316, "mcc": 0.7574, "uniqueness": 0.9837, "ev": 0.7923},
                "matryoshka_batchtopk": {
                    "f1": 0.8793,
                    "mcc": 0.7927,
                    "uniqueness": 0.9987,
                    "ev": 0.7792,
                },
                "jumprelu": {"f1": 0.7317, "mcc": 0.7527, "uniqueness": 0.9885, "ev": 0.7951},
                "standard": {"f1": 0.5562, "mcc": 0.6039, "uniqueness": 0.8976, "ev": 0.7654},
            },
            20: {
                "batchtopk": {"f1": 0.8183, "mcc": 0.7526, "uniqueness": 0.9760, "ev": 0.7889},
                "matryoshka_batchtopk": {
                    "f1": 0.8601,
                    "mcc": 0.7455,
                    "uniqueness": 0.9874,
                    "ev": 0.7699,
                },
                "jumprelu": {"f1": 0.8241, "mcc": 0.7434, "uniqueness": 0.9781, "ev": 0.7906},
                "standard": {"f1": 0.5777, "mcc": 0.5834, "uniqueness": 0.8528, "ev": 0.7501},
            },
        },
    ),
    "test": Preset(
        num_features=128,
        hidden_dim=16,
        width=32,
        training_samples=16_384,
        lr=1e-3,
        settings={family: (0.5, 1.0, 2.0) for family in FAMILIES},
        batch_size=256,
        evaluations=4,
        eval_samples=2048,
    ),
}
"""``cpu``: the 16k recipe at 1/16 of its features (the same features per dimension and width
per feature), sized for 2 CPU cores; ``16k``: SynthSAEBench-16k with the published lr 3e-4,
batch 1024 and width 4096 (every preset trains with the project's one schedule) at a sample
count one GPU command fits, with the published SAELens table (200M samples) beside it;
``test``: seconds, for tests."""


@dataclass
class SynthSAEConfig:
    """What ``bae bench synth-sae`` runs; ``cpu`` fits 60 minutes on 2 CPU cores."""

    preset: Literal["cpu", "16k", "test"] = "cpu"
    """cpu (1,024 features in 48 dimensions, width 256), 16k (SynthSAEBench-16k, width 4096) or
    test (seconds)."""
    synthetic_model: str | None = None
    """A saved SyntheticModel folder or hub name, e.g. decoderesearch/synth-sae-bench-16k-v2
    (default: the preset's config, built once on the device and cached)."""
    families: Sequence[str] = FAMILIES
    """Families to train, from bae, batchtopk, jumprelu, matryoshka_batchtopk, standard."""
    seeds: Sequence[int] = ranged((0, 1, 2), low=0)
    """Training seeds (each one generated stream shared by every model of the seed)."""
    training_samples: int | None = ranged(None, low=1)
    """Samples per model (default: the preset's)."""
    entropy: bool = True
    """Also read the feature-set entropy cells (exact support entropy against the BAE)."""
    workers: int | None = ranged(None, low=1)
    """Processes, one torch thread each, that the jobs (each seed, the entropy cells) share
    (default: one per job, so the cores are never idle while a job is left)."""
    device: str = "cpu"
    """Torch device of training and scoring."""
    out: Path = Path("runs/synth-sae")
    """Folder for synth.md, synth.json, synth.png and the finished jobs (a rerun resumes)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        unknown = sorted(set(self.families) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
        if not self.families or not self.seeds:
            raise ValueError("families and seeds need at least one entry each")

    @property
    def spec(self) -> Preset:
        return PRESETS[self.preset]


def synthetic_model(cfg: SynthSAEConfig, device: str = "cpu") -> SyntheticModel:
    """The benchmark's model: ``cfg.synthetic_model`` (a folder or hub name), or the preset's
    config built once on ``device`` and cached under the package's cache folder."""
    source = cfg.synthetic_model
    if source is not None:
        try:
            return SyntheticModel.load_from_source(source, device=device)
        except OSError as error:  # a missing folder or file, or an unreachable hub
            raise ValueError(
                f"cannot load the synthetic model {source!r} ({error}); give a folder written "
                "by SyntheticModel.save or a reachable hub name"
            ) from None
    model_cfg = bench_model_config(cfg.spec.num_features, cfg.spec.hidden_dim, seed=42)
    held = {**model_cfg.to_dict(), "built_on": torch.device(device).type}  # RNGs differ by device
    digest = hashlib.sha256(json.dumps(held, sort_keys=True).encode()).hexdigest()
    folder = cache_dir() / "synthetic" / digest[:16]
    if not (folder / "synthetic_model_config.json").exists():
        built = SyntheticModel(model_cfg, device=device)
        partial = folder.with_name(folder.name + ".partial")
        built.save(partial)
        partial.replace(folder)  # whole or absent: a killed build is built again
    return SyntheticModel.load_from_disk(folder, device=device)


def family_config(
    family: str, setting: float, preset: Preset, target: float, steps: int, **bae_fields: Any
) -> Any:
    """SAELens' training config of ``family`` at ``setting``: k = setting x the target L0 for
    the TopK-like families, the BAE's coefficient scale, JumpReLU's L0 or the L1 coefficient.
    ``bae_fields`` are a recipe variant's config fields (``d_sae`` its width): like a recipe's,
    its coefficients are scaled by ``setting``."""
    d_in, width = preset.hidden_dim, preset.width
    if family == "bae":
        recipe = BAERecipe(lr=preset.lr, fields=bae_fields)
        return bae_config(
            d_in, width, recipe=recipe, coefficient_scale=setting, training_steps=steps
        )
    common: dict[str, Any] = {"d_in": d_in, "d_sae": width}
    if family in ("batchtopk", "matryoshka_batchtopk"):
        k = max(1, round(setting * target))
        if family == "batchtopk":
            return BatchTopKTrainingSAEConfig(**common, k=k)
        widths = [width // 32, width // 8, width // 2, width]
        return MatryoshkaBatchTopKTrainingSAEConfig(**common, k=k, matryoshka_widths=widths)
    if family == "jumprelu":
        return JumpReLUTrainingSAEConfig(**common, l0_coefficient=setting)
    return StandardTrainingSAEConfig(**common, l1_coefficient=setting)


def run(cfg: SynthSAEConfig) -> dict[str, Any]:
    """Train and score every family at every setting and seed, read the entropy cells, and write
    ``synth.md``, ``synth.json`` and ``synth.png`` to ``cfg.out``. Finished jobs (a seed, the
    entropy cells) are kept in ``cfg.out/jobs/``: a rerun of the same config goes on from them."""
    out = Path(cfg.out)
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    synthetic_model(cfg, cfg.device)  # build (or fetch) once, before the workers load it
    fingerprint = _fingerprint(cfg)
    jobs: list[tuple[str, Any]] = [("seed", seed) for seed in cfg.seeds]
    if cfg.entropy:
        jobs.append(("entropy", 0))
    results = {}
    todo = []
    for job in jobs:
        held = _finished(out, job, fingerprint)
        if held is None:
            todo.append(job)
        else:
            results[job] = held
    if len(todo) < len(jobs):
        print(f"resuming from {out}/jobs: {len(jobs) - len(todo)} of {len(jobs)} jobs kept")
    workers = cfg.workers or max(1, len(todo))
    context = get_context("spawn")
    with ProcessPoolExecutor(workers, context, _start_worker, (os.getpid(),)) as pool:
        running = {job: pool.submit(_run_job, cfg, job, fingerprint) for job in todo}
        for job, future in tqdm(running.items(), desc="synth-sae jobs", unit="job"):
            results[job] = future.result()
    rows = [row for job in jobs if job[0] == "seed" for row in results[job]["rows"]]
    model_info = results[("seed", cfg.seeds[0])]["model"]
    entropy = results.get(("entropy", 0), {}).get("rows", [])
    return write_outputs(out, cfg, model_info, rows, entropy)


def _fingerprint(cfg: SynthSAEConfig) -> str:
    """What a finished job must have been run with to be kept."""
    held = {
        "preset": asdict(cfg.spec),  # a preset changed since is trained again
        "synthetic_model": cfg.synthetic_model,
        "families": list(cfg.families),
        "training_samples": cfg.training_samples,
        "device": cfg.device,
    }
    return hashlib.sha256(json.dumps(held, sort_keys=True).encode()).hexdigest()[:16]


def _job_path(out: Path, job: tuple[str, Any]) -> Path:
    return out / "jobs" / f"{job[0]}-{job[1]}.json"


def _finished(out: Path, job: tuple[str, Any], fingerprint: str) -> dict[str, Any] | None:
    path = _job_path(out, job)
    if not path.exists():
        return None
    held = read_json(path, "a finished synth-sae job", f"delete {path} to run that job again")
    return held if held.get("fingerprint") == fingerprint else None


def _start_worker(parent: int) -> None:
    """A worker: one torch thread, and gone when the run that started it is (a killed run
    leaves no worker training on)."""
    torch.set_num_threads(1)
    threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()


def exit_with_parent(parent: int, every: float = 5.0) -> None:
    """End this process once its parent is no longer ``parent`` (it was killed)."""
    while os.getppid() == parent:
        time.sleep(every)
    os._exit(1)


def _run_job(cfg: SynthSAEConfig, job: tuple[str, Any], fingerprint: str) -> dict[str, Any]:
    """One worker's job, written whole to ``out/jobs`` when done."""
    kind, value = job
    if kind == "entropy":
        result: dict[str, Any] = {"rows": entropy_rows(seed=value, device=cfg.device)}
    else:
        result = train_seed(cfg, value)
    result["fingerprint"] = fingerprint
    write_json(_job_path(Path(cfg.out), job), result)
    return result


class _Stream:
    """One seed's generated training stream, shared by every model (``MultiSAETrainer``'s
    data provider); before each batch it lets ``before`` score the models (the evaluations)."""

    def __init__(self, model: SyntheticModel, batch_size: int, hook: str, before: Any) -> None:
        self.model, self.batch_size, self.hook, self.before, self.count = (
            model,
            batch_size,
            hook,
            before,
            0,
        )

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        self.before(self.count)
        self.count += 1
        return {self.hook: self.model.sample(self.batch_size)}


@dataclass(frozen=True)
class Variant:
    """A BAE recipe variant: config fields replacing the BAE's (``d_sae`` its width; its
    coefficients scaled by each setting as a recipe's are) at its own coefficient scales."""

    fields: dict[str, Any]
    settings: tuple[float, ...] | None = None
    """Coefficient scales (default: the preset's BAE settings)."""


def train_seed(
    cfg: SynthSAEConfig, seed: int, variants: dict[str, Variant] | None = None
) -> dict[str, Any]:
    """Every model of one seed on one stream; rows with their final scores and histories.
    ``variants`` adds each as the family ``bae:NAME`` on the same stream (what a recipe study
    compares with the BAE)."""
    spec, model = cfg.spec, synthetic_model(cfg, cfg.device)
    samples = cfg.training_samples or spec.training_samples
    steps = samples // spec.batch_size
    fit = EvalSet.draw(model, spec.eval_samples, seed=10_000 + seed)
    data = EvalSet.draw(model, spec.eval_samples, seed=20_000 + seed)
    target = target_l0(data.feature_acts, spec.width)
    torch.manual_seed(seed)
    configs = {
        (family, setting): family_config(family, setting, spec, target, steps)
        for family in cfg.families
        for setting in spec.settings[family]
    }
    for name, variant in (variants or {}).items():
        for setting in variant.settings or spec.settings["bae"]:
            configs[f"bae:{name}", setting] = family_config(
                "bae", setting, spec, target, steps, **variant.fields
            )
    names = {key: f"{key[0]}@{key[1]}" for key in configs}
    saes = _training_saes(configs, names, cfg.device)
    history: dict[str, list[dict[str, float]]] = {name: [] for name in saes}
    every = max(1, steps // spec.evaluations)

    def evaluate(count: int) -> None:
        if count == 0 or count % every:
            return
        for name, sae in saes.items():
            history[name].append({"step": count, **_brief(score(sae, data))})
            sae.train()

    trainer_cfg = SyntheticSAERunnerConfig(
        synthetic_model=model.cfg,
        sae=next(iter(configs.values())),
        training_samples=steps * spec.batch_size,
        batch_size=spec.batch_size,
        **shared_schedule(spec.lr, steps),  # every comparison's schedule and dead-latent window
        device=cfg.device,
        checkpoint_path=None,
        output_path=None,
        logger=LoggingConfig(log_to_wandb=False),
    ).to_sae_trainer_config()
    stream = _Stream(model, spec.batch_size, "synthetic", evaluate)
    trainer = MultiSAETrainer(
        trainer_cfg,
        saes,
        dict.fromkeys(saes, "synthetic"),
        stream,  # type: ignore[arg-type]
    )
    trainer.fit()
    ceilings = {
        width: binary_ceiling(fit, data, width)
        for width in {sae.cfg.d_sae for sae in saes.values()}
    }
    rows = []
    for (family, setting), name in names.items():
        final = score(saes[name], data)
        history[name].append({"step": steps, **_brief(final)})
        rows.append(
            {
                "family": family,
                "setting": setting,
                "seed": seed,
                "split": "test",
                **final,
                "ev_ceiling": ceilings[saes[name].cfg.d_sae],
                "converged": converged(history[name]),
                "history": history[name],
            }
        )
    info = {"config": model.cfg.to_dict(), "target_l0": target, "steps": steps}
    return {"rows": rows, "model": info}


def _training_saes(configs: dict[Any, Any], names: dict[Any, str], device: str) -> dict[str, Any]:
    saes = {}
    for key, config in configs.items():
        sae_class, _ = get_sae_training_class(config.architecture())
        saes[names[key]] = sae_class(config).to(device)
    return saes


def _brief(scores: dict[str, Any]) -> dict[str, float]:
    """What a training-time evaluation keeps: the convergence metrics and L0."""
    return {key: float(scores[key]) for key in ("l0", "mcc", "f1", "explained_variance")}
