"""Hidden-state compression with a BAE: store only the bits that surprise the prior.

A BAE's code differs from the rounded prior round(p) in the bits that are in their rarer state
(its L0), so the sparser the code the fewer indices are stored. ``compress`` keeps, per vector,
the indices of bits whose code differs from round(p) and whose burstiness log2|h_B - p| is at
least ``threshold`` (in [log2 0.5, 0]); at log2 0.5 that is every differing bit, so the code is
kept exactly; higher thresholds drop the flips of bits whose prior was close to 1/2 (the least
surprising ones). ``decompress`` flips round(p) at the stored indices and decodes. On disk the
flips are bit-packed indices (ceil(log2 n_bits) bits each) or, when flips are dense enough that
this is larger, a packed bitmap.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from sae_lens_bae.features.burstiness import burstiness, code_prior
from sae_lens_bae.saes.bae import bits_to_values

__all__ = [
    "LOSSLESS_THRESHOLD",
    "CompressedStates",
    "compress",
    "compression_report",
    "decoder_bytes",
    "decompress",
    "pack_uints",
    "prior_fingerprint",
    "unpack_uints",
]

LOSSLESS_THRESHOLD = math.log2(0.5)
"""At this threshold every bit whose code differs from round(prior) is stored."""


def pack_uints(values: Int[Tensor, " n"], width: int) -> bytes:
    """Non-negative integers as a little-endian bit stream of ``width`` bits each."""
    if values.numel() and (values.min() < 0 or values.max() >= 2**width):
        raise ValueError(f"values must lie in [0, 2^{width}) to pack at {width} bits")
    shifts = torch.arange(width, dtype=torch.int64)
    bits = ((values.to(torch.int64)[:, None] >> shifts) & 1).to(torch.uint8).numpy()
    return np.packbits(bits.reshape(-1), bitorder="little").tobytes()


def unpack_uints(data: bytes, width: int, count: int) -> Int[Tensor, " count"]:
    """Inverse of ``pack_uints``."""
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    bits = bits[: count * width].reshape(count, width).astype(np.int64)
    return torch.from_numpy((bits << np.arange(width, dtype=np.int64)).sum(1))


def _width(n: int) -> int:
    return max(1, math.ceil(math.log2(max(n, 2))))


@dataclass
class CompressedStates:
    """Per vector, the bits whose value flips the rounded prior: ``counts[i]`` indices of vector
    i, all vectors' indices concatenated in ``indices``."""

    counts: Int[Tensor, " n"]
    indices: Int[Tensor, " total"]
    n_bits: int
    threshold: float
    prior_key: str | None = None  # prior_fingerprint of the prior they were compressed with

    def codes(self, prior: Float[Tensor, " n_bits"]) -> Float[Tensor, "n n_bits"]:
        """The binary codes: round(prior) with the stored bits flipped. Refuses a prior
        other than the one the states were compressed with (its rounding would differ, and so
        would every decompressed state, silently)."""
        if prior.shape[-1] != self.n_bits:
            raise ValueError(
                f"these states were compressed with {self.n_bits} code bits, the prior has "
                f"{prior.shape[-1]}: use the prior of the BAE that compressed them"
            )
        if self.prior_key is not None and prior_fingerprint(prior) != self.prior_key:
            raise ValueError(
                "these states were compressed with another prior (another BAE, or another "
                "evaluation prior): decompress with the BAE and prior that compressed them"
            )
        base = (prior.float().cpu() > 0.5).float()
        codes = base.repeat(self.counts.shape[0], 1)
        rows = torch.repeat_interleave(torch.arange(self.counts.shape[0]), self.counts)
        codes[rows, self.indices] = 1.0 - codes[rows, self.indices]
        return codes

    def save(self, path: str | Path) -> int:
        """Write the packed form (one safetensors file); returns its size in bytes.

        The flips are stored as bit-packed indices (ceil(log2 n_bits) bits each, with per-vector
        counts) or, when that would be larger (more than about n_bits / log2 n_bits flips per
        vector), as a packed n x n_bits bitmap: whichever is smaller."""
        n, layout = self.counts.shape[0], self.layout()
        if layout == "indices":
            tensors = {
                "counts": _bytes_tensor(pack_uints(self.counts, _width(self.n_bits + 1))),
                "indices": _bytes_tensor(pack_uints(self.indices, _width(self.n_bits))),
            }
        else:
            mask = torch.zeros(n, self.n_bits, dtype=torch.uint8)
            rows = torch.repeat_interleave(torch.arange(n), self.counts)
            mask[rows, self.indices] = 1
            packed = np.packbits(mask.numpy().reshape(-1), bitorder="little").tobytes()
            tensors = {"bitmap": _bytes_tensor(packed)}
        meta = {
            "n": str(n),
            "total": str(self.indices.shape[0]),
            "n_bits": str(self.n_bits),
            "threshold": repr(self.threshold),
            "layout": layout,
            "format": "sae_lens_bae.compression/1",
        }
        if self.prior_key is not None:
            meta["prior_key"] = self.prior_key
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial")  # a full disk leaves the old file
        try:
            save_file(tensors, str(partial), metadata=meta)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        return path.stat().st_size

    @classmethod
    def load(cls, path: str | Path) -> CompressedStates:
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                data = {key: f.get_tensor(key).numpy().tobytes() for key in f.keys()}  # noqa: SIM118
            n, total, n_bits = int(meta["n"]), int(meta["total"]), int(meta["n_bits"])
            layout = meta.get("layout", "indices")
            needed = ("bitmap",) if layout == "bitmap" else ("counts", "indices")
            missing = [name for name in (*needed, "threshold") if name not in {**data, **meta}]
            if missing:
                raise KeyError(missing[0])
        except (SafetensorError, KeyError, ValueError) as error:
            raise ValueError(
                f"{path} is not compressed states ({type(error).__name__}: {error}); "
                "compress the states again (sae_lens_bae.compression.compress)"
            ) from None
        if layout == "bitmap":
            bits = np.unpackbits(np.frombuffer(data["bitmap"], dtype=np.uint8), bitorder="little")
            mask = torch.from_numpy(bits[: n * n_bits].reshape(n, n_bits).astype(bool))
            counts, indices = mask.sum(-1), mask.nonzero()[:, 1]
        else:
            counts = unpack_uints(data["counts"], _width(n_bits + 1), n)
            indices = unpack_uints(data["indices"], _width(n_bits), total)
        return cls(
            counts=counts,
            indices=indices,
            n_bits=n_bits,
            threshold=float(meta["threshold"]),
            prior_key=meta.get("prior_key"),
        )

    def layout(self) -> str:
        """How ``save`` stores these flips: ``indices`` or ``bitmap``."""
        n = self.counts.shape[0]
        as_indices = self.indices.shape[0] * _width(self.n_bits) + n * _width(self.n_bits + 1)
        return "indices" if as_indices <= n * self.n_bits else "bitmap"


