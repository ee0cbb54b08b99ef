"""Faster exact paths of the BAE's covariance penalty, registered into the architecture's seam
(``saes.objective.register_penalty_path``) on import, the fused Triton kernels first (CUDA), then
the int8 and sparse products (CPU; bf16 matmuls on CUDA without triton). The package imports
this module, so every BAE trains through them; ``saes.objective`` alone is the plain reference.
"""

from sae_lens_bae.kernels import fused_ops, products
from sae_lens_bae.saes.objective import register_penalty_path

register_penalty_path(fused_ops.penalty_path)
register_penalty_path(products.penalty_path)

__all__ = ["fused_ops", "products"]
