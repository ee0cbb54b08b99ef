"""Harvest hook activations once into safetensors shards, then train from the cache for many epochs.

The paper trains BAEs for hundreds of epochs over one fixed set of hidden states; running the LLM
again for every epoch would dominate the cost. ``harvest_activations`` runs the model once over a
tokenised dataset and stores, per shard, the token ids and the activations of every requested hook
(fp16 by default). A harvest that stops midway resumes from its last complete shard.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from jaxtyping import Bool, Float, Int
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

__all__ = [
    "ActivationCache",
    "LayerActivations",
    "check_hooks",
    "check_layers",
    "drop_outliers",
    "harvest_activations",
    "harvest_layer",
    "norm_scale",
    "outlier_mask",
]

META_FILE = "activations.json"
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def check_hooks(model: HookedTransformer, hooks: Sequence[str]) -> None:
    unknown = [h for h in hooks if h not in model.hook_dict]
    if unknown:
        import difflib

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


def _layer_of(hook: str) -> int | None:
    parts = hook.split(".")
    return int(parts[1]) if parts[0] == "blocks" and len(parts) > 1 and parts[1].isdigit() else None


@dataclass
class ActivationCache:
    """A harvested activation set on disk: token ids plus one ``[tokens, d]`` matrix per hook.

    Rows are the kept token positions of every sequence in order (position 0, the BOS, is dropped
    when ``drop_bos`` was set); ``token_positions`` says which (sequence, position) each row is.
    """

    path: Path
    meta: dict[str, Any]

    @classmethod
    def load(cls, path: str | Path) -> ActivationCache:
        path = Path(path)
        meta_path = path / META_FILE
        if not meta_path.exists():
            raise FileNotFoundError(f"{path} is not an activation cache (no {META_FILE})")
        meta = json.loads(meta_path.read_text())
        if not meta.get("complete"):
            raise ValueError(
                f"The harvest in {path} did not finish ({meta.get('n_shards_done', 0)} of "
                f"{meta['n_shards']} shards); run harvest_activations again to resume it"
            )
        return cls(path, meta)

    @property
    def hooks(self) -> list[str]:
        return list(self.meta["hooks"])

    def _shards(self) -> list[Path]:
        return [self.path / f"shard_{i:05d}.safetensors" for i in range(self.meta["n_shards"])]

    def _read(self, key: str) -> Tensor:
        parts = []
        for shard in self._shards():
            with safe_open(shard, framework="pt") as f:
                parts.append(f.get_tensor(key))
        return torch.cat(parts)

    def tokens(self) -> Int[Tensor, "n_seq ctx"]:
        """Token ids of every harvested sequence (BOS included)."""
        return self._read("tokens")

    def token_positions(self) -> Int[Tensor, "n_rows 2"]:
        """(sequence index, position) of every activation row."""
        n_seq, ctx = self.meta["n_sequences"], self.meta["context_size"]
        first = 1 if self.meta["drop_bos"] else 0
        seq = torch.arange(n_seq).repeat_interleave(ctx - first)
        pos = torch.arange(first, ctx).repeat(n_seq)
        return torch.stack([seq, pos], dim=1)

    def activations(
        self, hook: str, dtype: torch.dtype = torch.float32, sequences: slice | None = None
    ) -> Float[Tensor, "n_rows d"]:
        """All rows of one hook (optionally of a slice of sequences), as ``dtype``."""
        if hook not in self.meta["hooks"]:
            raise KeyError(f"Hook {hook!r} was not harvested; this cache has {self.hooks}")
        acts = self._read(hook)  # [n_seq, kept positions, d]
        if sequences is not None:
            acts = acts[sequences]
        return acts.reshape(-1, acts.shape[-1]).to(dtype)


def harvest_activations(
    model: HookedTransformer,
    dataset: Dataset | Int[Tensor, "n_seq ctx"],
    hooks: Sequence[str],
    out_dir: str | Path,
    *,
    batch_size: int = 16,
    shard_sequences: int = 256,
    dtype: str = "float16",
    drop_bos: bool = True,
    progress: bool = True,
) -> ActivationCache:
    """Run ``model`` once over ``dataset`` (``input_ids`` rows) and store ``hooks``' activations.

    Runs only up to the last requested layer. Resumes an interrupted harvest of the same request.
    NaN/Inf activations (or values that overflow ``dtype``) stop the harvest with an error; the
    shards already written stay valid.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {dtype!r}")
    hooks = list(dict.fromkeys(hooks))
    check_hooks(model, hooks)
    tokens = dataset if isinstance(dataset, Tensor) else torch.as_tensor(dataset["input_ids"])
    if tokens.ndim != 2:
        raise ValueError(f"Expected token rows of shape [n_seq, ctx], got {tuple(tokens.shape)}")
    n_seq, ctx = tokens.shape
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    request = {
        "model_name": model.cfg.model_name,
        "hooks": hooks,
        "n_sequences": n_seq,
        "context_size": ctx,
        "dtype": dtype,
        "drop_bos": drop_bos,
        "shard_sequences": shard_sequences,
        "n_shards": -(-n_seq // shard_sequences),
        "tokens_sha": _fingerprint(tokens),
    }
    meta_path = out / META_FILE
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if {k: meta.get(k) for k in request} != request:
        meta = {**request, "n_shards_done": 0, "complete": False}  # a different request: restart
    meta_path.write_text(json.dumps(meta, indent=2))
    layers = [_layer_of(h) for h in hooks]
    stop_at = None if None in layers else max(layers) + 1  # type: ignore[type-var]
    first = 1 if drop_bos else 0
    store_dtype = _DTYPES[dtype]
    done = min(meta["n_shards_done"] * shard_sequences, n_seq)
    bar = tqdm(total=n_seq, initial=done, desc="Harvesting", unit="seq", disable=not progress)
    for shard in range(meta["n_shards_done"], meta["n_shards"]):
        rows = tokens[shard * shard_sequences : (shard + 1) * shard_sequences]
        parts: dict[str, list[Tensor]] = {h: [] for h in hooks}
        for start in range(0, rows.shape[0], batch_size):
            batch = rows[start : start + batch_size].to(model.cfg.device)
            with torch.no_grad():
                _, cache = model.run_with_cache(
                    batch, names_filter=hooks, stop_at_layer=stop_at, prepend_bos=False
                )
            for h in hooks:
                acts = cache[h][:, first:]
                stored = acts.to(store_dtype)
                if not torch.isfinite(stored).all():
                    bad = "NaN/Inf" if not torch.isfinite(acts).all() else f"overflow in {dtype}"
                    raise ValueError(
                        f"{bad} activations at hook {h!r} in sequences "
                        f"{shard * shard_sequences + start}.. of the dataset. Shards 0..{shard - 1}"
                        f" in {out} are kept; for overflow use dtype='float32' or 'bfloat16'."
                    )
                parts[h].append(stored.cpu())
            bar.update(batch.shape[0])
        tensors = {h: torch.cat(p).contiguous() for h, p in parts.items()}
        tensors["tokens"] = rows.contiguous()
        save_file(tensors, out / f"shard_{shard:05d}.safetensors")
        meta["n_shards_done"] = shard + 1
        meta_path.write_text(json.dumps(meta, indent=2))
    bar.close()
    meta["complete"] = True
    meta_path.write_text(json.dumps(meta, indent=2))
    return ActivationCache(out, meta)


def _fingerprint(tokens: Tensor) -> str:
    import hashlib

    return hashlib.sha256(tokens.to(torch.int64).numpy().tobytes()).hexdigest()[:16]


def outlier_mask(
    activations: Float[Tensor, "n d"], max_norm_ratio: float | None = 10.0
) -> Bool[Tensor, " n"]:
    """True for the rows to keep: norm at most ``max_norm_ratio`` x the median norm (all rows
    when ``max_norm_ratio`` is None). A mask, so paired sets (a transcoder's input and target)
    can drop the same rows."""
    if max_norm_ratio is None:
        return torch.ones(activations.shape[0], dtype=torch.bool)
    norms = activations.float().norm(dim=-1)
    return norms <= max_norm_ratio * norms.median()


def drop_outliers(
    activations: Float[Tensor, "n d"], max_norm_ratio: float | None = 10.0
) -> tuple[Float[Tensor, "m d"], int]:
    """Drop rows whose norm exceeds ``max_norm_ratio`` x the median norm; return (kept, dropped).

    LLMs put "massive activations" (norms thousands of times the median) on attention-sink tokens,
    e.g. the first token after BOS. A handful of them would dominate any squared-error objective.
    """
    keep = outlier_mask(activations, max_norm_ratio)
    return activations[keep], int((~keep).sum())


def norm_scale(acts: Float[Tensor, "n d"]) -> float:
    """sqrt(d) / mean norm: the factor that gives ``acts`` a mean norm of sqrt(d), as SAELens'
    ``expected_average_only_in`` would. Every command here scales states by it once, for all
    the models it trains, so their losses share one unit."""
    return acts.shape[1] ** 0.5 / acts.norm(dim=-1).mean().item()


@dataclass
class LayerActivations:
    """One layer's activations over a text source, ready for training and held-out evaluation.

    Rows are tokens (BOS dropped, outliers by norm dropped), split by *sequence* into training
    and held-out rows, every hook scaled once by sqrt(d) / (mean training norm) as SAELens'
    ``expected_average_only_in`` would (``scales[hook]``), so that models trained on them share
    one loss unit. ``positions``/``token_ids`` locate the held-out rows in ``sequences``.
    """

    hook: str
    train: dict[str, Tensor]
    test: dict[str, Tensor]
    scales: dict[str, float]
    positions: Tensor
    token_ids: Tensor
    sequences: Tensor
    tokenizer: Any
    model: str
    dataset: str
    outliers_dropped: int


def harvest_layer(
    model_name: str,
    dataset: str | None,
    layer: int | None,
    out_dir: str | Path,
    *,
    extra_hooks: Sequence[str] = (),
    text_column: str | None = None,
    context_size: int = 128,
    max_sequences: int | None = 1536,
    held_out_fraction: float = 0.1,
    outlier_norm_ratio: float = 10.0,
    device: str = "cpu",
) -> LayerActivations:
    """Load the model and the text (``None``: the embedded corpus), harvest
    ``blocks.{layer}.hook_resid_post`` (``None``: the middle layer) and ``extra_hooks`` (names
    inside that layer after ``blocks.{layer}.``) once, then drop, scale and split."""
    from sae_lens_bae.data import default_corpus, load_token_dataset
    from sae_lens_bae.models import load_model

    if not 0.0 < held_out_fraction < 1.0:
        raise ValueError(f"held_out_fraction must be in (0, 1), got {held_out_fraction}")
    model = load_model(model_name, device=device)
    layer = model.cfg.n_layers // 2 if layer is None else layer
    check_layers(model, [layer])
    hook = f"blocks.{layer}.hook_resid_post"
    hooks = [hook, *[f"blocks.{layer}.{name}" for name in extra_hooks]]
    check_hooks(model, hooks)
    source = dataset if dataset is not None else str(default_corpus())
    tokens = load_token_dataset(
        source, model.tokenizer, context_size, text_column=text_column, max_sequences=max_sequences
    )
    cache = harvest_activations(model, tokens, hooks, Path(out_dir), batch_size=8)
    tokenizer = model.tokenizer
    del model

    n_seq = cache.meta["n_sequences"]
    n_train_seq = n_seq - max(1, round(held_out_fraction * n_seq))
    acts = {h: cache.activations(h) for h in hooks}
    per_seq = acts[hook].shape[0] // n_seq
    keep = outlier_mask(acts[hook], outlier_norm_ratio)  # the same rows of every hook
    n_train = int(keep[: n_train_seq * per_seq].sum())
    positions = cache.token_positions()[keep]
    sequences = cache.tokens()
    token_ids = sequences[positions[:, 0], positions[:, 1]]
    train, test, scales = {}, {}, {}
    for h in hooks:
        kept = acts[h][keep]
        scales[h] = norm_scale(kept[:n_train])
        train[h], test[h] = kept[:n_train] * scales[h], kept[n_train:] * scales[h]
    return LayerActivations(
        hook=hook,
        train=train,
        test=test,
        scales=scales,
        positions=positions[n_train:],
        token_ids=token_ids[n_train:],
        sequences=sequences,
        tokenizer=tokenizer,
        model=model_name,
        dataset=source,
        outliers_dropped=int((~keep).sum()),
    )
