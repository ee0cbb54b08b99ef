"""The paper's experiments and the quickstart, one module each: a config dataclass and ``run``.

Each module holds its config (every field a ``bae`` option, see ``sae_lens_bae.cli``), a
``run(config) -> summary`` that writes its report folder (JSON, markdown, PNG), and ``REPORT``,
the markdown file the CLI prints afterwards. Experiments import the library core; the core never
imports them. To add one: a module here with those three names, and a line in ``EXPERIMENTS``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from sae_lens_bae.experiments import (
    compare,
    compress,
    entropy_estimate,
    entropy_icl,
    entropy_positions,
    llm_truth,
    more_bits,
    quickstart,
    steer_icl,
    synth_sae,
    synthetic,
    two_token,
)

__all__ = ["EXPERIMENTS", "Experiment", "command_help"]


@dataclass(frozen=True)
class Experiment:
    """An experiment as the CLI sees it: its command and its module (whose ``run`` takes the
    config as its first argument)."""

    command: tuple[str, ...]
    module: ModuleType

    @property
    def run(self) -> Callable[..., Any]:
        return self.module.run

    @property
    def report(self) -> str | None:
        """Markdown file in the config's ``out`` folder that the CLI prints after the run."""
        return self.module.REPORT

    @property
    def help(self) -> str:
        """What the experiment does: its module docstring's first paragraph."""
        return command_help(self.module.__doc__ or "")


def command_help(docstring: str) -> str:
    """The first paragraph of a module docstring, without a leading ````bae ...``: ````."""
    first = " ".join(docstring.strip().split("\n\n")[0].split())
    text = re.sub(r"^``bae [^`]*``:\s*", "", first)
    return text[:1].upper() + text[1:]


EXPERIMENTS = [
    Experiment(("quickstart",), quickstart),
    Experiment(("compare",), compare),
    Experiment(("compress",), compress),
    Experiment(("bench", "synthetic"), synthetic),
    Experiment(("bench", "two-token"), two_token),
    Experiment(("bench", "more-bits"), more_bits),
    Experiment(("bench", "llm-truth"), llm_truth),
    Experiment(("bench", "synth-sae"), synth_sae),
    Experiment(("entropy", "estimate"), entropy_estimate),
    Experiment(("entropy", "positions"), entropy_positions),
    Experiment(("entropy", "icl"), entropy_icl),
    Experiment(("steer", "icl"), steer_icl),
]
"""Every experiment, in the order ``bae --help`` lists them."""
