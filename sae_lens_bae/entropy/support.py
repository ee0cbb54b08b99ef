"""The exact entropy of a SAELens ``SyntheticModel``'s true support pattern: which features are
active (activation > 0) on one sample of ``model.activation_generator.sample``. The truth a
reading of feature-set entropy on SynthSAEBench-style data is checked against.

How SAELens draws a sample (``sae_lens.synthetic``), and what follows for the support:

1. Feature i fires with probability ``firing_probabilities[i]`` (after the hierarchy's
   compensation), independently of the others; a fired feature gets ``relu(mean_i + std_i Z)``.
   So before the hierarchy, feature i is active independently with probability
   ``q_i = p_i P(mean_i + std_i Z > 0) = p_i Phi(mean_i / |std_i|)`` (``p_i [mean_i > 0]`` when
   ``std_i = 0``).
2. The hierarchy modifier walks the forest level by level: a feature is zeroed when its nearest
   feature ancestor is inactive, and among the active feature children of a mutually exclusive
   node one is kept, uniformly at random, when their gate is open. Organisational nodes (no
   feature) are transparent: their children are gated by the nearest feature above them.
   ``scale_children_by_parent`` multiplies a child by ``parent / parent_mean`` (> 0 when the
   parent is active), so it changes magnitudes, never the support.

Hence, given a feature is active, its subtree's support is independent of the rest, and the
entropy follows by a recursion from the leaves: ``H(f) = sum over free children c of
[h(q_c) + q_c H(c)] + sum over exclusive groups G of [H(W_G) + sum_c P(W_G = c) H(c)]``, where
``W_G`` is the group's surviving child (or none) and ``h`` the binary entropy. Features outside
the hierarchy and the roots are children of an always-open gate. Nothing is enumerated: the cost
is linear in the features (and quadratic in the largest exclusive group).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from sae_lens.synthetic import SyntheticModel
    from sae_lens.synthetic.activation_generator import ActivationGenerator
    from sae_lens.synthetic.hierarchy import HierarchyNode

__all__ = ["support_entropy"]

_CHUNK = 1 << 22
"""Elements per block of the exclusive groups' quadrature (bounds its memory)."""


def support_entropy(model: SyntheticModel) -> float:
    """The exact Shannon entropy, in bits, of which features are active on one sample of
    ``model`` (a ``sae_lens.synthetic.SyntheticModel``): independent features, parents gating
    children, and mutually exclusive children, as SAELens' generator and hierarchy modifier draw
    them.

    Raises ``ValueError`` for a correlated model (the support of a Gaussian copula over thousands
    of features has no closed-form entropy), for an activation modifier other than the model's
    own hierarchy, whose effect on the support is unknown here, and for a hierarchy sampled as
    sparse tensors where a fired feature's magnitude can be zero (SAELens' sparse path gates and
    draws on fired features, not active ones, so its support follows other rules).
    """
    generator = model.activation_generator
    if (
        getattr(model, "correlation_matrix", None) is not None
        or getattr(model.cfg, "correlation", None) is not None
        or generator.correlation_matrix is not None
        or generator.low_rank_correlation is not None
    ):
        raise ValueError(
            "support_entropy: a correlated SyntheticModel has no closed-form support entropy; "
            "build the model without `correlation` (SyntheticModelConfig(correlation=None))"
        )
    q, fired = _raw_active_probabilities(generator)
    parent = np.full(len(q), -1, dtype=np.int64)
    depth = np.zeros(len(q), dtype=np.int64)
    groups: list[tuple[int, list[int]]] = []
    if generator.modify_activations is not None:
        hierarchy = model.hierarchy
        wrapped = getattr(generator.modify_activations, "_fn", None)
        if hierarchy is None or hierarchy.modifier is None or wrapped is not hierarchy.modifier:
            raise ValueError(
                "support_entropy: the model's activation generator applies a modifier other "
                "than its own hierarchy; only SAELens' hierarchy modifier has an exact support "
                "entropy here"
            )
        if generator.use_sparse_tensors and (q < fired).any():
            raise ValueError(
                "support_entropy: with use_sparse_tensors=True SAELens' hierarchy treats a fired "
                "feature whose magnitude relu zeroed as active (its dense path does not); sample "
                "densely (model.use_sparse_tensors = False)"
            )
        groups = _hierarchy_structure(hierarchy.roots, len(q), parent, depth)
    return _tree_entropy(q, parent, depth, groups) / math.log(2)


def _raw_active_probabilities(generator: ActivationGenerator) -> tuple[np.ndarray, np.ndarray]:
    """P(feature i is active before the hierarchy), fp64: it fires and its magnitude survives the
    generator's relu; and P(it fires)."""
    p, mean, std = (
        t.detach().to("cpu", torch.float64)
        for t in (
            generator.firing_probabilities,
            generator.mean_firing_magnitudes,
            generator.std_firing_magnitudes.abs(),
        )
    )
    if not (p.isfinite().all() and (p >= 0).all() and (p <= 1).all()):
        raise ValueError("support_entropy: firing probabilities must be finite and in [0, 1]")
    if not (mean.isfinite().all() and std.isfinite().all()):
        raise ValueError("support_entropy: firing magnitudes' means and stds must be finite")
    # P(mean + std Z > 0) = Phi(mean / std); with std = 0 the magnitude is the mean itself
    spread = std > 0
    survive = torch.where(
        spread, torch.special.ndtr(mean / torch.where(spread, std, 1.0)), (mean > 0).double()
    )
    return (p * survive).numpy(), p.numpy()


