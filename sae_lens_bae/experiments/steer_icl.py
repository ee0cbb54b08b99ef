"""``bae steer icl``: can a task vector make a 0-shot prompt behave like an 8-shot one?

Positive set: the last-token states of k-shot prompts (k = 8); negative set: the same queries
0-shot. A BAE and SAELens baselines are trained on the states of every token of those prompts,
on ``bae compare``'s schedule with each family's dead-latent remedy;
each gives a task vector (``task_vector``), and the plain difference of means is the feature-free
reference. Every vector is added at the last token of held-out 0-shot prompts over a sweep of
strengths (with ``run_with_hooks``), and the 0-shot accuracy is read from the label words'
logits. With ``normalise`` (default) every vector is rescaled to the norm of the mean difference,
so a strength means the same displacement for every model and only the direction differs.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from sae_lens_bae.activations import hook_point, hook_width, norm_scale, prompt_states
from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.experiments.common import LabelledSentences
from sae_lens_bae.models import load_model
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.prompts import (
    ICLTemplate,
    build_icl_prompts,
    encode_prompts,
    first_token_ids,
)
from sae_lens_bae.reports import Stopwatch, markdown_table, write_json, write_text
from sae_lens_bae.steering import SteeredClassifier, label_accuracy, mean_difference, task_vector
from sae_lens_bae.training import (
    TRAINED_BASELINES,
    baseline_configs,
    family_config,
    shared_schedule,
    train_sae,
)

__all__ = [
    "REPORT",
    "STRENGTH_CAP",
    "SteerICLConfig",
    "plot_steering",
    "run",
    "sweep_strengths",
    "turned_down",
]

REPORT = "steer.md"


@dataclass
class SteerICLConfig(LabelledSentences):
    """What ``bae steer icl`` runs; the defaults fit 30 minutes on a 2-core CPU with SmolLM2."""

    layer: int | None = ranged(None, low=0)
    """Block of a --hook inside a block (default: the middle one)."""
    hook: str = "hook_resid_post"
    """Hook point that is steered: a full TransformerLens name, or a name inside block --layer."""
    shots: int = ranged(8, low=0)
    """Demonstrations in the positive prompts."""
    vector_prompts: int = ranged(128, low=1)
    """Queries whose k-shot and 0-shot states make the vectors."""
    eval_prompts: int = ranged(256, low=1)
    """Held-out 0-shot queries the vectors are tested on."""
    template: ICLTemplate = field(default_factory=ICLTemplate)
    """How demonstrations and the query are written."""
    top: int = ranged(256, low=1)
    """Features kept in each task vector."""
    baselines: Sequence[str] = ("standard", "topk15")
    """SAELens baselines whose task vectors are compared (see bae compare)."""
    expansion: int = ranged(4, low=1)
    """d_sae / d_in of the BAE and each SAE."""
    steps: int = ranged(1000, low=1)
    """Training steps of the BAE and each SAE."""
    batch_size: int = ranged(512, low=1)
    """Activations per training step."""
    lr: float = ranged(2e-3, above=0.0)
    """Adam learning rate of the BAE and every SAE (what ``bae compare`` chose on validation)."""
    strengths: Sequence[float] = (0.5, 1.0, 2.0, 4.0, 8.0)
    """Steering strengths swept first; the sweep goes on past them until every vector's accuracy
    has turned down (up to STRENGTH_CAP)."""
    normalise: bool = True
    """Rescale every vector to the mean difference's norm (only the direction differs)."""
    prompt_batch_size: int = ranged(16, low=1)
    """Prompts per forward pass."""
    device: str = "cpu"
    """Torch device."""
    seed: int = 0
    """Seed of the prompts and the models."""
    out: Path = Path("runs/steer_icl")
    """Report folder."""

    def __post_init__(self) -> None:
        check_ranges(self)
        unknown = [b for b in self.baselines if b not in TRAINED_BASELINES]
        if unknown:
            raise ValueError(
                f"baselines {unknown}: choose among {', '.join(TRAINED_BASELINES)} (SAEs of the "
                "steered hook point)"
            )


