"""One name for each thing: the top level holds the user-level API only, with no old names (0.2.0
is the first release), and one hook point has one name however it is given."""

import warnings

import pytest

import sae_lens_bae
from sae_lens_bae import EntropyRecipe
from sae_lens_bae.activations import hook_point
from sae_lens_bae.experiments.quickstart import QuickstartConfig
from sae_lens_bae.experiments.synthetic import SyntheticConfig


def test_the_top_level_is_the_user_api():
    for name in sae_lens_bae.__all__:
        assert getattr(sae_lens_bae, name) is not None
    internals = {"bae_objective", "covariance_penalty", "minibatch_entropy", "bits_to_values"}
    assert not internals & set(sae_lens_bae.__all__)
    assert {"estimate_entropies", "EntropyRecipe", "bae_config", "top_k_records", "comsem",
            "load_token_dataset"} <= set(sae_lens_bae.__all__)  # fmt: skip
    for old in ("bae_objective", "estimate_entropy", "no_such_name"):  # no aliases: 0.2.0 is first
        with pytest.raises(AttributeError):
            getattr(sae_lens_bae, old)


def test_new_names_warn_nothing(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        QuickstartConfig(dataset="t.txt", recipe="paper", out=tmp_path)
        SyntheticConfig(grid="gpu", planted_bits=(0, 8))
        EntropyRecipe.long_run(512)


def test_hook_and_layer_name_one_hook_point(tiny_llama):
    layers = tiny_llama.cfg.n_layers
    assert hook_point(tiny_llama, "hook_resid_post") == f"blocks.{layers // 2}.hook_resid_post"
    assert hook_point(tiny_llama, "hook_resid_post", 0) == "blocks.0.hook_resid_post"
    assert hook_point(tiny_llama, "attn.hook_z", 1) == "blocks.1.attn.hook_z"
    assert hook_point(tiny_llama, "blocks.1.hook_mlp_out") == "blocks.1.hook_mlp_out"
    assert hook_point(tiny_llama, "blocks.1.hook_mlp_out", 1) == "blocks.1.hook_mlp_out"
    assert hook_point(tiny_llama, "hook_embed") == "hook_embed"
    with pytest.raises(ValueError, match="^hook blocks.1.hook_mlp_out is not in layer 0; give one"):
        hook_point(tiny_llama, "blocks.1.hook_mlp_out", 0)
    with pytest.raises(ValueError, match=f"^Layers \\[{layers}\\] do not exist"):
        hook_point(tiny_llama, "hook_resid_post", layers)
    with pytest.raises(ValueError, match="Unknown hook name"):
        hook_point(tiny_llama, "hook_resid_pots", 0)
