"""``bae steer icl``: can a task vector make a 0-shot prompt behave like an 8-shot one?

Positive set: the last-token states of k-shot prompts (k = 8); negative set: the same queries
0-shot. A BAE and SAELens baselines are trained on the states of every token of those prompts;
each gives a task vector (``task_vector``), and the plain difference of means is the feature-free
reference. Every vector is added at the last token of held-out 0-shot prompts over a sweep of
strengths (with ``run_with_hooks``), and the 0-shot accuracy is read from the label words'
logits. With ``normalise`` (default) every vector is rescaled to the norm of the mean difference,
so a strength means the same displacement for every model and only the direction differs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from sae_lens_bae.entropy.icl import (
    ICLTemplate,
    build_icl_prompts,
    encode_prompts,
    load_icl_pairs,
)
from sae_lens_bae.entropy.states import first_token_ids, gather_states
from sae_lens_bae.reports import Stopwatch, markdown_table, write_json
from sae_lens_bae.steering.hooks import steering_hook
from sae_lens_bae.steering.vectors import mean_difference, task_vector

__all__ = [
    "SteerICLConfig",
    "SteeredClassifier",
    "label_accuracy",
    "prompt_states",
    "run_steer_icl",
]


@dataclass
class SteerICLConfig:
    """What ``bae steer icl`` runs; the defaults fit 30 minutes on a 2-core CPU with SmolLM2."""

    dataset: str
    model: str = "smollm2-135m"
    split: str = "train"
    text_column: str | None = None
    label_column: str = "label"
    label_words: dict[str, str] | None = None
    layer: int = 15
    hook: str = "hook_resid_post"
    shots: int = 8
    n_vector_prompts: int = 128  # queries whose k-shot / 0-shot states make the vectors
    n_eval_prompts: int = 256  # held-out 0-shot queries the vectors are tested on
    max_sentence_words: int | None = 24
    template: ICLTemplate = field(default_factory=ICLTemplate)
    top: int = 256
    baselines: Sequence[str] = ("standard", "topk15")
    expansion: int = 4
    steps: int = 1000
    batch_size: int = 512
    lr: float = 5e-4  # the SAEs'; the BAE trains with SHORT_RUN_LR
    strengths: Sequence[float] = (0.5, 1.0, 2.0, 4.0, 8.0)
    normalise: bool = True
    prompt_batch_size: int = 16
    device: str = "cpu"
    seed: int = 0
    out: Path = Path("runs/steer_icl")


@torch.no_grad()
def label_accuracy(
    model: HookedTransformer,
    tokens: Int[Tensor, "n ctx"],
    last: Int[Tensor, " n"],
    label_ids: Sequence[int],
    truth: Int[Tensor, " n"],
    *,
    hook_name: str | None = None,
    vector: Float[Tensor, " d"] | None = None,
    strength: float = 0.0,
    batch_size: int = 16,
) -> float:
    """Fraction of prompts whose label-word logit at the last real token is the right one,
    optionally with ``strength * vector`` added at that token of ``hook_name``."""
    ids = torch.as_tensor(list(label_ids), device=model.cfg.device)
    correct = 0
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size].to(model.cfg.device)
        rows_last = last[start : start + batch_size].to(model.cfg.device)
        hooks = []
        if vector is not None and strength != 0.0:
            assert hook_name is not None
            hooks = [(hook_name, steering_hook(vector, strength, positions=rows_last))]
        logits = model.run_with_hooks(batch, fwd_hooks=hooks, prepend_bos=False)
        at_last = logits[torch.arange(batch.shape[0]), rows_last][:, ids]
        correct += int((at_last.argmax(-1).cpu() == truth[start : start + batch_size]).sum())
    return correct / tokens.shape[0]


class SteeredClassifier:
    """``label_accuracy`` for many (vector, strength) pairs on the same prompts, steering a hook
    of block ``layer``: the residual stream entering that block is computed once, and each
    evaluation runs only blocks ``layer``.. with the steering hook, and reads the label-word
    logits at the last tokens (never the whole vocabulary)."""

    @torch.no_grad()
    def __init__(
        self,
        model: HookedTransformer,
        tokens: Int[Tensor, "n ctx"],
        last: Int[Tensor, " n"],
        label_ids: Sequence[int],
        truth: Int[Tensor, " n"],
        hook_name: str,
        batch_size: int = 16,
    ) -> None:
        from sae_lens_bae.activations import _layer_of, check_hooks

        check_hooks(model, [hook_name])
        layer = _layer_of(hook_name)
        if layer is None:
            raise ValueError(f"{hook_name} is not inside a block (blocks.L....)")
        self.model, self.layer, self.hook_name, self.truth = model, layer, hook_name, truth
        self.ids = torch.as_tensor(list(label_ids), device=model.cfg.device)
        self.batches = []
        for start in range(0, tokens.shape[0], batch_size):
            batch = tokens[start : start + batch_size].to(model.cfg.device)
            resid = model(batch, stop_at_layer=layer, prepend_bos=False)
            self.batches.append((resid, last[start : start + batch_size].to(model.cfg.device)))

    @torch.no_grad()
    def accuracy(self, vector: Float[Tensor, " d"] | None = None, strength: float = 0.0) -> float:
        model, correct, seen = self.model, 0, 0
        for resid, rows_last in self.batches:
            hooks = []
            if vector is not None and strength != 0.0:
                hooks = [(self.hook_name, steering_hook(vector, strength, positions=rows_last))]
            final = model.run_with_hooks(
                resid.clone(),
                start_at_layer=self.layer,
                stop_at_layer=model.cfg.n_layers,
                fwd_hooks=hooks,
            )
            at_last = model.ln_final(final[torch.arange(final.shape[0]), rows_last])
            logits = at_last @ model.W_U[:, self.ids] + model.b_U[self.ids]
            truth = self.truth[seen : seen + final.shape[0]]
            correct += int((logits.argmax(-1).cpu() == truth).sum())
            seen += final.shape[0]
        return correct / seen


def prompt_states(
    model: HookedTransformer,
    tokens: Int[Tensor, "n ctx"],
    last: Int[Tensor, " n"],
    hook: str,
    *,
    batch_size: int = 16,
    progress: bool = True,
    desc: str = "prompt states",
) -> tuple[Float[Tensor, "m d"], Int[Tensor, "m 2"], Float[Tensor, "n d"]]:
    """States of right-padded prompts (``encode_prompts``) at ``hook``: every real token but BOS,
    their (prompt, position), and each prompt's last token."""
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
    states, _ = gather_states(
        model, tokens, [hook], positions, batch_size=batch_size, progress=progress, desc=desc
    )
    every = states[hook]
    real = (positions >= 1) & (positions <= last[:, None])
    return every[real], real.nonzero(), every[torch.arange(tokens.shape[0]), last]