def _hierarchy_structure(
    roots: list[HierarchyNode], num_features: int, parent: np.ndarray, depth: np.ndarray
) -> list[tuple[int, list[int]]]:
    """Fill each hierarchy feature's gating parent (its nearest feature ancestor, -1 for none)
    and depth (its number of feature ancestors) in place; return the exclusive groups as
    (gating parent, member features). A group is what SAELens' modifier builds: the feature
    children of a mutually exclusive node, when there are at least two of them."""
    seen: set[int] = set()
    groups: list[tuple[int, list[int]]] = []
    # (node, gating parent of the node's feature, feature depth): an explicit stack, as trees
    # may be deeper than Python's recursion limit
    stack: list[tuple[HierarchyNode, int, int]] = [(root, -1, 0) for root in reversed(roots)]
    while stack:
        node, gate, level = stack.pop()
        index = node.feature_index
        if index is not None:
            if not 0 <= index < num_features or index in seen:
                raise ValueError(
                    f"support_entropy: hierarchy feature index {index} is out of range or "
                    f"appears twice (features 0..{num_features - 1}, each at most once)"
                )
            seen.add(index)
            parent[index], depth[index] = gate, level
            child_gate, child_level = index, level + 1
        else:
            child_gate, child_level = gate, level
        members = [c.feature_index for c in node.children if c.feature_index is not None]
        if node.mutually_exclusive_children and len(node.children) >= 2 and len(members) >= 2:
            groups.append((child_gate, members))
        stack.extend((child, child_gate, child_level) for child in reversed(node.children))
    return groups


def _binary_entropy(q: np.ndarray) -> np.ndarray:
    """h(q) in nats, 0 at q = 0 and q = 1."""
    return -(_xlogx(q) + _xlogx(1 - q))


def _xlogx(x: np.ndarray) -> np.ndarray:
    """x log x with 0 log 0 = 0."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def _winner_probabilities(q: np.ndarray) -> np.ndarray:
    """P(member c of each exclusive group is the one kept), for groups of equal size (rows of
    ``q``): c must be active and win the uniform draw among the k other active members,
    ``q_c E[1/(1+k)] = q_c * integral_0^1 prod_{j != c} (1 - q_j + q_j t) dt``. The integrand is
    a polynomial of degree size - 1, which Gauss-Legendre with size // 2 + 1 nodes integrates
    exactly; every factor is positive at the interior nodes, so it is summed in logs."""
    n_groups, size = q.shape
    nodes, weights = np.polynomial.legendre.leggauss(size // 2 + 1)
    t, w = (nodes + 1) / 2, weights / 2
    integral = np.zeros_like(q)
    step = max(1, _CHUNK // max(1, n_groups * size))
    for start in range(0, len(t), step):
        log_factor = np.log1p(q[:, :, None] * (t[start : start + step] - 1))
        others = log_factor.sum(1, keepdims=True) - log_factor
        integral += (np.exp(others) * w[start : start + step]).sum(2)
    return q * integral


def _tree_entropy(
    q: np.ndarray, parent: np.ndarray, depth: np.ndarray, groups: list[tuple[int, list[int]]]
) -> float:
    """The support's entropy in nats, from the leaves up: each feature passes
    ``const + coef * H(subtree | active)`` to its gating parent (``h(q)`` and ``q`` when free;
    0 and its winning probability in an exclusive group), and each group adds the entropy of
    its survivor to its parent."""
    coef, const = q.copy(), _binary_entropy(q)
    below = np.zeros_like(q)  # H(subtree strictly below f | f active), filled bottom-up
    top = 0.0  # the always-open gate above roots and features outside the hierarchy
    by_size: dict[int, list[tuple[int, list[int]]]] = {}
    for group in groups:
        by_size.setdefault(len(group[1]), []).append(group)
    for same_size in by_size.values():
        members = np.array([m for _, m in same_size], dtype=np.int64)
        gates = np.array([g for g, _ in same_size], dtype=np.int64)
        win = _winner_probabilities(q[members])
        none = np.prod(1 - q[members], axis=1)
        survivor = -(_xlogx(win).sum(1) + _xlogx(none))
        coef[members], const[members] = win, 0.0
        top += float(survivor[gates < 0].sum())
        np.add.at(below, gates[gates >= 0], survivor[gates >= 0])
    for level in range(int(depth.max(initial=0)), 0, -1):
        at = np.flatnonzero((depth == level) & (parent >= 0))
        np.add.at(below, parent[at], const[at] + coef[at] * below[at])
    free = parent < 0
    return top + float((const[free] + coef[free] * below[free]).sum())
