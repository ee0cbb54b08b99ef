"""The ``bae`` command line, generated from the experiments' and tools' config dataclasses."""

from sae_lens_bae.cli.app import COMMANDS, app, main

__all__ = ["COMMANDS", "app", "main"]
