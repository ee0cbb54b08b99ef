"""A BAE's phases in training steps: when each term of the objective counts and when constant
bits are resampled, resolved once from the length of training
(``BAETrainingSAEConfig.schedule``)."""

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
    resample_every: int = 0
    """Constant bits are resampled every this many steps (0: never)."""
    resample_until: float | None = None
    """Resampling happens only at steps before this one (None: until the end)."""

    def entropy_on(self, step: int) -> bool:
        """Whether the entropy term counts at ``step``."""
        return step >= self.entropy_on_from

    def covariance_on(self, step: int) -> bool:
        """Whether the covariance term counts at ``step``."""
        return self.covariance_off_from is None or step < self.covariance_off_from

    def resampling_at(self, step: int) -> bool:
        """Whether ``step`` ends a resampling window (the resampling runs before the next)."""
        if self.resample_every <= 0 or (step + 1) % self.resample_every:
            return False
        return self.resample_until is None or step < self.resample_until

    def window_counted(self, step: int) -> bool:
        """Whether ``step`` counts its codes for resampling: its window ends in a resampling.
        After the last resampling nothing reads the counts, so they are not kept."""
        if self.resample_every <= 0:
            return False
        return self.resampling_at(step + (-(step + 1)) % self.resample_every)

    def resamples_before(self, step: int) -> bool:
        """Whether the step ``step`` starts by resampling (the previous step ended a window)."""
        return step > 0 and self.resampling_at(step - 1)
