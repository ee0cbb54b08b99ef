"""What several experiments share: how a nested training recipe appears on the command line."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from sae_lens_bae.entropy import EntropyRecipe

__all__ = ["recipe_field"]


def recipe_field(default: EntropyRecipe) -> Any:
    """A config field holding an ``EntropyRecipe``: its fields become options of the command
    (``--steps``, ``--lr``...), its ``batch_size`` named ``--bae-batch-size`` beside the forward
    passes' ``--batch-size`` (see ``sae_lens_bae.cli.options``)."""
    return field(default=default, metadata={"cli_names": {"batch_size": "bae_batch_size"}})
