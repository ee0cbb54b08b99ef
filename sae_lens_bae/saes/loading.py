"""Loading a saved SAE (a BAE or any SAELens architecture) with errors that say what to do.

``SAE.load_from_disk`` reports a foreign or truncated folder as a ``KeyError`` or a safetensors
header error from deep inside SAELens; ``load_sae`` checks the folder first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sae_lens import SAE
from sae_lens.constants import SAE_WEIGHTS_FILENAME
from sae_lens.registry import SAE_CLASS_REGISTRY
from safetensors import SafetensorError

from sae_lens_bae.saes.bae_config import read_cfg_json

__all__ = ["load_sae"]


def load_sae(path: str | Path, device: str = "cpu") -> SAE[Any]:
    """``SAE.load_from_disk(path, device)`` after checking the folder: its ``cfg.json`` (present,
    JSON, an SAE config of a registered architecture) and its weights (present, readable)."""
    path = Path(path)
    config = read_cfg_json(path)
    architecture = config["architecture"]
    if architecture not in SAE_CLASS_REGISTRY:
        raise ValueError(
            f"{path / 'cfg.json'} names the architecture {architecture!r}, which no imported "
            f"package registers (known: {', '.join(sorted(SAE_CLASS_REGISTRY))}); import the "
            "package that defines it, or point to another folder"
        )
    weights = path / SAE_WEIGHTS_FILENAME
    if not weights.is_file():
        raise FileNotFoundError(f"No {SAE_WEIGHTS_FILENAME} in {path}: save the SAE again")
    try:
        return SAE.load_from_disk(path, device)
    except SafetensorError as e:
        message = f"{weights} is not a readable safetensors file ({e}); save the SAE again"
        raise ValueError(message) from e
    except RuntimeError as e:  # torch's load_state_dict: the weights of another model
        if "state_dict" not in str(e):
            raise
        what = " ".join(str(e).split())
        message = f"{weights} does not hold this SAE's weights ({what}); save the SAE again"
        raise ValueError(message) from e
    except KeyError as e:
        message = (
            f"{path / 'cfg.json'} lacks the field {e} that a {architecture!r} config "
            "needs: it was not written by this version of SAELens"
        )
        raise ValueError(message) from e
