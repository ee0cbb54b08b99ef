"""What a BAE checks of the activations it is given, before it encodes them: their width, and
that they are finite, with one line saying what to check when they are not."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_activations"]

ADVICE = "Check the model's dtype (fp16 overflow) and the activation source."


def check_activations(x: Tensor, d_in: int, hook_name: str | None, on_device: bool = False) -> None:
    """Raise a ``ValueError`` naming the problem if ``x`` is not [..., d_in] or holds NaN/Inf.

    The finiteness check is max |x| (one ``vector_norm`` of order inf) below inf: it is NaN or inf
    iff some entry is, in two kernels (``isfinite(x).all()`` is six: isfinite is composite).
    ``on_device`` (a training step): off the CPU, and under ``torch.compile`` anywhere, it runs
    on the device (``torch._assert_async``: the step never waits on the host; a failure surfaces
    at the next sync as a RuntimeError with the same message)."""
    if x.shape[-1] != d_in:
        raise ValueError(
            f"BAE expects activations with last dimension d_in={d_in}, got shape "
            f"{tuple(x.shape)}. Check the hook point (and the model) this BAE was trained on: "
            f"{hook_name or 'unknown hook'}."
        )
    if not x.numel() or not x.is_floating_point():
        return
    finite = torch.linalg.vector_norm(x.detach(), float("inf")) < float("inf")
    if torch.compiler.is_compiling() or (on_device and x.device.type != "cpu"):
        torch._assert_async(finite, f"BAE received NaN/Inf activations. {ADVICE}")
        return
    if not finite:
        n_bad = int((~torch.isfinite(x)).sum())
        raise ValueError(
            f"BAE received {n_bad} NaN/Inf values in activations of shape {tuple(x.shape)}. "
            f"{ADVICE}"
        )
