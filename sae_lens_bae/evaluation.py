"""Held-out evaluation of any SAELens SAE (a BAE or a baseline): on cached activations, and
spliced into its model (the next-token loss and KL it costs, as SAELens' evals define them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from sae_lens_bae.saes.bae import BAETrainingSAE
from sae_lens_bae.saes.binary import bits_to_values
from sae_lens_bae.saes.input_frame import frame_factor, module_frame
from sae_lens_bae.saes.objective import bae_objective, binary_entropy

__all__ = ["evaluate_sae", "held_out_objective", "spliced_losses", "unexplained_variance"]


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
    for data without variance, e.g. all-zero activations), ``l0`` (mean
    active features per sample), ``entropy_bits`` (H of the features' firing rates: for a BAE with
    ``bits = 1`` the entropy estimate of the set), ``dead`` (never fire), ``dense`` (fire on more
    than ``dense_threshold`` of samples) and the per-feature ``firing_rates``. ``targets``: what
    the output should be when it is not the input (a transcoder's next hook point); errors and
    variance are then measured against them.
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
    """The BAE's training objective (``saes.objective.bae_objective``: reconstruction + entropy +
    covariance, in the units of its input frame) as at the end of its training (each
    coefficient at its final value, the entropy term on) on ``activations``, averaged over its
    minibatches of ``batch_size`` rows in order (the last, shorter one left out, as its entropy
    would not be a minibatch's; a set smaller than one minibatch is one).

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
        out = bae.decode(bits_to_values(bits, bae.cfg.bits))
        input_frame = module_frame(bae)
        if input_frame is not None:  # the reconstruction error in the frame's units
            x, out = (v * frame_factor(input_frame[0]) for v in (x, out))
        coefficients = bae.cfg.coefficients()
        terms = bae_objective(
            x,
            out,
            bits,
            entropy_coefficient=coefficients["entropy"],
            covariance_coefficient=coefficients["covariance"],
        )
        totals.append(float(terms["loss"]))
    return sum(totals) / len(totals)


def _kl(clean: Tensor, other: Tensor) -> Tensor:
    """KL(clean || other) per position, from logits."""
    return F.kl_div(
        F.log_softmax(other, -1), F.log_softmax(clean, -1), log_target=True, reduction="none"
    ).sum(-1)


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
) -> dict[str, dict[str, float | None]]:
    """Per SAE, what replacing ``hook``'s activations by its reconstruction costs the model, with
    SAELens' definitions (``sae_lens.evals.get_recons_loss``): next-token cross-entropy with the
    SAE, without it and with the activations zero-ablated, ``ce_loss_score`` = the fraction of
    the ablation's loss increase that the SAE recovers, the KL divergence from the clean logits
    with the SAE and with ablation, and ``kl_div_score`` likewise.

    Positions are spliced where the SAE was trained to read: not the BOS, and not attention-sink
    outliers (norm above ``outlier_norm_ratio`` times the batch's median norm, which
    ``harvest_layer`` drops from training); elsewhere the activations pass unchanged, for the
    ablation too. ``input_scale``: what the SAEs' training activations were multiplied by.
    """
    sums: dict[str, dict[str, float]] = {name: {} for name in saes}
    count = 0

    def spliced_positions(acts: Tensor) -> Tensor:
        norms = acts.float().norm(dim=-1)
        keep = torch.ones_like(norms, dtype=torch.bool)
        keep[:, 0] = False
        if outlier_norm_ratio is not None:
            keep &= norms <= outlier_norm_ratio * norms[:, 1:].median()
        return keep

    def replacing(sae: Any | None) -> Any:
        def hook_fn(acts: Tensor, hook: Any) -> Tensor:  # noqa: ARG001
            keep = spliced_positions(acts)[..., None]
            if sae is None:
                new = torch.zeros_like(acts)
            else:
                x = acts.to(sae.device, sae.dtype) * input_scale
                new = (sae.decode(sae.encode(x)) / input_scale).to(acts.device, acts.dtype)
            return torch.where(keep, new, acts)

        return hook_fn

    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size].to(model.cfg.device)
        clean_logits, clean_loss = model(
            batch, return_type="both", loss_per_token=True, prepend_bos=False
        )
        ablated_logits, ablated_loss = model.run_with_hooks(
            batch,
            return_type="both",
            loss_per_token=True,
            prepend_bos=False,
            fwd_hooks=[(hook, replacing(None))],
        )
        ablated_kl = _kl(clean_logits, ablated_logits)
        for name, sae in saes.items():
            logits, loss = model.run_with_hooks(
                batch,
                return_type="both",
                loss_per_token=True,
                prepend_bos=False,
                fwd_hooks=[(hook, replacing(sae))],
            )
            totals = {
                "ce_loss_with_sae": loss.sum(),
                "ce_loss_without_sae": clean_loss.sum(),
                "ce_loss_with_ablation": ablated_loss.sum(),
                "kl_div_with_sae": _kl(clean_logits, logits)[:, :-1].sum(),
                "kl_div_with_ablation": ablated_kl[:, :-1].sum(),
            }
            for key, value in totals.items():
                sums[name][key] = sums[name].get(key, 0.0) + float(value)
        count += clean_loss.numel()
    results = {}
    for name, totals in sums.items():
        mean = {key: value / count for key, value in totals.items()}
        ablated, with_sae = mean["ce_loss_with_ablation"], mean["ce_loss_with_sae"]
        gap = ablated - mean["ce_loss_without_sae"]
        kl_ablated, kl_sae = mean["kl_div_with_ablation"], mean["kl_div_with_sae"]
        results[name] = {
            **mean,
            "ce_loss_score": (ablated - with_sae) / gap if gap else None,
            "kl_div_score": (kl_ablated - kl_sae) / kl_ablated if kl_ablated else None,
        }
    return results
