"""Held-out evaluation of any SAELens SAE (a BAE or a baseline): on cached activations, and
spliced into its model (the next-token loss and KL it costs, as SAELens' evals define them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from sae_lens_bae.outliers import outlier_mask
from sae_lens_bae.saes.bae import BAETrainingSAE
from sae_lens_bae.saes.binary import bits_to_values
from sae_lens_bae.saes.input_frame import module_frame
from sae_lens_bae.saes.objective import bae_objective, binary_entropy, frame_weight

__all__ = [
    "evaluate_sae",
    "held_out_objective",
    "spliced_losses",
    "spliced_scores",
    "unexplained_variance",
]


@torch.no_grad()
def evaluate_sae(
    sae: Any,
    activations: Float[Tensor, "n d_in"],
    batch_size: int = 4096,
    dense_threshold: float = 0.5,
    targets: Float[Tensor, "n d_out"] | None = None,
) -> dict[str, Any]:
    """Reconstruction and firing statistics of ``sae`` on ``activations``.

    Returns ``reconstruction_loss`` (squared error averaged over samples and dimensions),
    ``relative_error`` (SSE / SST, the fraction of the variance left unexplained: what every
    ``relative_error`` of the project is), ``explained_variance`` (1 - SSE / SST; both are None
    for data without variance, e.g. all-zero activations), ``l0`` (mean active features per sample),
    ``entropy_bits`` (H of the features' firing rates: for a BAE with ``bits_per_feature = 1`` the
    entropy estimate of the set), ``dead`` (never fire), ``dense`` (fire on more than
    ``dense_threshold`` of samples) and the per-feature ``firing_rates``. ``targets``: what the
    output should be when it is not the input (a transcoder's next hook point); errors and variance
    are then measured against them.
    """
    if targets is not None and targets.shape[0] != activations.shape[0]:
        raise ValueError(
            f"{activations.shape[0]} activation rows but {targets.shape[0]} target rows"
        )
    reference = activations if targets is None else targets
    sse = 0.0
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.float64)
    n = 0
    mean = reference.double().mean(0)
    sst = (reference.double() - mean).pow(2).sum().item()
    for start in range(0, activations.shape[0], batch_size):
        x = activations[start : start + batch_size].to(sae.device, sae.dtype)
        features = sae.encode(x)
        out = sae.decode(features)
        y = reference[start : start + batch_size].to(sae.device, sae.dtype)
        sse += (out - y).double().pow(2).sum().item()
        fired += (features != 0).sum(0, dtype=torch.float64).cpu()
        n += x.shape[0]
    rates = (fired / n).float()
    return {
        "n_samples": n,
        "reconstruction_loss": sse / (n * reference.shape[1]),
        "relative_error": sse / sst if sst > 0 else None,
        "explained_variance": 1.0 - sse / sst if sst > 0 else None,
        "l0": float(fired.sum() / n),
        "entropy_bits": binary_entropy(rates).item(),
        "dead": int((rates == 0).sum()),
        "dense": int((rates > dense_threshold).sum()),
        "d_sae": int(sae.cfg.d_sae),
        "firing_rates": rates,
    }


def unexplained_variance(sae: Any, activations: Float[Tensor, "n d_in"]) -> float | None:
    """The relative error (SSE / SST) of ``sae`` on ``activations`` (``evaluate_sae``); None for
    a set without variance."""
    return evaluate_sae(sae, activations)["relative_error"]


@torch.no_grad()
def held_out_objective(
    bae: BAETrainingSAE, activations: Float[Tensor, "n d_in"], batch_size: int
) -> float:
    """The BAE's training objective (``saes.objective.bae_objective``: SAELens' ``mse_loss`` +
    the entropy and covariance terms, as its training step weighs them) as at the end of its
    training (each coefficient at its final value, the entropy term on) on ``activations``,
    averaged over its minibatches of ``batch_size`` rows in order (the last, shorter one left
    out, as its entropy would not be a minibatch's; a set smaller than one minibatch is one).

    What compares two BAEs trained for the same set: the objective is non-convex, and runs from
    different initialisations can end in minima of different cost
    (docs/research/synthetic-entropy.md), so the one with the lower held-out objective is the
    better fit by the BAE's own definition.
    """
    n = activations.shape[0]
    if n == 0:
        raise ValueError("held_out_objective needs at least one activation")
    size = min(batch_size, n)
    totals = []
    for start in range(0, n - size + 1, size):
        x = activations[start : start + size].to(bae.device, bae.dtype)
        bits = bae.encode_bits(x)
        out = bae.decode(bits_to_values(bits, bae.cfg.bits_per_feature))
        coefficients = bae.cfg.coefficients()
        terms = bae_objective(
            x,
            out,
            bits,
            entropy_coefficient=coefficients["entropy"],
            covariance_coefficient=coefficients["covariance"],
            weight=frame_weight(module_frame(bae)),
            covariance=bae.covariance_penalty,
        )
        totals.append(float(terms["loss"]))
    return sum(totals) / len(totals)


def _kl(clean: Tensor, other: Tensor) -> Tensor:
    """KL(clean || other) per position, from logits (``sae_lens.evals._kl``)."""
    return F.kl_div(
        F.log_softmax(other, -1), F.log_softmax(clean, -1), log_target=True, reduction="none"
    ).sum(-1)


SPLICED_KEYS = (
    "ce_loss_with_sae",
    "ce_loss_without_sae",
    "ce_loss_with_ablation",
    "kl_div_with_sae",
    "kl_div_with_ablation",
)


def spliced_scores(sums: Mapping[str, Any], weights: Any = None) -> dict[str, float | None]:
    """SAELens' means and scores from per-sequence sums (``spliced_losses``' ``per_sequence``),
    each sequence counted ``weights[i]`` times (a bootstrap resample; default once): every loss
    the mean over the counted tokens, ``ce_loss_score`` = (ablated - with SAE) / (ablated -
    clean), ``kl_div_score`` = (ablated - with SAE) / ablated."""
    n = len(sums["kl_tokens"])
    w = torch.ones(n, dtype=torch.float64) if weights is None else torch.as_tensor(weights).double()

    def mean(key: str) -> float:
        tokens = "kl_tokens" if key.startswith("kl") else "ce_tokens"
        total = float((w * torch.as_tensor(sums[tokens]).double()).sum())
        return float((w * torch.as_tensor(sums[key]).double()).sum()) / max(total, 1.0)

    means: dict[str, float | None] = {key: mean(key) for key in SPLICED_KEYS}
    ablated, with_sae = means["ce_loss_with_ablation"], means["ce_loss_with_sae"]
    gap = ablated - means["ce_loss_without_sae"]  # type: ignore[operator]
    kl_ablated, kl_sae = means["kl_div_with_ablation"], means["kl_div_with_sae"]
    means["ce_loss_score"] = (ablated - with_sae) / gap if gap else None  # type: ignore[operator]
    means["kl_div_score"] = (kl_ablated - kl_sae) / kl_ablated if kl_ablated else None  # type: ignore[operator]
    return means


def _replacing(sae: Any, keep: Tensor, input_scale: float) -> Any:
    """A hook writing ``sae``'s reconstruction where ``keep`` holds (the input elsewhere), or
    zeros at every position without an SAE (SAELens' zero ablation)."""

    def hook_fn(acts: Tensor, hook: Any) -> Tensor:  # noqa: ARG001
        if sae is None:
            return torch.zeros_like(acts)
        x = acts.to(sae.device, sae.dtype) * input_scale
        new = (sae.decode(sae.encode(x)) / input_scale).to(acts.device, acts.dtype)
        return torch.where(keep[..., None], new, acts)

    return hook_fn


@torch.no_grad()
def spliced_losses(
    model: HookedTransformer,
    saes: Mapping[str, Any],
    tokens: Int[Tensor, "n_seq ctx"],
    hook: str,
    *,
    input_scale: float = 1.0,
    outlier_norm_ratio: float | None = 10.0,
    batch_size: int = 8,
    ignore_tokens: Iterable[int] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per SAE, what replacing ``hook``'s activations by its reconstruction costs the model, as
    SAELens' evals compute it (``get_recons_loss`` and ``get_downstream_reconstruction_metrics``,
    ignoring ``ignore_tokens``, by default ``run_evals``' BOS, EOS and padding of the model's
    tokenizer): next-token cross-entropy with the
    SAE, clean and with every position zero-ablated, the KL divergence from the clean logits
    with the SAE and with ablation, each the mean over the tokens not ignored (the CE at a
    position whose token is not ignored), and ``ce_loss_score``/``kl_div_score``
    (``spliced_scores``). One addition: attention-sink outliers (norm above
    ``outlier_norm_ratio`` times the sequence batch's median, which ``harvest_layer`` drops
    from training) pass unchanged, as ignored tokens do. ``per_sequence``: each sequence's sums
    and token counts, for a bootstrap over sequences. ``input_scale``: what the SAEs' training
    activations were multiplied by."""
    tokenizer = getattr(model, "tokenizer", None)
    if ignore_tokens is None:
        ignore_tokens = {getattr(tokenizer, f"{t}_token_id", None) for t in ("bos", "eos", "pad")}
    ignored = set(ignore_tokens) - {None}
    sums: dict[str, dict[str, list[float]]] = {name: {} for name in saes}
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size].to(model.cfg.device)
        mask = ~torch.isin(batch, torch.tensor(sorted(ignored), device=batch.device))
        (clean_logits, clean_loss), cache = model.run_with_cache(
            batch, return_type="both", loss_per_token=True, prepend_bos=False, names_filter=hook
        )
        keep = mask & _not_outliers(cache[hook], outlier_norm_ratio)
        run = _spliced_runner(model, batch, hook)
        ablated_logits, ablated_loss = run(_replacing(None, keep, input_scale))
        for name, sae in saes.items():
            logits, loss = run(_replacing(sae, keep, input_scale))
            per_token = {
                "ce_loss_with_sae": loss, "ce_loss_without_sae": clean_loss,
                "ce_loss_with_ablation": ablated_loss,
                "kl_div_with_sae": _kl(clean_logits, logits),
                "kl_div_with_ablation": _kl(clean_logits, ablated_logits),
            }  # fmt: skip
            per_token["kl_tokens"], per_token["ce_tokens"] = mask.float(), mask[:, :-1].float()
            for key, values in per_token.items():
                counted = mask[:, :-1] if key.startswith("ce_loss") else mask
                sequence_sums = (
                    (values * counted).sum(-1) if "tokens" not in key else values.sum(-1)
                )
                sums[name].setdefault(key, []).extend(sequence_sums.double().cpu().tolist())
    return {name: {**spliced_scores(held), "per_sequence": held} for name, held in sums.items()}


def _spliced_runner(model: HookedTransformer, batch: Tensor, hook: str) -> Any:
    def run(hook_fn: Any) -> tuple[Tensor, Tensor]:
        return model.run_with_hooks(
            batch,
            return_type="both",
            loss_per_token=True,
            prepend_bos=False,
            fwd_hooks=[(hook, hook_fn)],
        )

    return run


def _not_outliers(acts: Tensor, outlier_norm_ratio: float | None) -> Tensor:
    """Positions ``[batch, pos]`` that are not extreme (``outliers.outlier_mask``) against the
    median over positions after the first (all, without a ratio)."""
    rows = acts.reshape(-1, acts.shape[-1])
    reference = acts[:, 1:].reshape(-1, acts.shape[-1])
    return outlier_mask(rows, outlier_norm_ratio, reference=reference).reshape(acts.shape[:-1])