STRENGTH_CAP = 64.0
"""The sweep goes on past ``strengths`` by doubling the largest strength until every vector's
accuracy has turned down (it is below that vector's best at the largest strength swept), up to
this strength (64 times the mean difference's norm when normalised: far past any useful push)."""


def run(cfg: SteerICLConfig, progress: bool = True) -> dict[str, Any]:
    """The whole experiment; writes ``steer.json``, ``steer.md`` and ``steer.png``; returns the
    JSON summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    watch = Stopwatch("steer icl")
    pairs = _shuffled_pairs(cfg)
    model = load_model(cfg.model, device=cfg.device)
    hook = hook_point(model, cfg.hook, cfg.layer)
    labels = sorted({label for _, label in pairs})
    # every model as ``bae compare`` trains its families: one schedule, each with its remedy;
    # built before any state is gathered, so a setting the width refuses (a k above d_sae)
    # ends the run in seconds
    d_in = hook_width(model, hook)
    configs = {
        "bae": family_config("bae", d_in, cfg.expansion * d_in, 1.0, cfg.steps),
        **baseline_configs(d_in, cfg.expansion, cfg.baselines, cfg.steps),
    }
    # held-out 0-shot queries first; the vector queries and their demonstrations come after them
    sets = _prompt_sets(cfg, model, hook, pairs[cfg.eval_prompts :], labels, progress)
    watch.lap("gather states")
    vectors, norms, scale, n_train = _task_vectors(cfg, configs, sets)
    watch.lap("train")
    label_ids = first_token_ids(model.tokenizer, labels)
    prompts = build_icl_prompts(pairs, 0, cfg.eval_prompts, template=cfg.template, seed=cfg.seed)
    tokens, last = encode_prompts([p for p, _ in prompts], model.tokenizer)
    truth = torch.tensor([labels.index(y) for _, y in prompts])
    classifier = SteeredClassifier(
        model, tokens, last[:, 0], label_ids, truth, hook, batch_size=cfg.prompt_batch_size
    )
    unsteered = classifier.accuracy()
    positive = sets["positive"]
    k_shot = label_accuracy(
        model,
        positive["tokens"],
        positive["lastpos"],
        label_ids,
        positive["truth"],
        batch_size=cfg.prompt_batch_size,
    )
    results = sweep_strengths(
        lambda name, s: classifier.accuracy(vectors[name], s),
        list(vectors),
        cfg.strengths,
        unsteered,
        progress,
    )
    watch.lap("steer")
    rows = [_row(name, results[name], *norms[name]) for name in vectors]
    summary = {
        "config": asdict(cfg),
        "hook": hook,
        "labels": labels,
        "unsteered_0_shot_accuracy": unsteered,
        f"{cfg.shots}_shot_accuracy_ovector_prompts": k_shot,
        "activation_scale": scale,
        "training_states": n_train,
        "strength_cap": STRENGTH_CAP,
        "models": rows,
        "seconds": watch.seconds,
    }
    _write_outputs(cfg, out, summary, hook)
    watch.lap("report")
    return summary


def _shuffled_pairs(cfg: SteerICLConfig) -> list[tuple[str, str]]:
    """The labelled sentences in the seed's order, refused when too few for the prompts."""
    pairs = cfg.pairs()
    random.Random(cfg.seed).shuffle(pairs)
    needed = cfg.eval_prompts + cfg.vector_prompts + cfg.shots
    if len(pairs) < needed:
        raise ValueError(
            f"{len(pairs)} labelled sentences, but {cfg.eval_prompts} held-out queries + "
            f"{cfg.vector_prompts} vector queries + {cfg.shots} demonstrations are needed"
        )
    return pairs


