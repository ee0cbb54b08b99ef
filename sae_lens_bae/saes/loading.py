"""Loading a saved SAE (a BAE or any SAELens architecture) with errors that say what to do.

``SAE.load_from_disk`` reports a foreign or truncated folder as a ``KeyError`` or a safetensors
header error from deep inside SAELens; ``load_sae`` checks the folder first, then loads it with
the architecture's own class. A BAE's cfg.json is read strictly (an unknown or missing field
refused in one line) by its own config classes: ``StrictLoading.from_dict``, which the BAE's
classes reach (``BAE.load_from_disk``, ``BAE.from_dict``, ``load_sae``) and SAELens' training
loaders and runner configs reach through the registered ``BAETrainingSAEConfig``. SAELens'
``SAE`` builds every architecture's config with its own lenient ``SAEConfig.from_dict``, which
this package leaves as it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from sae_lens import SAE, __version__
from sae_lens.constants import SAE_CFG_FILENAME, SAE_WEIGHTS_FILENAME
from sae_lens.registry import SAE_CLASS_REGISTRY, SAE_TRAINING_CLASS_REGISTRY
from sae_lens.saes.sae import SAEConfig, SAEMetadata, TrainingSAEConfig
from safetensors import SafetensorError

__all__ = ["StrictLoading", "load_sae", "read_cfg_json", "strict_config"]


def read_cfg_json(folder: str | Path) -> dict[str, Any]:
    """The ``cfg.json`` of a saved SAE folder, with an error that says what is wrong with it
    (missing, not JSON, not an object) instead of a parser's traceback."""
    path = Path(folder) / SAE_CFG_FILENAME
    if not path.is_file():
        raise FileNotFoundError(
            f"No {SAE_CFG_FILENAME} in {folder}: expected a folder written by "
            "save_inference_model / save_model"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); save the SAE again") from e
    if not isinstance(data, dict) or "architecture" not in data:
        raise ValueError(f"{path} is not an SAE config (a JSON object with an 'architecture')")
    return data


Config = TypeVar("Config", bound=SAEConfig)


READER_ADDED = {"finetuning_scaling_factor": False}
"""What SAELens' disk reader adds to every cfg.json it reads (a pre-6.0 field, False when the
weights hold no scaling factor): not a field of the file."""


def strict_config(config_dict: dict[str, Any], config_class: type[Config]) -> Config:
    """``config_class`` from a saved cfg.json dict, strictly: SAELens' ``from_dict`` drops unknown
    keys and defaults missing ones, so a typo (``"bit": 2``) or a truncated file would load
    another model; here both raise. An inference config also reads a training checkpoint's
    cfg.json (every field of the architecture's registered training config), keeping its own
    fields. ``metadata.sae_lens_version`` is required too: without it SAELens reads the file as a
    pre-6.0 config, dropping unknown fields before any check. A training config is a recipe that
    SAELens' runners also build from partial dicts (a YAML's few fields, defaults for the rest):
    for it only unknown fields are refused, missing ones take the config's defaults."""
    architecture = config_class.architecture()
    if config_dict.get("architecture", architecture) != architecture:
        raise ValueError(
            f"Config is for architecture {config_dict['architecture']!r}, not {architecture!r}"
        )
    own = {f.name for f in fields(config_class)} - {"metadata"}
    given = {
        name
        for name, value in config_dict.items()
        if name not in ("architecture", "metadata")
        and not (name in READER_ADDED and value == READER_ADDED[name])
    }
    expected, kinds = own, config_class.__name__
    training = SAE_TRAINING_CLASS_REGISTRY.get(architecture, (None, None))[1]
    if training is not None and not issubclass(config_class, TrainingSAEConfig):
        training_fields = {f.name for f in fields(training)} - {"metadata"}
        kinds = f"{config_class.__name__} (or {training.__name__}, a training checkpoint's)"
        if given & (training_fields - own):  # a training checkpoint's cfg.json
            expected = training_fields
    # SAELens' own fields may be absent (a file an older SAELens wrote before it added one):
    # they take SAELens' defaults, as its own reader gives them; the architecture's may not
    hosts = {f.name for f in fields(TrainingSAEConfig)} | {f.name for f in fields(SAEConfig)}
    required = expected - (hosts - _declared_by_architecture(config_class, training))
    extra, missing = sorted(given - expected), sorted(required - given)
    metadata = config_dict.get("metadata")
    if not (isinstance(metadata, dict) and "sae_lens_version" in metadata):
        missing.append("metadata.sae_lens_version")
    if issubclass(config_class, TrainingSAEConfig):  # a recipe: defaults for what it leaves out
        missing = []
    problems = [f"unknown field(s) {extra}"] * bool(extra) + [f"missing field(s) {missing}"] * bool(
        missing
    )
    if problems:
        written = _newer_saelens(metadata) if extra else None
        what = (
            f"the file was written by SAELens {written}, newer than the installed {__version__}: "
            "upgrade sae-lens to read its fields, or load it with SAE.load_from_disk, which drops "
            "the fields the installed SAELens does not know"
            if written
            else "correct the file or save the SAE again"
        )
        raise ValueError(
            f"Invalid {architecture} config: {'; '.join(problems)}. A {architecture} cfg.json "
            f"holds exactly the fields of {kinds}, 'architecture' and 'metadata': {what}."
        )
    cfg = config_class(**{k: config_dict[k] for k in own if k in config_dict})
    if isinstance(metadata, dict):
        cfg.metadata = SAEMetadata(**metadata)
    return cfg


def _declared_by_architecture(*classes: type | None) -> set[str]:
    """Fields an architecture's config classes declare themselves (a SAELens field they redeclare
    with their own default, as the BAE does ``apply_b_dec_to_input``, included)."""
    own: set[str] = set()
    for cls in classes:
        if cls is None:
            continue
        for klass in cls.__mro__:
            if klass.__module__.startswith("sae_lens."):
                break
            own |= set(getattr(klass, "__annotations__", {}))
    return own


def _release(version: Any) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a version string such as SAELens writes; None otherwise."""
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", str(version))
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def _newer_saelens(metadata: Any) -> str | None:
    """The SAELens version that wrote a cfg.json, when its release is newer than the installed
    one's (its unknown fields may be fields that version added); None otherwise."""
    written = metadata.get("sae_lens_version") if isinstance(metadata, dict) else None
    mine, theirs = _release(__version__), _release(written)
    return str(written) if mine and theirs and theirs > mine else None


class StrictLoading:
    """Mixin of a config class whose saved cfg.json is read by :func:`strict_config`: its
    ``from_dict``, which the architecture's own SAE class reaches when it names this class in
    ``get_sae_config_class_for_architecture`` (SAELens' hook for it), so ``BAE.load_from_disk``
    and :func:`load_sae` read strictly; a registered training config's is what SAELens' training
    loaders and runner configs call."""

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> Any:
        return strict_config(config_dict, cls)  # type: ignore[type-var]


def load_sae(path: str | Path, device: str = "cpu") -> SAE[Any]:
    """``load_from_disk(path, device)`` of the architecture's registered SAE class (``BAE`` for a
    BAE, whose cfg.json is read strictly; SAELens' reading for every other architecture) after
    checking the folder: its ``cfg.json`` (present, JSON, an SAE config of a registered
    architecture) and its weights (present, readable)."""
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
        return SAE.get_sae_class_for_architecture(architecture).load_from_disk(path, device)
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