def prior_fingerprint(prior: Float[Tensor, " n_bits"]) -> str:
    """What compression depends on of a prior, its rounding round(p), as a short hash: saved
    with the compressed states so that they are never decompressed with another prior."""
    rounded = (prior.detach().float().cpu() > 0.5).numpy()
    return hashlib.sha256(np.packbits(rounded).tobytes()).hexdigest()[:16]


def _bytes_tensor(data: bytes) -> Tensor:
    return torch.frombuffer(bytearray(data) or bytearray(1), dtype=torch.uint8)


def _prior(bae: Any, prior: Tensor | None) -> Tensor:
    return code_prior(bae) if prior is None else prior.detach().float()


@torch.no_grad()
def compress(
    bae: Any,
    h0: Float[Tensor, "n d_in"],
    threshold: float = LOSSLESS_THRESHOLD,
    *,
    prior: Float[Tensor, " n_bits"] | None = None,
    batch_size: int = 4096,
) -> CompressedStates:
    """Compress hidden states (as the BAE reads them) to the indices of their surprising bits.
    ``prior``: default the BAE's training mean code (``code_prior``)."""
    if not LOSSLESS_THRESHOLD - 1e-9 <= threshold <= 0.0:
        raise ValueError(
            f"threshold must lie in [log2 0.5, 0] = [-1, 0] (burstiness of a flipped bit), "
            f"got {threshold}"
        )
    if h0.ndim != 2 or h0.shape[1] != bae.cfg.d_in:
        raise ValueError(f"h0 must be [n, {bae.cfg.d_in}] (the BAE's d_in), got {tuple(h0.shape)}")
    p = _prior(bae, prior).to(bae.device)
    base = p > 0.5
    counts, indices = [], []
    for start in range(0, h0.shape[0], batch_size):
        bits = bae.encode_bits(h0[start : start + batch_size].to(bae.device, bae.dtype))
        stored = (bits.bool() != base) & (burstiness(bits, p) >= threshold - 1e-6)
        counts.append(stored.sum(-1).cpu())
        indices.append(stored.nonzero()[:, 1].cpu())
    return CompressedStates(
        counts=torch.cat(counts),
        indices=torch.cat(indices),
        n_bits=int(p.shape[0]),
        threshold=float(threshold),
        prior_key=prior_fingerprint(p),
    )