def _prompt_sets(
    cfg: SteerICLConfig,
    model: Any,
    hook: str,
    rest: list[tuple[str, str]],
    labels: list[str],
    progress: bool,
) -> dict[str, dict[str, torch.Tensor]]:
    """The positive (k-shot) and negative (0-shot) vector prompts: the states of every token,
    of each prompt's last token, the tokens, last positions and right labels."""
    sets = {}
    for name, shots in (("positive", cfg.shots), ("negative", 0)):
        prompts = build_icl_prompts(
            rest, shots, cfg.vector_prompts, template=cfg.template, seed=cfg.seed
        )
        tokens, last = encode_prompts([p for p, _ in prompts], model.tokenizer)
        every, _, at_last = prompt_states(
            model,
            tokens,
            last[:, 0],
            hook,
            batch_size=cfg.prompt_batch_size,
            progress=progress,
            desc=f"{name} prompts ({shots}-shot)",
        )
        truth = torch.tensor([labels.index(y) for _, y in prompts])
        sets[name] = {
            "every": every,
            "last": at_last,
            "tokens": tokens,
            "lastpos": last[:, 0],
            "truth": truth,
        }
    return sets


def _task_vectors(
    cfg: SteerICLConfig, configs: dict[str, Any], sets: dict[str, dict[str, torch.Tensor]]
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[float, float]], float, int]:
    """Every model trained on the states of every token of the vector prompts, and its task
    vector beside the mean difference: (vectors, (raw norm, cosine to the mean difference) per
    vector, the training states' scale, their number)."""
    train = torch.cat([sets["positive"]["every"], sets["negative"]["every"]])
    scale = norm_scale(train)
    train = train[torch.randperm(train.shape[0], generator=torch.Generator().manual_seed(cfg.seed))]
    trainer = {
        "training_samples": cfg.steps * cfg.batch_size,
        "batch_size": cfg.batch_size,
        "device": cfg.device,
        "seed": cfg.seed,
    }
    positive, negative = sets["positive"]["last"], sets["negative"]["last"]
    vectors = {}
    for name, sae_cfg in configs.items():
        sae = train_sae(train * scale, sae_cfg, **shared_schedule(cfg.lr, cfg.steps), **trainer).sae
        vectors[name] = task_vector(sae.eval(), positive, negative, cfg.top, input_scale=scale)
    reference = mean_difference(positive, negative)
    vectors["mean_difference"] = reference
    raw_norms = {name: float(v.norm()) for name, v in vectors.items()}
    if cfg.normalise:
        vectors = {
            name: v * (reference.norm() / v.norm().clamp_min(1e-12)) for name, v in vectors.items()
        }
    norms = {
        name: (raw_norms[name], float(torch.cosine_similarity(v, reference, dim=0)))
        for name, v in vectors.items()
    }
    return vectors, norms, scale, int(train.shape[0])


def turned_down(by_strength: dict[str, float]) -> bool:
    """Whether the accuracy at the largest strength swept is below the best: the best lies
    inside the sweep, not at its edge."""
    largest = max(by_strength, key=float)
    return by_strength[largest] < max(by_strength.values())


def sweep_strengths(
    accuracy: Callable[[str, float], float],
    names: list[str],
    strengths: Sequence[float],
    unsteered: float,
    progress: bool = True,
) -> dict[str, dict[str, float]]:
    """``accuracy(name, strength)`` of every vector at ``strengths`` (and 0: ``unsteered``), then
    at twice the largest strength swept, again and again, until every vector's accuracy has
    ``turned_down`` or the next strength would pass ``STRENGTH_CAP``."""
    results: dict[str, dict[str, float]] = {name: {"0": unsteered} for name in names}
    pending = sorted(strengths)
    with tqdm(desc="steered 0-shot accuracy", disable=not progress) as bar:
        while pending:
            for name in names:
                for strength in pending:
                    results[name][str(float(strength))] = accuracy(name, strength)
                    bar.update()
            largest = max(float(s) for s in results[names[0]])
            done = all(turned_down(by_strength) for by_strength in results.values())
            pending = [] if done or 2 * largest > STRENGTH_CAP else [2 * largest]
    return results


