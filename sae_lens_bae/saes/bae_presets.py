"""The old name of ``sae_lens_bae.saes.bae_recipes``, kept for one release."""

from sae_lens_bae.checks import warn_renamed
from sae_lens_bae.saes.bae_recipes import BAE_RECIPES, BAERecipe, RecipeName

warn_renamed("sae_lens_bae.saes.bae_presets", "sae_lens_bae.saes.bae_recipes", stacklevel=2)

BAE_PRESETS = BAE_RECIPES
BAEPreset = BAERecipe
PresetName = RecipeName

__all__ = ["BAE_PRESETS", "BAEPreset", "PresetName"]
