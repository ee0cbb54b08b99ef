"""Codes that count bits twice: find the code bits that the rest of a code determines, and
retrain a BAE without them.

The estimate sums the bits' entropies, so a bit whose value the other bits fix on
the states adds bits the code does not hold. The covariance term sees pairs only, and a BAE can
settle in a code whose code bits have no pairwise dependence yet hold fewer bits than their sum:
three planted bits written as four fair threshold code bits on a tetrahedron's normals (a 3-in-4
code, docs/research/heldout-sets.md) decode exactly and sit one bit over the axis code, a local
minimum of the objective. ``redundant_bits`` finds such bits from the code words of a set;
``knock_out_`` switches them off, so that the rest of the code must carry the states, with its
refitted decoder or trained on (``repair_baes``, which ``estimate_entropies`` runs: a repaired
BAE is kept only if its held-out objective is lower, the judge between restarts too).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.entropy.recipe import EntropyRecipe
from sae_lens_bae.evaluation import held_out_objective, unexplained_variance
from sae_lens_bae.saes.bae import BAETrainingSAE
from sae_lens_bae.saes.bae_recipes import phase_steps
from sae_lens_bae.saes.decoder_refit import refit_decoder
from sae_lens_bae.saes.objective import binary_entropy
from sae_lens_bae.stacks.training import train_stacked_baes

__all__ = [
    "KNOCKED_OUT_BIAS",
    "MIN_STATES_PER_CODE",
    "REDUNDANT_FRACTION",
    "Repair",
    "conditional_entropies",
    "knock_out_",
    "redundant_bits",
    "repair_baes",
    "resolved_code_words",
]

REDUNDANT_FRACTION = 0.1
"""A bit is redundant when its entropy given the rest of the code is at most this fraction
of its own entropy (a fair bit the rest does not fix keeps about 1 bit of its 1, less only by
the plug-in's bias at a few states per code word; a bit the rest fixes keeps 0)."""
MIN_BIT_ENTROPY = 0.05
"""... and its own entropy is at least this (a bit that hardly fires saves little)."""
MIN_STATES_PER_CODE = 2
"""Bits are looked for only in a set of at least this many states per distinct code word:
with fewer, most words lack the word that differs from them in one bit, and every bit
would look fixed by the rest."""
KNOCKED_OUT_BIAS = -1e4
"""A knocked-out bit's encoder bias (its encoder column is zero): its pre-activation is this
on every state, where the sigmoid surrogate's gradient is nil (on CPU held at 4e-13 of its peak,
``saes.binary.SURROGATE_CPU_CUTOFF``: Adam moves the weights by about 1e-8), so it stays off."""
_HASH_BLOCK = 1 << 24
"""Entries (rows x bits) hashed at once: bounds the memory of reading a code."""


def _hash_weights(n_bits: int, device: torch.device | str) -> Tensor:
    """Random int64 weights of at most 62 - log2(n_bits + 1) bits: a 0/1 word's weighted sum
    never overflows, and two of a set's K distinct words collide with probability about
    K^2 / 2^(62 - log2 L) (2e-7 for K = 10^4 words of 4096 bits); a collision could
    merge two words or find a partner that is not there."""
    generator = torch.Generator().manual_seed(0)
    high = 2 ** (62 - math.ceil(math.log2(n_bits + 1)))
    return torch.randint(1, high, (max(n_bits, 1),), generator=generator).to(device)


def _merged(words: Tensor, counts: Tensor, bits: list[int]) -> tuple[Tensor, Tensor]:
    """The distinct words of the code restricted to ``bits``, with their states' counts."""
    merged, inverse = torch.unique(words[:, bits], dim=0, return_inverse=True)
    total = torch.zeros(len(merged), dtype=counts.dtype, device=counts.device)
    return merged, total.scatter_add_(0, inverse, counts)


@torch.no_grad()
def resolved_code_words(
    bae: BAETrainingSAE, states: Float[Tensor, "n d_in"]
) -> tuple[Tensor, Tensor] | None:
    """The distinct code words of ``states`` under ``bae`` ([K, n_bits], 0/1 int64) and how many
    states hold each, or None when the set holds fewer than ``MIN_STATES_PER_CODE`` states per
    word (nothing to look for). Read in chunks and hashed: beyond n hashes, only the K words are
    ever held, never the [n, n_bits] code."""
    device = bae.W_enc.device

    def words_of(rows: Tensor) -> Tensor:
        return bae.encode_bits(rows.to(device)).to(torch.int64)

    weights = _hash_weights(bae.cfg.n_bits, device)
    chunk = max(1, _HASH_BLOCK // bae.cfg.n_bits)
    hashes = torch.cat([(words_of(x) * weights).sum(1) for x in states.split(chunk)])
    unique, inverse, counts = torch.unique(hashes, return_inverse=True, return_counts=True)
    if len(hashes) < MIN_STATES_PER_CODE * len(unique):
        return None
    order = torch.arange(len(hashes), device=device)
    first = torch.full_like(unique, len(hashes)).scatter_reduce_(0, inverse, order, "amin")
    return words_of(states[first.to(states.device)]), counts


def conditional_entropies(
    words: Float[Tensor, "K L"], counts: Float[Tensor, " K"]
) -> Float[Tensor, " L"]:
    """H(c_i | the other code bits) in bits for each code bit i of a code whose distinct words
    (0/1) are held by ``counts`` states each: the plug-in over the pairs of words that differ in
    bit i alone (a word with no such partner: the rest fixes bit i there, 0 bits).
    Words are hashed (``_hash_weights``); a word's partner in bit i is its hash plus or
    minus bit i's weight: one sort, then one search per word and bit."""
    n_words, n_bits = words.shape
    if n_bits == 0:
        return torch.zeros(0, dtype=torch.float64)
    weights = _hash_weights(n_bits, words.device)
    hashes = (words * weights).sum(1)
    ordered, order = hashes.sort()
    counts = counts.double()
    total = counts.sum()
    ordered_counts = counts[order]
    result = torch.zeros(n_bits, dtype=torch.float64, device=words.device)
    block = max(1, _HASH_BLOCK // max(n_words, 1))
    for start in range(0, n_bits, block):
        part = slice(start, start + block)
        partners = hashes[:, None] + (1 - 2 * words[:, part]) * weights[part]  # flip bit i
        position = torch.searchsorted(ordered, partners).clamp(max=n_words - 1)
        found = ordered[position] == partners
        partner_counts = torch.where(found, ordered_counts[position], 0.0)
        same = counts[:, None] / (counts[:, None] + partner_counts)  # P(c_i as here | rest)
        result[part] = (counts[:, None] / total * -torch.log2(same)).sum(0)
    return result


@torch.no_grad()
def redundant_bits(
    codes: Float[Tensor, "n n_bits"], counts: Float[Tensor, " n"] | None = None
) -> list[int]:
    """The bits of a code that the rest of it determines, chosen greedily: the one that
    saves the most bits first, then again on the code without it, until none is left (of the
    four bits of a 3-in-4 code any one is redundant, and once it is gone the other three
    are not). ``codes``: one 0/1 row per state, or distinct words held by ``counts`` states
    each (``resolved_code_words``). Empty when the set holds fewer than
    ``MIN_STATES_PER_CODE`` states per distinct word: the sample cannot tell."""
    if counts is None:
        words, counts = torch.unique(codes.to(torch.int64), dim=0, return_counts=True)
    else:
        words = codes.to(torch.int64)
    if int(counts.sum()) < MIN_STATES_PER_CODE * words.shape[0]:
        return []
    rates = (words.double() * counts.double()[:, None]).sum(0) / counts.sum()
    marginal = binary_entropy(rates.unsqueeze(-1))  # per bit
    kept = [i for i in range(words.shape[1]) if marginal[i] >= MIN_BIT_ENTROPY]
    removed: list[int] = []
    while kept:
        given = conditional_entropies(*_merged(words, counts, kept))
        saving = marginal[kept] - given
        candidates = given <= REDUNDANT_FRACTION * marginal[kept]
        if not bool(candidates.any()):
            break
        best = int(torch.where(candidates, saving, -math.inf).argmax())
        removed.append(kept.pop(best))
    return sorted(removed)


@torch.no_grad()
def knock_out_(bae: BAETrainingSAE, bits: list[int]) -> None:
    """Switch these code bits off for good: zero encoder columns and a bias of
    ``KNOCKED_OUT_BIAS`` (a zero column alone would sit on the threshold, where the surrogate's
    gradient is largest)."""
    if not bits:
        return
    bae.W_enc[:, bits] = 0.0
    bae.b_enc[bits] = KNOCKED_OUT_BIAS


@dataclass
class Repair:
    """A BAE replaced by its repair: the bits knocked out of it (over all rounds), the steps
    its repairs trained, and, of the last, the relative error as trained and whether its
    decoder was refitted."""

    knocked_out: list[int]
    steps: int
    trained_relative_error: float | None
    refitted: bool


def repair_baes(
    baes: list[BAETrainingSAE],
    sets: Sequence[Float[Tensor, "n d_in"]],
    check_sets: Sequence[Float[Tensor, "m d_in"]],
    recipe: EntropyRecipe,
    seeds: Sequence[int],
    device: str = "cpu",
    progress: bool = True,
) -> dict[int, Repair]:
    """Up to ``recipe.selection.repair_rounds`` rounds: every BAE whose code on its training states
    (``sets[g]``) has ``redundant_bits`` is copied and they are knocked out of the copy.
    With its decoder refitted to the code that is left (if the recipe refits decoders), the
    copy may already be better; if not, the copies train on together (``train_stacked_baes``
    from them, their trained decoders: at most a quarter of ``recipe.steps``, at the recipe's
    final lr, the entropy term on from the start, its convergence rule), their decoders
    refitted as the recipe says. A copy whose held-out objective on ``check_sets[g]`` is lower
    replaces ``baes[g]`` (in place) and may be repaired again in the next round; the others
    keep their BAE. Returns the replaced BAEs' repairs (none unless ``recipe.repairs``)."""
    repairs: dict[int, Repair] = {}
    candidates = list(range(len(baes))) if recipe.repairs else []

    def judge(
        g: int,
        candidate: BAETrainingSAE,
        check: Tensor,
        bits: list[int],
        steps: int,
        error: float | None,
        refitted: bool,
    ) -> bool:
        """Replace BAE g by ``candidate`` if its held-out objective on ``check`` is lower."""
        ours = held_out_objective(candidate, check, recipe.batch_size)
        if ours >= held_out_objective(baes[g], check, recipe.batch_size):
            return False
        before = repairs.get(g, Repair([], 0, None, False))
        repairs[g] = Repair(
            sorted(before.knocked_out + bits), before.steps + steps, error, refitted
        )
        baes[g] = candidate
        return True

    for _ in range(recipe.selection.repair_rounds):
        flagged = {}
        for g in candidates:
            words = resolved_code_words(baes[g], sets[g])
            bits = [] if words is None else redundant_bits(*words)
            if bits:
                flagged[g] = bits
        if not flagged:
            break
        candidates = []
        checks = {g: check_sets[g].to(device) for g in flagged}
        starts = {}
        for g, bits in flagged.items():
            start = copy.deepcopy(baes[g])
            knock_out_(start, bits)
            # the code that is left may still read the states with its own least-squares
            # decoder (a bit the rest fixes, not needed to decode): kept without training
            error = unexplained_variance(start, checks[g])
            refitted = copy.deepcopy(start)
            if recipe.selection.refit_decoder and judge(
                g,
                refitted,
                checks[g],
                bits,
                0,
                error,
                refit_decoder(refitted, sets[g], seed=seeds[g]).applied,
            ):
                candidates.append(g)
            else:  # it must re-encode: trained with its decoder as it was
                starts[g] = start
        if not starts:
            continue
        budget = max(recipe.steps // 4, 1)
        first = next(iter(starts.values()))  # every BAE of the grid has one config
        # the recipe's final phase over the budget, the entropy term on from the start
        phases = phase_steps(budget, 0.0, recipe.phases.covariance_off_final_fraction)
        cfg = replace(first.cfg, metadata=copy.deepcopy(first.cfg.metadata), **phases)
        lr = recipe.optimiser.lr if recipe.optimiser.lr_end is None else recipe.optimiser.lr_end
        training = train_stacked_baes(
            [sets[g] for g in starts],
            cfg,
            training_samples=budget * recipe.batch_size,
            seeds=[seeds[g] for g in starts],
            batch_size=recipe.batch_size,
            lr=lr,
            device=device,
            progress=progress,
            convergence=recipe.convergence(),
            check_sets=[checks[g] for g in starts],
            adam_beta2=recipe.optimiser.adam_beta2,
            init=list(starts.values()),
        )
        for i, (g, candidate) in enumerate(starts.items()):
            candidate.load_state_dict(training.baes[i].state_dict())  # the recipe's config kept
            error = unexplained_variance(candidate, checks[g])
            refitted = (
                recipe.selection.refit_decoder
                and refit_decoder(candidate, sets[g], seed=seeds[g]).applied
            )
            if judge(g, candidate, checks[g], flagged[g], training.steps[i], error, refitted):
                candidates.append(g)
    return repairs
