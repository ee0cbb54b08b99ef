"""Held-out evaluation: an SAE spliced into its model, on SAELens' definitions."""

import pytest
import torch

from sae_lens_bae.evaluation import spliced_losses


class Scaled:
    """A stand-in SAE: reconstructs its input times ``factor`` (1: perfect, 0: ablation)."""

    device, dtype = "cpu", torch.float32

    def __init__(self, factor):
        self.factor = factor

    def encode(self, x):
        return x

    def decode(self, acts):
        return acts * self.factor


def test_spliced_losses_of_a_perfect_and_of_an_ablating_sae(tiny_llama):
    torch.manual_seed(0)
    tokens = torch.randint(1, 100, (6, 12))
    hook = "blocks.0.hook_resid_post"
    metrics = spliced_losses(tiny_llama, {"perfect": Scaled(1.0), "zero": Scaled(0.0),
                                          "half": Scaled(0.5)}, tokens, hook, input_scale=3.0,
                             outlier_norm_ratio=None, batch_size=4)  # fmt: skip
    clean = tiny_llama(tokens, return_type="loss", loss_per_token=True, prepend_bos=False).mean()
    perfect, zero, half = metrics["perfect"], metrics["zero"], metrics["half"]
    assert perfect["ce_loss_without_sae"] == pytest.approx(clean.item(), rel=1e-5)
    assert perfect["ce_loss_with_sae"] == pytest.approx(clean.item(), rel=1e-5)
    assert perfect["kl_div_with_sae"] == pytest.approx(0.0, abs=1e-6)
    assert perfect["ce_loss_score"] == pytest.approx(1.0, abs=1e-4)
    assert perfect["kl_div_score"] == pytest.approx(1.0, abs=1e-4)
    assert zero["ce_loss_with_sae"] == pytest.approx(zero["ce_loss_with_ablation"], rel=1e-6)
    assert zero["ce_loss_score"] == pytest.approx(0.0, abs=1e-5)
    assert zero["kl_div_with_sae"] == pytest.approx(zero["kl_div_with_ablation"], rel=1e-6)

    def halved(acts, hook):  # noqa: ARG001  position 0 (the BOS) passes through unchanged
        acts = acts.clone()
        acts[:, 1:] *= 0.5
        return acts

    expected = tiny_llama.run_with_hooks(tokens, return_type="loss", loss_per_token=True,
                                         prepend_bos=False, fwd_hooks=[(hook, halved)])  # fmt: skip
    assert half["ce_loss_with_sae"] == pytest.approx(expected.mean().item(), rel=1e-5)
    assert 0 < half["kl_div_with_sae"] < half["kl_div_with_ablation"]
