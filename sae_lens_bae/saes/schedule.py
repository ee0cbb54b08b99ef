"""A BAE's phases in training steps: when each term of the objective counts, resolved once from
the length of training (``BAETrainingSAEConfig.schedule``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Schedule"]


@dataclass(frozen=True)
class Schedule:
    """A BAE's phases in 0-based training steps."""

    total_steps: int | None
    """Length of training; None when unknown (then nothing may depend on it)."""
    entropy_on_from: int = 0
    """First step with the entropy term."""
    covariance_off_from: int | None = None
    """First step without the covariance term (None: on to the end)."""

    def entropy_on(self, step: int) -> bool:
        """Whether the entropy term counts at ``step``."""
        return step >= self.entropy_on_from

    def covariance_on(self, step: int) -> bool:
        """Whether the covariance term counts at ``step``."""
        return self.covariance_off_from is None or step < self.covariance_off_from
