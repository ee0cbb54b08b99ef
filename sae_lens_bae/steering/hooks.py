"""Adding a vector to a hook point of a HookedTransformer, at chosen token positions.

``steering_hook`` is a TransformerLens forward hook, for ``model.run_with_hooks(tokens,
fwd_hooks=[(name, steering_hook(v, 4.0))])``; ``steer`` is the same as a context manager, which
also covers ``model.generate``. During generation with the KV cache every forward pass sees only
the new token, so ``positions="last"`` steers the prompt's last token and then each generated one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from sae_lens_bae.activations.hooks import check_hooks

__all__ = ["Positions", "steer", "steering_hook"]

Positions = Literal["last", "all"] | int | Sequence[int] | Int[Tensor, " batch"]
"""``"last"`` (default), ``"all"``, one position or a list (negative counts from the end), or a
[batch] tensor with one position per row (each row's last real token under right padding)."""


def steering_hook(
    vector: Float[Tensor, " d"], strength: float = 1.0, positions: Positions = "last"
) -> Callable[[Tensor, Any], Tensor]:
    """A forward hook that adds ``strength * vector`` at ``positions`` of a [batch, pos, d]
    activation (e.g. ``blocks.L.hook_resid_post``) and leaves every other position untouched.

    Explicit positions are positions of the whole sequence. Under KV-cached generation each
    forward pass after the prompt's sees one new token, so the hook counts the positions it has
    seen (restarting at every pass of more than one token: a new prompt) and steers a position
    whenever it comes by; negative positions count from the end of the pass that holds them.
    """
    if vector.ndim != 1:
        raise ValueError(f"vector must be 1-D [d], got shape {tuple(vector.shape)}")
    if not torch.isfinite(vector).all():
        raise ValueError("vector holds NaN/Inf values")
    seen = [0]  # positions of the sequence before this forward pass

    def hook(activation: Tensor, hook: Any) -> Tensor:
        if activation.ndim != 3 or activation.shape[-1] != vector.shape[0]:
            raise ValueError(
                f"{getattr(hook, 'name', 'hook')} gives activations of shape "
                f"{tuple(activation.shape)}; a steering vector of size {vector.shape[0]} needs "
                "[batch, pos, d] with that d (use a residual-stream hook point)"
            )
        length = activation.shape[1]
        if length > 1:  # a prompt's pass: the sequence starts here
            seen[0] = 0
        offset = seen[0]
        seen[0] += length
        delta = (strength * vector).to(activation.device, activation.dtype)
        if isinstance(positions, Tensor) and positions.ndim == 1:
            if positions.shape[0] != activation.shape[0]:
                raise ValueError(
                    f"{positions.shape[0]} per-row positions for a batch of {activation.shape[0]}"
                )
            local = positions.to(activation.device) - offset
            rows = torch.arange(activation.shape[0], device=activation.device)
            inside = (local >= 0) & (local < length)
            activation[rows[inside], local[inside]] += delta
        elif positions == "all":
            activation += delta
        elif positions == "last":
            activation[:, -1] += delta
        else:
            wanted = [positions] if isinstance(positions, int) else list(positions)
            local = [p if p < 0 else p - offset for p in wanted]
            local = [p for p in local if (p < 0 and offset == 0) or 0 <= p < length]
            if local:
                activation[:, local] += delta
        return activation

    return hook


@contextmanager
def steer(
    model: HookedTransformer,
    hook_name: str,
    vector: Float[Tensor, " d"],
    strength: float = 1.0,
    positions: Positions = "last",
) -> Iterator[HookedTransformer]:
    """``with steer(model, "blocks.15.hook_resid_post", v, 4.0): model.generate(...)``: every
    forward pass inside the block is steered; the hook is removed on exit."""
    check_hooks(model, [hook_name])
    with model.hooks(fwd_hooks=[(hook_name, steering_hook(vector, strength, positions))]):
        yield model
