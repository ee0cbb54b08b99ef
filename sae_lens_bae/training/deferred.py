"""A training loop's bookkeeping without waiting for the device: the training sets kept on it
(minibatches gathered there, no host-to-device copy a step) and the loss history copied to the
host in blocks, not a step at a time.

On a GPU both waits cost more than the step: a copy from pageable host memory synchronises its
stream before it starts, and reading a loss (``.tolist()``) waits for the step that computed it,
so the host cannot queue the next step while the device runs this one. A small BAE's step is
host-bound, and the two waits serialise host and device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["LossHistory", "fits_on_device", "progress_bits", "sets_on_device"]

DEVICE_SHARE = 0.25
"""Training sets move to a CUDA device when together they take at most this share of its free
memory (the BAEs, their Adam states and the activations of a step need the rest)."""


def _distinct(sets: Sequence[Tensor]) -> dict[int, Tensor]:
    """The sets by identity: a tensor given twice (a stack's seeds or restarts of one set) once."""
    return {id(x): x for x in sets}


def fits_on_device(sets: Sequence[Tensor], device: str | torch.device) -> bool:
    """Whether ``sets`` (a tensor given twice counted once) take at most ``DEVICE_SHARE`` of a
    CUDA device's free memory; always on a CPU, never on other devices."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type == "cpu"
    free, _ = torch.cuda.mem_get_info(device)
    total = sum(x.numel() * x.element_size() for x in _distinct(sets).values())
    return total <= DEVICE_SHARE * free


def sets_on_device(sets: Sequence[Tensor], device: str | torch.device) -> list[Tensor]:
    """``sets`` on ``device`` where they fit (``fits_on_device``), a tensor given twice copied
    once, else where they are: minibatches are then gathered on the device, with no
    host-to-device copy each step."""
    if not fits_on_device(sets, device):
        return list(sets)
    moved = {key: x.to(device) for key, x in _distinct(sets).items()}
    return [moved[id(x)] for x in sets]


def progress_bits(values: Sequence[float]) -> str:
    """Code entropies for a progress bar: one member's, or the range of several. Shown at the
    checks that read them anyway, so that a run stopped before its end (a device's time limit)
    has left its course in the log."""
    low, high = min(values), max(values)
    return f"{low:.1f}" if low == high else f"{low:.1f}-{high:.1f}"


class LossHistory:
    """Per-member loss histories (``histories[g][name]``: one float a step), recorded from the
    step's term tensors without reading them: they are copied to the host ``block`` steps at a
    time, and when the members that train change (``flush``)."""

    def __init__(self, n_members: int, block: int = 256) -> None:
        self.histories: list[dict[str, list[float]]] = [{} for _ in range(n_members)]
        self.block = block
        self._pending: list[tuple[list[str], list[Tensor]]] = []
        self._members: list[int] = []

    def record(self, members: Sequence[int], terms: dict[str, Tensor]) -> None:
        """This step's terms, each of shape [len(members)]: the values of ``members`` in order."""
        names = list(terms)
        if self._pending and (list(members) != self._members or names != self._pending[0][0]):
            self.flush()
        self._members = list(members)
        self._pending.append((names, [value.detach() for value in terms.values()]))
        if len(self._pending) >= self.block:
            self.flush()

    def flush(self) -> None:
        """Copy the recorded steps to the host (one wait for the device) and append them."""
        if not self._pending:
            return
        steps = torch.stack([torch.stack(values) for _, values in self._pending]).cpu().tolist()
        for (names, _), rows in zip(self._pending, steps, strict=True):
            for name, row in zip(names, rows, strict=True):
                for g, value in zip(self._members, row, strict=True):
                    self.histories[g].setdefault(name, []).append(value)
        self._pending.clear()
