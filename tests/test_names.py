"""One name for each thing: the renamed API keeps its old names for one release, each with a
DeprecationWarning that names the new one; the top level holds the user-level API only."""

import importlib
import sys
import warnings

import pytest

import sae_lens_bae
from sae_lens_bae import BAE_RECIPES, EntropyRecipe, bae_config, code_entropy
from sae_lens_bae.activations import hook_point
from sae_lens_bae.experiments.quickstart import QuickstartConfig
from sae_lens_bae.experiments.synthetic import GRIDS, SyntheticConfig
from sae_lens_bae.training.live import LiveTrainingConfig

DEPRECATED = "is deprecated and goes in 0.3.0: use"


def test_an_old_field_name_sets_the_new_field_with_a_warning(tmp_path):
    with pytest.warns(DeprecationWarning, match=f"^corpus {DEPRECATED} dataset$"):
        old = QuickstartConfig(corpus="texts.txt", bae_preset="paper", out=tmp_path)
    assert old == QuickstartConfig(dataset="texts.txt", recipe="paper", out=tmp_path)
    assert old.corpus is None and old.bae_preset is None
    with pytest.warns(DeprecationWarning, match=f"^preset {DEPRECATED} grid$"):
        assert SyntheticConfig(preset="test", ranks=(0, 2)) == SyntheticConfig(
            grid="test", planted_bits=(0, 2)
        )


def test_an_old_and_a_new_name_of_one_setting_are_refused_together():
    with pytest.raises(ValueError, match="^corpus and dataset are the same setting; give dataset"):
        QuickstartConfig(corpus="a.txt", dataset="b.txt")


def test_the_old_width_of_bae_train_warns_and_still_reaches_the_run():
    with pytest.warns(DeprecationWarning, match=rf"^d_sae {DEPRECATED} --expansion"):
        cfg = LiveTrainingConfig(out="o", dataset="x", d_sae=2304)
    assert cfg.d_sae == 2304 and cfg.expansion == 4  # the run takes d_sae when it is given


def test_renamed_functions_and_values_give_what_the_new_names_give():
    with pytest.warns(DeprecationWarning, match="EntropyRecipe.long_run"):
        assert EntropyRecipe.paper(512, steps=2000) == EntropyRecipe.long_run(512, steps=2000)
    with pytest.warns(DeprecationWarning, match="long_run"):
        assert EntropyRecipe.based_on("paper", 256) == EntropyRecipe.long_run(256)
    with pytest.warns(DeprecationWarning, match="recipe="):
        assert bae_config(64, preset="entropy") == bae_config(64, recipe="entropy")
    with pytest.warns(DeprecationWarning, match="the grid name paper"):
        assert SyntheticConfig(grid="paper").chosen_grid() == GRIDS["gpu"]
    with pytest.warns(DeprecationWarning, match="sae_lens_bae.code_entropy"):
        assert sae_lens_bae.estimate_entropy is code_entropy
    with pytest.warns(DeprecationWarning, match="code_entropy"):
        from sae_lens_bae.entropy import estimate_entropy
    assert estimate_entropy is code_entropy


def test_the_old_recipe_module_and_names_still_import():
    sys.modules.pop("sae_lens_bae.saes.bae_presets", None)
    with pytest.warns(DeprecationWarning, match="sae_lens_bae.saes.bae_recipes"):
        old = importlib.import_module("sae_lens_bae.saes.bae_presets")
    assert old.BAE_PRESETS is BAE_RECIPES
    with pytest.warns(DeprecationWarning, match="BAE_RECIPES"):
        from sae_lens_bae.saes.bae_recipes import BAE_PRESETS
    assert BAE_PRESETS is BAE_RECIPES


def test_the_top_level_is_the_user_api_and_moved_internals_still_import_once_more():
    for name in sae_lens_bae.__all__:
        assert getattr(sae_lens_bae, name) is not None
    internals = {"bae_objective", "covariance_penalty", "minibatch_entropy", "bits_to_values"}
    assert not internals & set(sae_lens_bae.__all__)
    assert {"estimate_entropies", "EntropyRecipe", "bae_config", "top_k_records", "comsem",
            "load_token_dataset"} <= set(sae_lens_bae.__all__)  # fmt: skip
    from sae_lens_bae.losses import bae_objective

    with pytest.warns(DeprecationWarning, match="sae_lens_bae.losses.bae_objective"):
        assert sae_lens_bae.bae_objective is bae_objective
    with pytest.raises(AttributeError):
        sae_lens_bae.no_such_name  # noqa: B018


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
