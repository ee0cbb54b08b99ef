"""``python -m sae_lens_bae``: the ``bae`` command line."""

from sae_lens_bae.cli import main

main()
