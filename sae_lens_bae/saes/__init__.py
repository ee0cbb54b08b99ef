"""Architectures, one module each (as in ``sae_lens.saes``): ``bae`` (the BAE), ``gated_relu``
(the paper's gated ReLU baseline); the BAE's recipes in ``bae_recipes``."""
