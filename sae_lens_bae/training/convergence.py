"""When a BAE has trained enough: its held-out reconstruction and code entropy have stopped moving.

An entropy estimate read from a BAE that is still learning changes with the number of steps; a
fixed step budget is either wasted on easy sets or too short for hard ones. ``Convergence`` is
the rule: every ``check_every`` steps after ``min_steps`` a BAE's reconstruction error (SSE over
the states' sum of squares) and code entropy (H of its mean code, in bits) are measured on
held-out states; it has converged once the means of the last ``window`` checks and of the
``window`` checks before them differ by at most ``rtol`` of the error (or ``atol_error``) and
``atol_bits`` of entropy (or ``rtol`` of it), whichever is larger. Comparing two windows' means,
not the spread within one, tells a slow steady drift (which an estimate would still follow) from
a plateau.

A drift that is slow per window can still be large over the rest of training. With
``horizon`` h > 0 the difference of the two windows is first extrapolated over h times the steps
trained so far: a BAE has converged only if training as long again (h = 1) would move neither
value by more than the tolerance at the pace of the last two windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CHECK_EVERY", "Convergence", "ConvergenceMonitor", "DrainHold"]

CHECK_EVERY = 100
"""Steps between two checks of the stop rule and of a drain hold: one interval for both, so a
hold and the rule read the same checks."""


@dataclass(frozen=True)
class Convergence:
    """The convergence rule (see the module)."""

    check_every: int = CHECK_EVERY
    window: int = 3
    rtol: float = 0.01
    atol_error: float = 1e-3
    atol_bits: float = 0.02
    min_steps: int = 0
    horizon: float = 1.0

    def __post_init__(self) -> None:
        if (
            self.check_every < 1
            or self.window < 1
            or self.rtol < 0
            or self.atol_bits < 0
            or self.horizon < 0
        ):
            raise ValueError(
                "Convergence needs check_every >= 1, window >= 1, rtol >= 0, atol_bits >= 0 "
                "and horizon >= 0"
            )


@dataclass
class ConvergenceMonitor:
    """Applies a ``Convergence`` rule to G models checked together; ``converged_at[g]`` is the
    step after which model g stopped (None while it trains)."""

    rule: Convergence
    n_models: int
    errors: list[list[float]] = field(default_factory=list)
    entropies: list[list[float]] = field(default_factory=list)
    converged_at: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.errors = [[] for _ in range(self.n_models)]
        self.entropies = [[] for _ in range(self.n_models)]
        self.converged_at = [None] * self.n_models

    def due(self, step: int) -> bool:
        """Whether the models are checked after training step ``step`` (0-based)."""
        return (step + 1) % self.rule.check_every == 0

    def update(self, step: int, errors: list[float], entropies: list[float]) -> list[int]:
        """Record one check after ``step``; returns the models that converged at it."""
        newly = []
        if step + 1 <= self.rule.min_steps:  # before the objective is complete: not evidence
            return newly
        for g in range(self.n_models):
            if self.converged_at[g] is not None:
                continue
            self.errors[g].append(errors[g])
            self.entropies[g].append(entropies[g])
            if self._flat(g, step + 1):
                self.converged_at[g] = step + 1
                newly.append(g)
        return newly

    @property
    def done(self) -> bool:
        return all(step is not None for step in self.converged_at)

    def _flat(self, g: int, steps: int) -> bool:
        w = self.rule.window
        if len(self.errors[g]) < 2 * w:
            return False
        rule = self.rule
        # the windows' means are w checks apart: their difference is the drift over w checks
        drift_scale = max(1.0, rule.horizon * steps / (w * rule.check_every))
        for values, atol in (
            (self.errors[g], rule.atol_error),
            (self.entropies[g], rule.atol_bits),
        ):
            last, before = sum(values[-w:]) / w, sum(values[-2 * w : -w]) / w
            if abs(last - before) * drift_scale > max(atol, rule.rtol * abs(last)):
                return False
        return True


@dataclass(frozen=True)
class DrainHold:
    """Hold a learning-rate schedule while a code drains.

    On planted bits the ``paper`` recipe's code first over-codes and then drains to r, and the
    drain ends once the learning rate integrated over the steps reaches a budget that grows
    with the set: a cosine that decays before then leaves the code undrained, whatever its
    step count. So while the code's entropy on the check states still falls by more than
    ``min_fall_bits`` from one window of ``window`` checks to the next, the schedule (the
    learning rate, and the phases read from the step: the final covariance-off fraction) stands
    still and the BAE trains on at that learning rate, for at most ``extra`` times the schedule's
    steps in all; then the schedule goes on where it stood. A code that never falls costs
    nothing more."""

    extra: float = 1.0
    check_every: int = CHECK_EVERY
    window: int = 5
    min_fall_bits: float = 1.0

    def __post_init__(self) -> None:
        if self.extra < 0 or self.check_every < 1 or self.window < 1 or self.min_fall_bits < 0:
            raise ValueError(
                "DrainHold needs extra >= 0, check_every >= 1, window >= 1 and min_fall_bits >= 0"
            )

    def extra_steps(self, steps: int) -> int:
        """The most held steps a schedule of ``steps`` steps may take."""
        return math.floor(self.extra * steps)

    def draining(self, entropies: Sequence[float]) -> bool:
        """Whether the last ``window`` checks' mean entropy lies more than ``min_fall_bits``
        below the mean of the ``window`` checks before them."""
        w = self.window
        if len(entropies) < 2 * w:
            return False
        last, before = sum(entropies[-w:]) / w, sum(entropies[-2 * w : -w]) / w
        return before - last > self.min_fall_bits
