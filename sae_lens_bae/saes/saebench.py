"""A BAE as SAEBench's custom SAE: what SAEBench's evals read of an SAE object.

SAEBench (``sae_bench.custom_saes``) evaluates any ``nn.Module`` with ``encode``, ``decode`` and
``forward``, ``W_enc`` [d_in, d_sae], ``W_dec`` [d_sae, d_in], ``b_enc``, ``b_dec``, ``device``
and ``dtype`` attributes that follow ``.to()``, and a ``cfg`` holding the fields of its
``CustomSAEConfig`` (``SAEBENCH_CONFIG_FIELDS``). ``SAEBenchBAE`` wraps a BAE that way without
copying its weights (a training BAE with an input frame: a copy with the frame folded in, so the
weights SAEBench reads are in the units of the states it feeds). A BAE's decoder rows are not
unit-norm (a binary code cannot absorb a rescaling), so SAEBench's ``check_decoder_norms``
reports them as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from sae_lens_bae.saes.input_frame import in_input_units

__all__ = ["SAEBENCH_CONFIG_FIELDS", "SAEBenchBAE", "SAEBenchConfig"]


@dataclass
class SAEBenchConfig:
    """The fields of SAEBench's ``CustomSAEConfig`` (sae-bench 0.6), filled from a BAE."""

    model_name: str
    d_in: int
    d_sae: int
    hook_layer: int
    hook_name: str
    context_size: int | None = None
    hook_head_index: int | None = None
    architecture: str = "bae"
    apply_b_dec_to_input: bool = False
    finetuning_scaling_factor: bool = False
    activation_fn_str: str = ""
    activation_fn_kwargs: dict[str, Any] = field(default_factory=dict)
    prepend_bos: bool = True
    normalize_activations: str = "none"
    dtype: str = "float32"
    device: str = "cpu"
    model_from_pretrained_kwargs: dict[str, Any] = field(default_factory=dict)
    dataset_path: str = ""
    dataset_trust_remote_code: bool = True
    seqpos_slice: tuple[int | None, ...] = (None,)
    training_tokens: int = -100_000
    sae_lens_training_version: str | None = None
    neuronpedia_id: str | None = None


SAEBENCH_CONFIG_FIELDS = tuple(SAEBenchConfig.__dataclass_fields__)
"""Every field SAEBench's evals may read of ``sae.cfg``."""


class SAEBenchBAE(nn.Module):
    """A BAE (any bits per feature) behind SAEBench's custom-SAE interface; its parameters are the
    BAE's own (shared, not copied) in input units."""

    def __init__(self, bae: Any, model_name: str | None = None, hook_name: str | None = None):
        super().__init__()
        self.bae = bae = in_input_units(bae)
        meta = bae.cfg.metadata
        hook = hook_name or meta.hook_name
        if hook is None:
            raise ValueError("this BAE does not name its hook point: pass hook_name=")
        layer = re.match(r"blocks\.(\d+)\.", hook)
        if layer is None:
            raise ValueError(f"SAEBench needs a hook inside a block (blocks.L....), got {hook!r}")
        self.W_enc, self.W_dec, self.b_dec = bae.W_enc, bae.W_dec, bae.b_dec
        self.b_enc = bae.b_enc
        self.device: torch.device = bae.W_dec.device
        self.dtype: torch.dtype = bae.W_dec.dtype
        self.cfg = SAEBenchConfig(
            model_name=model_name or meta.model_name or "",
            d_in=bae.cfg.d_in,
            d_sae=bae.cfg.d_sae,
            hook_layer=int(layer.group(1)),
            hook_name=hook,
            context_size=meta.context_size,
            prepend_bos=bool(meta.prepend_bos) if meta.prepend_bos is not None else True,
            dtype=str(self.dtype).removeprefix("torch."),
            device=str(self.device),
        )

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        return self.bae.encode(x.to(self.dtype))

    def decode(self, feature_acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        return self.bae.decode(feature_acts)

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in"]:
        return self.decode(self.encode(x))

    def to(self, *args: Any, **kwargs: Any) -> SAEBenchBAE:
        """Move or cast; ``device``, ``dtype`` and ``cfg`` follow (SAEBench reads them)."""
        self.bae.to(*args, **kwargs)  # SAELens' own to(): the BAE's dtype and device follow
        super().to(*args, **kwargs)
        self.device, self.dtype = self.W_dec.device, self.W_dec.dtype
        self.cfg.device, self.cfg.dtype = str(self.device), str(self.dtype).removeprefix("torch.")
        return self