def _row(name: str, by_strength: dict[str, float], raw_norm: float, cosine: float) -> dict:
    """One vector's line: its best strength (the smallest of equal accuracies), whether that
    best is a peak inside the sweep, its norm and direction."""
    best = max(by_strength, key=lambda s: (by_strength[s], -float(s)))
    return {
        "model": name,
        "best_strength": float(best),
        "best_accuracy": by_strength[best],
        "peaked": turned_down(by_strength),
        "raw_norm": raw_norm,
        "cosine_to_mean_difference": cosine,
        "accuracy": by_strength,
    }


def _write_outputs(cfg: SteerICLConfig, out: Path, summary: dict[str, Any], hook: str) -> None:
    """``steer.json``, ``steer.png`` and ``steer.md`` (one column per strength swept)."""
    rows, unsteered = summary["models"], summary["unsteered_0_shot_accuracy"]
    k_shot = summary[f"{cfg.shots}_shot_accuracy_ovector_prompts"]
    write_json(out / "steer.json", summary)
    title = f"{cfg.model} {hook}: steering 0-shot prompts"
    plot_steering(rows, unsteered, k_shot, cfg.shots, out / "steer.png", title=title)
    header = (
        f"# Steering 0-shot prompts with {cfg.shots}-shot task vectors: {cfg.model} `{hook}`\n\n"
        f"0-shot accuracy without steering: {unsteered:.3f} on {cfg.eval_prompts} held-out "
        f"prompts; {cfg.shots}-shot accuracy on the {cfg.vector_prompts} vector prompts: "
        f"{k_shot:.3f}. Vectors keep the top {cfg.top} features"
        + (", rescaled to the mean difference's norm. " if cfg.normalise else ". ")
        + "The sweep doubles its largest strength until every vector's accuracy has turned down "
        f"or the strength would pass {STRENGTH_CAP:g}; a best marked * is at the sweep's edge "
        "(no peak inside it).\n\n"
    )
    strengths = sorted(rows[0]["accuracy"], key=float)
    columns = [("model", lambda r: r["model"])]
    columns += [(f"α={s}", lambda r, s=s: f"{r['accuracy'][s]:.3f}") for s in strengths]
    columns += [
        (
            "best",
            lambda r: (
                f"{r['best_accuracy']:.3f} (α={r['best_strength']:g})"
                + ("" if r["peaked"] else "*")
            ),
        ),
        ("cos to mean diff.", lambda r: f"{r['cosine_to_mean_difference']:.3f}"),
        ("raw ‖v‖", lambda r: f"{r['raw_norm']:.2f}"),
    ]
    write_text(out / "steer.md", header + markdown_table(rows, columns))


def plot_steering(
    rows: list[dict], unsteered: float, k_shot: float, shots: int, path: str | Path, title: str = ""
) -> Path:
    """0-shot accuracy against steering strength, one curve per model's task vector, with the
    unsteered 0-shot and the k-shot accuracies as reference lines."""
    fig, ax = subplots(figsize=(6.5, 4.5))
    for n, row in enumerate(rows):
        strengths = sorted(row["accuracy"], key=float)
        ax.plot(
            [float(s) for s in strengths],
            [row["accuracy"][s] for s in strengths],
            "o-",
            color=f"C{n}",
            label=row["model"],
            markersize=4,
        )
    ax.axhline(unsteered, color="gray", linestyle=":", label="0-shot, no steering")
    ax.axhline(k_shot, color="k", linestyle="--", linewidth=1, label=f"{shots}-shot")
    ax.set(xlabel="strength α", ylabel="0-shot accuracy", title=title)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
