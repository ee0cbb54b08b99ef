"""Reading a model's answer from its label words' logits, with and without a steering vector.

The measure of ICL steering: the fraction of prompts whose right label word has the highest logit
at the prompt's last token, with ``strength * vector`` added there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from sae_lens_bae.activations.hooks import check_hooks, layer_of, unembeds_residual
from sae_lens_bae.steering.hooks import steering_hook

__all__ = ["SteeredClassifier", "label_accuracy"]


@torch.no_grad()
def label_accuracy(
    model: HookedTransformer,
    tokens: Int[Tensor, "n ctx"],
    last: Int[Tensor, " n"],
    label_ids: Sequence[int],
    truth: Int[Tensor, " n"],
    *,
    hook_name: str | None = None,
    vector: Float[Tensor, " d"] | None = None,
    strength: float = 0.0,
    batch_size: int = 16,
) -> float:
    """Fraction of prompts whose label-word logit at the last real token is the right one,
    optionally with ``strength * vector`` added at that token of ``hook_name``."""
    ids = torch.as_tensor(list(label_ids), device=model.cfg.device)
    correct = 0
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size].to(model.cfg.device)
        rows_last = last[start : start + batch_size].to(model.cfg.device)
        hooks = []
        if vector is not None and strength != 0.0:
            assert hook_name is not None
            hooks = [(hook_name, steering_hook(vector, strength, positions=rows_last))]
        logits = model.run_with_hooks(batch, fwd_hooks=hooks, prepend_bos=False)
        at_last = logits[torch.arange(batch.shape[0]), rows_last][:, ids]
        correct += int((at_last.argmax(-1).cpu() == truth[start : start + batch_size]).sum())
    return correct / tokens.shape[0]


class SteeredClassifier:
    """``label_accuracy`` for many (vector, strength) pairs on the same prompts, steering a hook
    of block ``layer``. On a ``HookedTransformer`` the residual stream entering that block is
    computed once, and each evaluation runs only blocks ``layer``.. with the steering hook, and
    reads the label-word logits at the last tokens (never the whole vocabulary). A
    ``TransformerBridge`` cannot start a forward pass at a block: each evaluation runs the whole
    model, as ``label_accuracy`` does."""

    @torch.no_grad()
    def __init__(
        self,
        model: HookedTransformer,
        tokens: Int[Tensor, "n ctx"],
        last: Int[Tensor, " n"],
        label_ids: Sequence[int],
        truth: Int[Tensor, " n"],
        hook_name: str,
        batch_size: int = 16,
    ) -> None:
        check_hooks(model, [hook_name])
        layer = layer_of(hook_name)
        if layer is None:
            raise ValueError(f"{hook_name} is not inside a block (blocks.L....)")
        self.model, self.layer, self.hook_name, self.truth = model, layer, hook_name, truth
        self.ids = torch.as_tensor(list(label_ids), device=model.cfg.device)
        self.resumes = unembeds_residual(model)
        self.batches = []  # (the residual entering block ``layer``, or the tokens; last tokens)
        for start in range(0, tokens.shape[0], batch_size):
            batch = tokens[start : start + batch_size].to(model.cfg.device)
            if self.resumes:
                batch = model(batch, stop_at_layer=layer, prepend_bos=False)
            self.batches.append((batch, last[start : start + batch_size].to(model.cfg.device)))

    @torch.no_grad()
    def accuracy(self, vector: Float[Tensor, " d"] | None = None, strength: float = 0.0) -> float:
        correct, seen = 0, 0
        for inputs, rows_last in self.batches:
            hooks = []
            if vector is not None and strength != 0.0:
                hooks = [(self.hook_name, steering_hook(vector, strength, positions=rows_last))]
            logits = self._label_logits(inputs, rows_last, hooks)
            truth = self.truth[seen : seen + logits.shape[0]]
            correct += int((logits.argmax(-1).cpu() == truth).sum())
            seen += logits.shape[0]
        return correct / seen

    def _label_logits(self, inputs: Tensor, rows_last: Tensor, hooks: list) -> Tensor:
        """The label words' logits at each prompt's last token, with ``hooks`` on."""
        model, at = self.model, torch.arange(inputs.shape[0])
        if not self.resumes:
            logits = model.run_with_hooks(inputs, fwd_hooks=hooks, prepend_bos=False)
            return logits[at, rows_last][:, self.ids]
        final = model.run_with_hooks(
            inputs.clone(),
            start_at_layer=self.layer,
            stop_at_layer=model.cfg.n_layers,
            fwd_hooks=hooks,
        )
        at_last = model.ln_final(final[at, rows_last])
        return at_last @ model.W_U[:, self.ids] + model.b_U[self.ids]
