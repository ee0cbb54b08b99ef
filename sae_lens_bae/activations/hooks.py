"""Hook-point names of a TransformerLens model (a ``HookedTransformer`` or a ``TransformerBridge``
in compatibility mode, which carry the same names): checked before any work, and the layer they
sit in."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import torch
from transformer_lens import HookedTransformer

__all__ = [
    "check_hooks",
    "check_layers",
    "hook_point",
    "hook_width",
    "layer_of",
    "stop_layer",
    "unembeds_residual",
]


def check_hooks(model: HookedTransformer, hooks: Sequence[str]) -> None:
    """Fail before any work if a hook name is not one of ``model``'s hook points, naming the
    closest ones (a typo in ``blocks.3.hook_resid_post`` should not cost a forward pass)."""
    unknown = [h for h in hooks if h not in model.hook_dict]
    if unknown:
        hints = {h: difflib.get_close_matches(h, model.hook_dict, n=3) for h in unknown}
        raise ValueError(
            f"Unknown hook name(s) {unknown} for this model ({model.cfg.n_layers} layers). "
            f"Closest names: {hints}. Hook names look like 'blocks.3.hook_resid_post'."
        )


def check_layers(model: HookedTransformer, layers: Sequence[int]) -> None:
    """Fail before any work if a requested layer index is outside the model."""
    bad = [layer for layer in layers if not 0 <= layer < model.cfg.n_layers]
    if bad:
        raise ValueError(
            f"Layers {bad} do not exist: the model has layers 0..{model.cfg.n_layers - 1}"
        )


def hook_point(model: HookedTransformer, hook: str, layer: int | None = None) -> str:
    """The one hook point a ``--hook``/``--layer`` pair names, checked against ``model``: a full
    name (``blocks.3.hook_mlp_out``, ``hook_embed``) as it is, a name inside a block
    (``hook_resid_post``, ``attn.hook_z``) in block ``layer`` (None: the middle one). A full
    name in another block than ``layer`` is refused."""
    if hook in model.hook_dict or hook.startswith("blocks."):
        check_hooks(model, [hook])
        if layer is not None and layer_of(hook) != layer:
            raise ValueError(f"hook {hook} is not in layer {layer}; give one of --hook, --layer")
        return hook
    layer = model.cfg.n_layers // 2 if layer is None else layer
    check_layers(model, [layer])
    full = f"blocks.{layer}.{hook}"
    check_hooks(model, [full])
    return full


def layer_of(hook: str) -> int | None:
    """The block index of ``blocks.L.<name>``, None for hooks outside the blocks (``hook_embed``):
    a forward pass that only needs this hook can stop after block L."""
    parts = hook.split(".")
    return int(parts[1]) if parts[0] == "blocks" and len(parts) > 1 and parts[1].isdigit() else None


def stop_layer(hooks: Sequence[str]) -> int | None:
    """``stop_at_layer`` for a forward pass that only needs ``hooks``: one past the last block,
    or None (run the whole model) when a hook lies outside the blocks."""
    layers = [layer_of(h) for h in hooks]
    blocks = [layer for layer in layers if layer is not None]
    return max(blocks) + 1 if blocks and len(blocks) == len(layers) else None


@torch.no_grad()
def hook_width(model: HookedTransformer, hook: str) -> int:
    """The last dimension of ``hook``'s activations (an SAE's d_in there), read from a forward
    pass of one token that stops after the hook's block: known before any data is read."""
    one = torch.zeros(1, 1, dtype=torch.long, device=model.cfg.device)
    _, cache = model.run_with_cache(
        one, names_filter=[hook], prepend_bos=False, stop_at_layer=stop_layer([hook])
    )
    return cache[hook].shape[-1]


def unembeds_residual(model: object) -> bool:
    """Whether ``model`` is TransformerLens' own implementation (a ``HookedTransformer``): a
    forward pass can start at a block, and its logits are ``ln_final(resid) @ W_U + b_U`` of the
    last block's residual. A ``TransformerBridge`` runs the Hugging Face model's own forward pass,
    from the tokens to its head's logits (which may rescale them, as Granite's
    ``logits_scaling`` does)."""
    return isinstance(model, HookedTransformer)
