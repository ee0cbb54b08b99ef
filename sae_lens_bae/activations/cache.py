"""Harvest hook activations once into safetensors shards, then train from the cache for many epochs.

The paper trains BAEs for hundreds of epochs over one fixed set of hidden states; running the LLM
again for every epoch would dominate the cost. ``harvest_activations`` runs the model once over a
tokenised dataset and stores, per shard, the token ids and the activations of every requested hook
(fp16 by default). A harvest that stops midway resumes from its last complete shard.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from jaxtyping import Float, Int
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from sae_lens_bae.activations.hooks import check_hooks, stop_layer
from sae_lens_bae.data import token_rows
from sae_lens_bae.reports import read_json, write_json

__all__ = ["META_FILE", "ActivationCache", "harvest_activations"]

META_FILE = "activations.json"
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


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
        meta = read_json(
            meta_path,
            "an activation cache's index",
            "harvest the activations again into a new folder",
            ("n_shards", "hooks", "n_sequences", "shard_sequences", "context_size"),
        )
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

    def _read(self, key: str, sequences: slice | None = None) -> Tensor:
        """``key`` of every shard, or of the shards that hold ``sequences`` (a step-1 slice)."""
        per_shard, n_seq = self.meta["shard_sequences"], self.meta["n_sequences"]
        start, stop, step = (sequences or slice(None)).indices(n_seq)
        if step != 1:
            raise ValueError(f"sequences must be a contiguous slice, got {sequences}")
        parts = []
        for index, shard in enumerate(self._shards()):
            first = index * per_shard
            lo, hi = max(start, first), min(stop, first + per_shard)
            if lo < hi:
                try:
                    with safe_open(shard, framework="pt") as f:
                        parts.append(f.get_slice(key)[lo - first : hi - first])
                except SafetensorError as error:
                    raise ValueError(
                        f"{shard} is not a readable shard ({error}); harvest the activations "
                        "again into a new folder"
                    ) from None
        return torch.cat(parts) if parts else torch.empty(0)

    def rank_sequences(self, rank: int, world: int) -> slice:
        """The contiguous block of sequences rank ``rank`` of ``world`` reads in data-parallel
        training: the blocks of the ranks cover every sequence once, within one of each other."""
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, world={world}), got {rank}")
        n_seq = self.meta["n_sequences"]
        return slice(rank * n_seq // world, (rank + 1) * n_seq // world)

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
        """All rows of one hook (optionally of a contiguous slice of sequences, reading only the
        shards that hold it), as ``dtype``."""
        if hook not in self.meta["hooks"]:
            raise KeyError(f"Hook {hook!r} was not harvested; this cache has {self.hooks}")
        acts = self._read(hook, sequences)  # [n_seq, kept positions, d]: only their shards
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
    tokens = token_rows(dataset)
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
    fix = "harvest into another folder, or delete this one"
    meta = read_json(meta_path, "an activation cache's index", fix) if meta_path.exists() else {}
    if {k: meta.get(k) for k in request} != request:
        meta = {**request, "n_shards_done": 0, "complete": False}  # a different request: restart
    write_json(meta_path, meta)
    stop_at = stop_layer(hooks)
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
        partial = out / f".shard_{shard:05d}.partial"  # a full disk leaves no truncated shard
        try:
            save_file(tensors, partial)
            os.replace(partial, out / f"shard_{shard:05d}.safetensors")
        finally:
            partial.unlink(missing_ok=True)
        meta["n_shards_done"] = shard + 1
        write_json(meta_path, meta)
    bar.close()
    meta["complete"] = True
    write_json(meta_path, meta)
    return ActivationCache(out, meta)


def _fingerprint(tokens: Tensor) -> str:
    return hashlib.sha256(tokens.to(torch.int64).numpy().tobytes()).hexdigest()[:16]
