"""Held-out evaluation: an SAE spliced into its model, on SAELens' definitions."""

from types import SimpleNamespace

import pytest
import torch
from sae_lens.evals import get_recons_loss
from sae_lens.training.activation_scaler import ActivationScaler

from sae_lens_bae.evaluation import spliced_losses, spliced_scores


class Scaled:
    """A stand-in SAE: reconstructs its input times ``factor`` (1: perfect, 0: ablation)."""

    device, dtype = "cpu", torch.float32

    def __init__(self, factor, hook="blocks.0.hook_resid_post"):
        self.factor = factor
        self.cfg = SimpleNamespace(metadata=SimpleNamespace(hook_head_index=None, hook_name=hook))

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

    def halved(acts, hook):  # noqa: ARG001  no tokenizer, so no token is ignored
        return acts * 0.5

    expected = tiny_llama.run_with_hooks(tokens, return_type="loss", loss_per_token=True,
                                         prepend_bos=False, fwd_hooks=[(hook, halved)])  # fmt: skip
    assert half["ce_loss_with_sae"] == pytest.approx(expected.mean().item(), rel=1e-5)
    assert 0 < half["kl_div_with_sae"] < half["kl_div_with_ablation"]


def test_spliced_losses_are_saelens_get_recons_loss_averaged_as_its_evals_do(tiny_llama):
    torch.manual_seed(1)
    tokens = torch.randint(1, 100, (5, 10))
    bos = 7  # what run_evals ignores: a tokenizer's BOS, EOS and padding
    tokens[:, 0] = bos
    hook, sae = "blocks.0.hook_resid_post", Scaled(0.7)
    ours = spliced_losses(tiny_llama, {"s": sae}, tokens, hook, input_scale=2.0, batch_size=2,
                          outlier_norm_ratio=None, ignore_tokens=[bos])["s"]  # fmt: skip
    theirs = get_recons_loss(sae, tiny_llama, ActivationScaler(2.0), tokens, True, True,
                             ignore_tokens=[bos], model_kwargs={"prepend_bos": False},
                             hook_name=hook)  # fmt: skip
    mask = tokens != bos  # get_downstream_reconstruction_metrics' masking and means
    for key, value in theirs.items():
        kept = mask if value.shape[1] == mask.shape[1] else mask[:, :-1]
        assert ours[key] == pytest.approx(value[kept].mean().item(), rel=1e-5), key
    # the per-sequence sums give the same means, and a resample of sequences its own
    assert spliced_scores(ours["per_sequence"])["kl_div_with_sae"] == ours["kl_div_with_sae"]
    first = spliced_scores(ours["per_sequence"], [1, 0, 0, 0, 0])["kl_div_with_sae"]
    kl = theirs["kl_div_with_sae"][0, 1:].mean().item()
    assert first == pytest.approx(kl, rel=1e-5)
