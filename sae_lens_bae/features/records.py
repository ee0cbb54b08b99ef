"""Feature activation records: for every token its top-k features, and per feature its tokens.

The raw material of feature interpretation (ComSem reads it): which tokens, in which sentences,
make a feature fire most. Magnitudes are model-specific (burstiness for a BAE, the raw
activation for an SAE) or common to every family (``feature_magnitudes``): a latent's value
z-scored per latent ("rescaled", so that latents with large decoder-compensated scales do not
crowd out the rest) or the burstiness of its support ("support").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Bool, Float, Int
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from sae_lens_bae.activations.cache import harvest_activations
from sae_lens_bae.features.activity import latent_activity
from sae_lens_bae.features.burstiness import burstiness, code_prior, has_training_prior
from sae_lens_bae.saes.protocols import BinaryEncoder, Encoder

__all__ = [
    "Candidates",
    "FeatureRecords",
    "MAGNITUDES",
    "Magnitude",
    "feature_magnitudes",
    "pre_activation_margins",
    "records_from_text",
    "top_k_records",
]

Magnitude = Literal["burstiness", "raw", "rescaled", "support"]
MAGNITUDES = ("burstiness", "raw", "rescaled", "support")
TWO_SIDED = ("burstiness", "support")
"""Magnitudes that rank both states of a latent (the rare state on, the usual state off)."""
Candidates = Literal["all", "firing"]


@dataclass
class FeatureRecords:
    """Top-k active features of every token, with where the token is.

    ``features[i]``/``magnitudes[i]`` are token i's top-k (feature, magnitude) pairs, best first;
    slots beyond the token's active features hold feature -1. ``token_positions[i]`` is
    (sequence, position) and ``token_ids[i]`` the token, so a sample can be shown in its sentence.
    ``off_tokens[f]``: a uniform sample of tokens on which feature f is off, drawn from the full
    codes while the records were made (-1 pads); the detection score's negatives come from it,
    since top-k records alone rarely prove a feature off (a BAE has hundreds of bits in their
    rare state on every token, far more than k). ``margins[i]``: for burstiness records, each
    record's pre-activation margin, |pre-activation| of the code bit (how far it is from
    flipping): the order of records whose burstiness ties.
    """

    features: Int[Tensor, "n k"]
    magnitudes: Float[Tensor, "n k"]
    token_positions: Int[Tensor, "n 2"]
    token_ids: Int[Tensor, " n"]
    d_sae: int
    magnitude: str
    sequences: Int[Tensor, "n_seq ctx"] | None = None  # token rows, to show a sample in context
    info: dict[str, str] = field(default_factory=dict)  # where they come from: model, hook, ...
    off_tokens: Int[Tensor, "d_sae m"] | None = None
    margins: Float[Tensor, "n k"] | None = None

    def context(self, index: int, tokenizer: Any, before: int = 24, after: int = 4) -> str:
        """Text around token ``index`` with the token itself marked as <<token>>."""
        left, token, right = self.context_parts(index, tokenizer, before, after)
        return f"{left}<<{token}>>{right}"

    def context_parts(
        self, index: int, tokenizer: Any, before: int = 24, after: int = 4
    ) -> tuple[str, str, str]:
        """(text before, the token, text after) of token ``index``, as decoded text."""
        if self.sequences is None:
            raise ValueError("These records were made without the token rows (sequences=...)")
        seq, pos = (int(v) for v in self.token_positions[index])
        row = self.sequences[seq].tolist()
        left = tokenizer.decode(row[max(0, pos - before) : pos], skip_special_tokens=True)
        token = tokenizer.decode(row[pos : pos + 1])
        right = tokenizer.decode(row[pos + 1 : pos + 1 + after], skip_special_tokens=True)
        return left, token, right

    def save(self, path: str | Path) -> None:
        """Write the records as one safetensors file (metadata in its header)."""
        tensors = {
            "features": self.features.contiguous(),
            "magnitudes": self.magnitudes.contiguous(),
            "token_positions": self.token_positions.contiguous(),
            "token_ids": self.token_ids.contiguous(),
        }
        if self.sequences is not None:
            tensors["sequences"] = self.sequences.contiguous()
        if self.off_tokens is not None:
            tensors["off_tokens"] = self.off_tokens.contiguous()
        if self.margins is not None:
            tensors["margins"] = self.margins.contiguous()
        meta = {
            "d_sae": str(self.d_sae),
            "magnitude": self.magnitude,
            "info": json.dumps(self.info),
        }
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial")  # no truncated file if interrupted
        save_file(tensors, str(partial), metadata=meta)
        partial.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> FeatureRecords:
        """Records saved by :meth:`save`; a file that is not (missing, another format, cut
        short, or records without their fields) raises one line naming it."""
        if not Path(path).is_file():
            raise FileNotFoundError(f"no feature records at {path}; `bae compare` writes them")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
            return cls._from_saved(tensors, meta)
        except (SafetensorError, KeyError, ValueError, json.JSONDecodeError) as error:
            raise ValueError(
                f"{path} is not a feature records file ({type(error).__name__}: {error}); "
                "`bae compare` writes them"
            ) from None

    @classmethod
    def _from_saved(cls, tensors: dict[str, Tensor], meta: dict[str, str]) -> FeatureRecords:
        return cls(
            features=tensors["features"],
            magnitudes=tensors["magnitudes"],
            token_positions=tensors["token_positions"],
            token_ids=tensors["token_ids"],
            d_sae=int(meta["d_sae"]),
            magnitude=meta["magnitude"],
            sequences=tensors.get("sequences"),
            info=json.loads(meta.get("info", "{}")),
            off_tokens=tensors.get("off_tokens"),
            margins=tensors.get("margins"),
        )

    def counts(self) -> Int[Tensor, " d_sae"]:
        """How many tokens hold each feature in their top-k."""
        valid = self.features[self.features >= 0]
        return torch.bincount(valid, minlength=self.d_sae)

    def counts_by_sequence(self) -> tuple[Int[Tensor, " n_seq"], Int[Tensor, "n_seq d_sae"]]:
        """The sequences the records' tokens come from (sorted) and, per sequence, how many of
        its tokens hold each feature in their top-k: ``counts`` is their sum over sequences,
        and a resample of sequences sums a resample of these rows."""
        sequences, index = self.token_positions[:, 0].unique(return_inverse=True)
        rows = index[:, None].expand_as(self.features)
        keep = self.features >= 0
        flat = rows[keep] * self.d_sae + self.features[keep]
        counts = torch.bincount(flat, minlength=len(sequences) * self.d_sae)
        return sequences, counts.reshape(len(sequences), self.d_sae)

    def surely_off(self, feature: int) -> Bool[Tensor, " n"]:
        """Tokens on which ``feature`` certainly does not fire: those of its ``off_tokens`` sample,
        and those the top-k records prove: it is not among their records, and every feature
        outside their records is off too, because a slot is empty (fewer active features than k)
        or, for burstiness magnitudes, their weakest record is below log2(1/2) (every other bit is
        in its usual state). A token whose records are all strong may hold the feature just below
        its top-k: never a sure negative by the records alone."""
        if not 0 <= feature < self.d_sae:
            raise IndexError(f"feature {feature} outside 0..{self.d_sae - 1}")
        absent = ~(self.features == feature).any(-1)
        complete = (self.features < 0).any(-1)
        if self.magnitude in TWO_SIDED:
            weakest = self.magnitudes.masked_fill(self.features < 0, float("inf")).min(-1).values
            complete |= weakest < -1.0
        off = absent & complete
        if self.off_tokens is not None:
            sampled = self.off_tokens[feature]
            off[sampled[sampled >= 0]] = True
        return off

    def activated(self, min_samples: int = 8) -> int:
        """Features with more than ``min_samples`` tokens in the records (interpretable ones)."""
        return int((self.counts() > min_samples).sum())

    def samples(
        self, feature: int, limit: int | None = None, seed: int | None = None
    ) -> list[tuple[int, float]]:
        """(token index, magnitude) of the tokens whose top-k holds ``feature``, strongest first.

        Ties are common: a BAE bit's burstiness takes one value wherever it fires. With ``seed``
        tied tokens come in a seeded random order (so a feature's first records are not simply
        the first tokens of the data, often one passage); without, by their pre-activation margin
        (the bit farthest from flipping first) where the records hold margins, else in data
        order.
        """
        if not 0 <= feature < self.d_sae:
            raise IndexError(f"feature {feature} outside 0..{self.d_sae - 1}")
        rows, slots = (self.features == feature).nonzero(as_tuple=True)
        values = self.magnitudes[rows, slots]
        if seed is not None:
            shuffle = torch.randperm(rows.numel(), generator=torch.Generator().manual_seed(seed))
            rows, values = rows[shuffle], values[shuffle]
        elif self.margins is not None:
            by_margin = torch.argsort(self.margins[rows, slots], descending=True, stable=True)
            rows, values = rows[by_margin], values[by_margin]
        order = torch.argsort(values, descending=True, stable=True)[:limit]
        return [(int(rows[i]), float(values[i])) for i in order]


@torch.no_grad()
def feature_magnitudes(
    sae: Encoder,
    activations: Float[Tensor, "n d_in"],
    magnitude: Magnitude,
    *,
    prior: Float[Tensor, " n_bits"] | None = None,
    batch_size: int = 4096,
) -> Callable[[int, int], tuple[Tensor, Tensor]]:
    """A function (start, stop) -> (magnitudes, active mask) of rows start:stop, per ``magnitude``.

    ``burstiness`` (a BAE's own) needs ``prior`` (see ``code_prior``); ``raw`` is an SAE's
    activation. The two common to every family read each latent's value v: an SAE latent's
    activation, a BAE bit's canonical bit (1 in its rare state, ``features.activity``):
    ``rescaled`` z-scores v per latent over all of ``activations`` (the paper's rescaled SAE);
    ``support`` is the burstiness of its support, log2|1[v != 0] - f| with f the latent's firing
    frequency (for a BAE its burstiness under the evaluation prior). Active: v != 0.
    """
    if magnitude == "burstiness":
        if prior is None:
            raise ValueError("burstiness magnitudes need the code prior (see code_prior)")
        if not isinstance(sae, BinaryEncoder):
            raise ValueError(
                f"burstiness magnitudes need a binary code; a {type(sae).__name__} has none "
                "(use raw, rescaled or support)"
            )
        bae = sae

        def bae_rows(start: int, stop: int) -> tuple[Tensor, Tensor]:
            bits = bae.encode_bits(activations[start:stop])
            return burstiness(bits, prior), bits > 0

        return bae_rows
    if magnitude not in MAGNITUDES:
        raise ValueError(f"magnitude must be one of {', '.join(MAGNITUDES)}, got {magnitude!r}")
    if magnitude == "raw":

        def raw_rows(start: int, stop: int) -> tuple[Tensor, Tensor]:
            acts = sae.encode(activations[start:stop]).float()
            return acts, acts != 0

        return raw_rows
    majority = None
    if isinstance(sae, BinaryEncoder):
        majority = code_prior(sae, activations, source="evaluation", batch_size=batch_size) > 0.5

    def values(start: int, stop: int) -> Tensor:
        if majority is None:
            return sae.encode(activations[start:stop]).float()
        return latent_activity(sae, activations[start:stop], majority).float()

    mean, std = _latent_moments(values, activations.shape[0], batch_size)
    frequency = None
    if magnitude == "support":
        frequency = _latent_moments(
            lambda a, b: (values(a, b) != 0).float(), activations.shape[0], batch_size
        )[0].float()

    def rows(start: int, stop: int) -> tuple[Tensor, Tensor]:
        v = values(start, stop)
        active = v != 0
        if frequency is not None:
            return burstiness(active.float(), frequency), active
        return ((v.double() - mean) / std).float(), active

    return rows


def _latent_moments(
    values: Callable[[int, int], Tensor], n: int, batch_size: int
) -> tuple[Tensor, Tensor]:
    """Each latent's mean and standard deviation (floored at 1e-8) of ``values`` over n rows."""
    total = total_sq = torch.zeros((), dtype=torch.float64)
    for start in range(0, n, batch_size):
        v = values(start, min(start + batch_size, n)).double()
        total, total_sq = total + v.sum(0), total_sq + v.pow(2).sum(0)
    mean = total / n
    return mean, (total_sq / n - mean.pow(2)).clamp_min(0).sqrt().clamp_min(1e-8)


@torch.no_grad()
def top_k_records(
    sae: Encoder,
    activations: Float[Tensor, "n d_in"],
    token_positions: Int[Tensor, "n 2"],
    token_ids: Int[Tensor, " n"],
    magnitude: Magnitude,
    *,
    k: int = 10,
    prior: Float[Tensor, " n_bits"] | None = None,
    batch_size: int = 4096,
    sequences: Int[Tensor, "n_seq ctx"] | None = None,
    candidates: Candidates = "all",
    off_samples: int = 32,
    seed: int = 0,
) -> FeatureRecords:
    """Every token's top-k features by ``magnitude``. ``candidates="all"`` is the paper's ComSem
    definition: every latent competes (for a BAE's two-sided burstiness, a mostly-on bit that is
    off scores as high as a rare bit that is on), except an SAE latent that does not fire (its
    magnitude 0 is no activation). ``"firing"``: only latents that fire on the token (a BAE bit
    that is 1). ``sequences``: the token rows ``token_positions`` index, kept so a sample can be
    shown in its sentence. ``off_samples``: per feature, how many tokens on which it is off to
    draw uniformly (seeded by ``seed``) for ``FeatureRecords.off_tokens``; off means not a
    candidate: an SAE latent at 0, a BAE bit in its usual state (burstiness below log2(1/2)) or,
    with ``candidates="firing"``, a bit at 0."""
    if candidates not in ("all", "firing"):
        raise ValueError(f"candidates must be 'all' or 'firing', got {candidates!r}")
    if off_samples < 0:
        raise ValueError(f"off_samples must be >= 0, got {off_samples}")
    n = activations.shape[0]
    if token_positions.shape[0] != n or token_ids.shape[0] != n:
        raise ValueError(
            f"{n} activation rows but {token_positions.shape[0]} token positions and "
            f"{token_ids.shape[0]} token ids; pass those of the same rows"
        )
    rows_of = feature_magnitudes(sae, activations, magnitude, prior=prior, batch_size=batch_size)
    features, magnitudes, margins = [], [], []
    width = 0
    generator = torch.Generator().manual_seed(seed)
    off_keys = off_rows = None  # the off_samples largest random keys per feature, and their rows
    for start in range(0, n, batch_size):
        values, active = rows_of(start, min(start + batch_size, n))
        width = values.shape[-1]  # features, or code bits for a more-bit BAE
        kk = min(k, width)
        usual = candidates == "all" and magnitude in TWO_SIDED
        off = values < -1.0 if usual else ~active
        keys = torch.rand(values.shape, generator=generator).masked_fill(~off.cpu(), -1.0)
        rows = torch.arange(start, start + values.shape[0]).expand(width, -1).T
        if off_keys is not None:
            keys, rows = torch.cat([off_keys, keys]), torch.cat([off_rows, rows])
        off_keys, picked = keys.topk(min(off_samples, keys.shape[0]), dim=0)
        off_rows = rows.gather(0, picked)
        if usual:
            active = torch.ones_like(active)
        masked = values.masked_fill(~active, float("-inf"))
        top_values, top_features = masked.topk(kk, dim=-1)
        top_features = top_features.masked_fill(top_values == float("-inf"), -1)
        features.append(top_features.cpu())
        magnitudes.append(top_values.cpu())
        # SAELens' BAEs expose their pre-activations; a bare encoder of bits does not
        if magnitude == "burstiness" and hasattr(sae, "hook_sae_acts_pre"):
            rows_margins = pre_activation_margins(sae, activations[start : start + values.shape[0]])
            margins.append(rows_margins.gather(-1, top_features.clamp_min(0)).cpu())
    off_tokens = None
    if off_keys is not None and off_rows is not None:
        off_tokens = off_rows.masked_fill(off_keys < 0, -1).T.contiguous()
    return FeatureRecords(
        features=torch.cat(features),
        magnitudes=torch.cat(magnitudes),
        token_positions=token_positions,
        token_ids=token_ids,
        d_sae=width,
        magnitude=magnitude,
        sequences=sequences,
        off_tokens=off_tokens,
        margins=torch.cat(margins) if margins else None,
    )


@torch.no_grad()
def pre_activation_margins(sae: Any, x: Float[Tensor, "n d_in"]) -> Float[Tensor, "n n_bits"]:
    """|pre-activation| of every code bit of a BAE on ``x``: how far each bit is from flipping
    (a bit is 1 where its pre-activation is >= 0), read at SAELens' ``hook_sae_acts_pre``."""
    seen: list[Tensor] = []
    handle = sae.hook_sae_acts_pre.register_forward_hook(lambda *args: seen.append(args[-1]))
    try:
        sae.encode_bits(x)
    finally:
        handle.remove()
    return seen[-1].abs()


def records_from_text(
    model: Any,
    sae: Any,
    tokens: Any,
    hook: str,
    out_dir: str | Path,
    *,
    k: int = 10,
    magnitude: Magnitude | None = None,
    input_scale: float = 1.0,
    batch_size: int = 16,
) -> FeatureRecords:
    """Top-k records of a trained SAE (a BAE or any SAELens SAE) over token rows: harvest ``hook``
    once (shards under ``out_dir``), then rank every token's active features.

    ``magnitude``: default burstiness for a BAE (with its training prior, or the evaluation prior
    when it has none) and raw activations for an SAE. ``input_scale``: the factor the SAE's
    training activations were multiplied by (1 for SAEs that read raw states, as ``bae train`` and
    SAELens' own normalisation produce them).
    """
    cache = harvest_activations(model, tokens, [hook], out_dir, batch_size=batch_size)
    acts = cache.activations(hook).float() * input_scale
    if acts.shape[1] != sae.cfg.d_in:
        raise ValueError(
            f"{hook} gives width {acts.shape[1]} but the SAE reads d_in = {sae.cfg.d_in}"
        )
    positions, sequences = cache.token_positions(), cache.tokens()
    is_bae = hasattr(sae, "encode_bits")
    magnitude = magnitude or ("burstiness" if is_bae else "raw")
    prior = None
    if magnitude == "burstiness":
        if not is_bae:
            raise ValueError("burstiness magnitudes need a BAE; use raw or rescaled for an SAE")
        source = "training" if has_training_prior(sae) else "evaluation"
        prior = code_prior(sae, acts, source=source)
    records = top_k_records(
        sae,
        acts.to(sae.dtype),
        positions,
        sequences[positions[:, 0], positions[:, 1]],
        magnitude,
        k=k,
        prior=prior,
        sequences=sequences,
    )
    records.info = {"hook": hook}  # the caller adds how to load the model ("model")
    return records