def run_steer_icl(cfg: SteerICLConfig, progress: bool = True) -> dict[str, Any]:
    """The whole experiment; writes ``steer.json``, ``steer.md`` and ``steer.png``."""
    from sae_lens_bae.activations import check_layers, norm_scale
    from sae_lens_bae.features.compare import baseline_configs
    from sae_lens_bae.models import load_model
    from sae_lens_bae.plots import plot_steering
    from sae_lens_bae.saes.bae import SHORT_RUN_LR, short_run_config
    from sae_lens_bae.training import train_sae

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    watch = Stopwatch("steer icl")
    pairs = load_icl_pairs(cfg)
    random.Random(cfg.seed).shuffle(pairs)
    needed = cfg.n_eval_prompts + cfg.n_vector_prompts + cfg.shots
    if len(pairs) < needed:
        raise ValueError(
            f"{len(pairs)} labelled sentences, but {cfg.n_eval_prompts} held-out queries + "
            f"{cfg.n_vector_prompts} vector queries + {cfg.shots} demonstrations are needed"
        )
    model = load_model(cfg.model, device=cfg.device)
    check_layers(model, [cfg.layer])
    hook = f"blocks.{cfg.layer}.{cfg.hook}"
    labels = sorted({label for _, label in pairs})
    label_ids = first_token_ids(model.tokenizer, labels)

    # held-out 0-shot queries first; the vector queries and their demonstrations come after them
    rest = pairs[cfg.n_eval_prompts :]
    sets = {}
    for name, shots in (("positive", cfg.shots), ("negative", 0)):
        prompts = build_icl_prompts(
            rest, shots, cfg.n_vector_prompts, template=cfg.template, seed=cfg.seed
        )
        tokens, last = encode_prompts([p for p, _ in prompts], model.tokenizer)
        every, _, at_last = prompt_states(
            model, tokens, last[:, 0], hook, batch_size=cfg.prompt_batch_size,
            progress=progress, desc=f"{name} prompts ({shots}-shot)",
        )  # fmt: skip
        truth = torch.tensor([labels.index(y) for _, y in prompts])
        sets[name] = {"every": every, "last": at_last, "tokens": tokens, "lastpos": last[:, 0],
                      "truth": truth}  # fmt: skip
    watch.lap("gather states")

    train = torch.cat([sets["positive"]["every"], sets["negative"]["every"]])
    scale = norm_scale(train)
    train = train[torch.randperm(train.shape[0], generator=torch.Generator().manual_seed(cfg.seed))]
    trainer = {
        "training_samples": cfg.steps * cfg.batch_size,
        "batch_size": cfg.batch_size,
        "device": cfg.device,
        "seed": cfg.seed,
    }
    d_in = train.shape[1]
    saes = {"bae": train_sae(train * scale, short_run_config(d_in, cfg.expansion * d_in),
                             lr=SHORT_RUN_LR, **trainer).sae}  # fmt: skip
    for name, sae_cfg in baseline_configs(d_in, cfg.expansion, cfg.baselines).items():
        saes[name] = train_sae(train * scale, sae_cfg, lr=cfg.lr, **trainer).sae
    watch.lap("train")

    reference = mean_difference(sets["positive"]["last"], sets["negative"]["last"])
    vectors = {
        name: task_vector(
            sae.eval(),
            sets["positive"]["last"],
            sets["negative"]["last"],
            cfg.top,
            input_scale=scale,
        )  # fmt: skip
        for name, sae in saes.items()
    }
    vectors["mean_difference"] = reference
    raw_norms = {name: float(v.norm()) for name, v in vectors.items()}
    if cfg.normalise:
        vectors = {name: v * (reference.norm() / v.norm().clamp_min(1e-12))
                   for name, v in vectors.items()}  # fmt: skip
    cosine = {
        name: float(torch.cosine_similarity(v, reference, dim=0)) for name, v in vectors.items()
    }

    prompts = build_icl_prompts(pairs, 0, cfg.n_eval_prompts, template=cfg.template, seed=cfg.seed)
    tokens, last = encode_prompts([p for p, _ in prompts], model.tokenizer)
    truth = torch.tensor([labels.index(y) for _, y in prompts])

    classifier = SteeredClassifier(
        model, tokens, last[:, 0], label_ids, truth, hook, batch_size=cfg.prompt_batch_size
    )
    accuracy = classifier.accuracy
    unsteered = accuracy()
    positive = sets["positive"]
    k_shot = label_accuracy(model, positive["tokens"], positive["lastpos"], label_ids,
                            positive["truth"], batch_size=cfg.prompt_batch_size)  # fmt: skip
    grid = [(name, s) for name in vectors for s in cfg.strengths]
    results: dict[str, dict[str, float]] = {name: {"0": unsteered} for name in vectors}
    for name, strength in tqdm(grid, desc="steered 0-shot accuracy", disable=not progress):
        results[name][str(strength)] = accuracy(vectors[name], strength)
    watch.lap("steer")

    rows = []
    for name, by_strength in results.items():
        best = max(by_strength, key=lambda s: (by_strength[s], -float(s)))
        rows.append(
            {
                "model": name,
                "best_strength": float(best),
                "best_accuracy": by_strength[best],
                "raw_norm": raw_norms[name],
                "cosine_to_mean_difference": cosine[name],
                "accuracy": by_strength,
            }
        )
    summary = {
        "config": asdict(cfg),
        "hook": hook,
        "labels": labels,
        "unsteered_0_shot_accuracy": unsteered,
        f"{cfg.shots}_shot_accuracy_on_vector_prompts": k_shot,
        "activation_scale": scale,
        "training_states": int(train.shape[0]),
        "models": rows,
        "seconds": watch.seconds,
    }
    write_json(out / "steer.json", summary)
    plot_steering(rows, unsteered, k_shot, cfg.shots, out / "steer.png",
                  title=f"{cfg.model} {hook}: steering 0-shot prompts")  # fmt: skip
    header = (
        f"# Steering 0-shot prompts with {cfg.shots}-shot task vectors: {cfg.model} `{hook}`\n\n"
        f"0-shot accuracy without steering: {unsteered:.3f} on {cfg.n_eval_prompts} held-out "
        f"prompts; {cfg.shots}-shot accuracy on the {cfg.n_vector_prompts} vector prompts: "
        f"{k_shot:.3f}. Vectors keep the top {cfg.top} features"
        + (", rescaled to the mean difference's norm.\n\n" if cfg.normalise else ".\n\n")
    )
    strengths = ["0", *[str(s) for s in cfg.strengths]]
    columns = [("model", lambda r: r["model"])]
    columns += [(f"α={s}", lambda r, s=s: f"{r['accuracy'][s]:.3f}") for s in strengths]
    columns += [
        ("best", lambda r: f"{r['best_accuracy']:.3f} (α={r['best_strength']:g})"),
        ("cos to mean diff.", lambda r: f"{r['cosine_to_mean_difference']:.3f}"),
        ("raw ‖v‖", lambda r: f"{r['raw_norm']:.2f}"),
    ]
    (out / "steer.md").write_text(header + markdown_table(rows, columns))
    watch.lap("report")
    return summary