@torch.no_grad()
def decompress(
    bae: Any, compressed: CompressedStates, *, prior: Float[Tensor, " n_bits"] | None = None
) -> Float[Tensor, "n d_in"]:
    """Rebuild the codes from the stored flips and decode them with the BAE."""
    codes = compressed.codes(_prior(bae, prior)).to(bae.device, bae.dtype)
    return bae.decode(bits_to_values(codes, bae.cfg.bits_per_feature)).float().cpu()


def decoder_bytes(bae: Any) -> int:
    """What decompression needs of the model: the saved BAE's decoder weights and bias and its
    prior (an input frame is folded into the saved weights)."""
    tensors = [bae.W_dec, bae.b_dec, bae.code_mean]
    return sum(t.numel() * t.element_size() for t in tensors)


@torch.no_grad()
def compression_report(
    bae: Any,
    states: Float[Tensor, "n d_in"],
    thresholds: Sequence[float] = (-1.0, -0.75, -0.5, -0.25, 0.0),
    *,
    prior: Float[Tensor, " n_bits"] | None = None,
    work_dir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Per threshold: stored flips per vector, bytes on disk (alone and with the decoder) against
    the float32 and float16 originals, and MSE / cosine similarity of the decompressed states to
    the originals."""
    states = states.float()
    original32 = states.numel() * 4
    model_bytes = decoder_bytes(bae)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(work_dir or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for threshold in thresholds:
            packed = compress(bae, states, threshold, prior=prior)
            size = packed.save(folder / f"states_{threshold:+.2f}.safetensors")
            reloaded = CompressedStates.load(folder / f"states_{threshold:+.2f}.safetensors")
            restored = decompress(bae, reloaded, prior=prior)
            rows.append(
                {
                    "threshold": threshold,
                    "flips_per_vector": float(packed.counts.float().mean()),
                    "layout": packed.layout(),
                    "bytes": size,
                    "bytes_with_decoder": size + model_bytes,
                    "original_bytes_float32": original32,
                    "original_bytes_float16": original32 // 2,
                    "ratio_float32": original32 / size,
                    "ratio_float32_with_decoder": original32 / (size + model_bytes),
                    "mse": float((restored - states).pow(2).mean()),
                    "relative_error": float(
                        (restored - states).pow(2).sum() / (states - states.mean(0)).pow(2).sum()
                    ),
                    "cosine": float(torch.cosine_similarity(restored, states, dim=-1).mean()),
                }
            )
    return rows
