"""Where and at what scale a BAE reads a set of states, so that its entropy estimate depends on
the set's shape alone.

Entropy does not change when every state is multiplied by one factor or moved by one vector, but
a BAE's training does: its penalties weigh against a reconstruction error that grows with the
square of the states' scale, and its initial encoder draws its hyperplanes through the origin,
so where the states sit decides which channels start constant. The recipes were calibrated on
sets of fair bits (``directional_data``), whose total variance is half their mean squared norm
and whose mean is as far from the origin as their spread. ``estimate_entropies`` brings every
set there: scaled to a total variance (``normalise_scale``) and moved so that its mean sits at
``sqrt(variance)`` along the diagonal (``placement_shift``). Both are measured on the training
set and applied to its evaluation set too. The registry's ``entropy`` recipe does the same inside
the BAE (``saes.input_scale``).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.saes.input_scale import placement

__all__ = ["TARGET_VARIANCE", "normalise_scale", "placement_shift"]

TARGET_VARIANCE = 0.5
"""The total variance every set is scaled to: what a set of fair bits along orthonormal
directions has at unit mean squared norm, the scale the recipes were calibrated at."""


def normalise_scale(
    states: Float[Tensor, "n d"], target_variance: float = TARGET_VARIANCE
) -> float:
    """The factor that brings the total variance of ``states`` (their mean squared distance from
    their mean) to ``target_variance``.

    One target for every cell makes cells of different layers (whose norms differ by orders of
    magnitude) comparable. It is a variance, not a mean squared norm: LLM states share a large
    mean, and scaled by their norm such a set leaves the penalties many times stronger against
    its reconstruction than the recipe was calibrated for. A set without variance (one state) is
    scaled to mean squared norm ``target_variance`` instead.
    """
    x = states.double()
    variance = placement(x)[0].item()
    mean_square = x.pow(2).sum(-1).mean().item()
    measure = variance if variance > 1e-12 * max(mean_square, 1e-30) else mean_square
    return (target_variance / measure) ** 0.5 if measure > 0 else 1.0


def placement_shift(states: Float[Tensor, "n d"]) -> Float[Tensor, " d"]:
    """The vector t that moves ``states`` so that their mean is ``sqrt(variance)`` times the unit
    diagonal ``(1, ..., 1) / sqrt(d)``: ``states + t`` is the same for any translation of
    ``states`` (up to rounding).

    The states are not centred: centred, every channel of the initial encoder splits the set in
    half, and a centred 8-bit set read 9-10 bits; moved off the origin by as much as they spread,
    as fair bits are, channels start at many rates and can settle constant. The diagonal is one
    fixed direction, so the place does not depend on where the set was.
    """
    shift = placement(states.double())[1]
    return shift.to(states.dtype if states.is_floating_point() else torch.float32)
