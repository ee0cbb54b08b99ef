"""``support_entropy``: the exact entropy of a SAELens ``SyntheticModel``'s support pattern,
checked against a brute-force enumeration of the support distribution (every firing pattern and
every exclusive draw, written here from SAELens' sampling rules), against the plug-in entropy of
SAELens' own samples, and against hand-computed binary entropies."""

import itertools
import math
import random
from collections import defaultdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sae_lens.synthetic import (
    ActivationGenerator,
    FoldedNormalMagnitudeConfig,
    HierarchyConfig,
    LinearMagnitudeConfig,
    LowRankCorrelationConfig,
    SyntheticModel,
    SyntheticModelConfig,
    ZipfianFiringProbabilityConfig,
)
from sae_lens.synthetic.hierarchy import Hierarchy, HierarchyNode, hierarchy_modifier

from sae_lens_bae import support_entropy
from sae_lens_bae.entropy.estimate import plugin_entropy

Node = HierarchyNode


def _model(roots, p, mean=1.0, std=0.0):
    """A tiny model (hidden 4, no orthogonalisation) whose generator has these per-feature
    firing probabilities and magnitudes and the hierarchy of ``roots`` (none when empty)."""
    n = len(p)
    hierarchy = Hierarchy(roots=roots, modifier=hierarchy_modifier(roots)) if roots else None
    generator = ActivationGenerator(
        num_features=n,
        firing_probabilities=torch.as_tensor(p, dtype=torch.float32),
        mean_firing_magnitudes=torch.as_tensor(mean, dtype=torch.float32).expand(n).clone(),
        std_firing_magnitudes=torch.as_tensor(std, dtype=torch.float32).expand(n).clone(),
        modify_activations=hierarchy.modifier if hierarchy else None,
    )
    cfg = SyntheticModelConfig(num_features=n, hidden_dim=4, seed=0)
    return SyntheticModel(cfg, hierarchy=hierarchy, activation_generator=generator)


def _active_before_hierarchy(model):
    """P(fired and relu(mean + std Z) > 0) per feature, from the generator's own tensors."""
    gen = model.activation_generator
    out = []
    for p, mean, std in zip(
        gen.firing_probabilities.double().tolist(),
        gen.mean_firing_magnitudes.double().tolist(),
        gen.std_firing_magnitudes.double().tolist(),
        strict=True,
    ):
        survive = 0.5 * math.erfc(-mean / (abs(std) * math.sqrt(2))) if std else float(mean > 0)
        out.append(p * survive)
    return out


def _outcomes(children, exclusive, gate, raw):
    """Every way SAELens' modifier can leave these sibling nodes, given the raw firing pattern
    and whether their gating feature is active: (probability, active features) pairs. Among the
    feature children of an exclusive node, one active child is kept, uniformly."""
    members = [c.feature_index for c in children if c.feature_index is not None]
    grouped = exclusive and len(children) >= 2 and len(members) >= 2
    candidates = [f for f in members if gate and raw[f]] if grouped else []
    draws = [(1 / len(candidates), f) for f in candidates] or [(1.0, None)]
    result = []
    for p_draw, winner in draws:
        parts = []
        for child in children:
            f = child.feature_index
            if f is None:  # organisational: its children share this gate
                parts.append(
                    _outcomes(child.children, child.mutually_exclusive_children, gate, raw)
                )
                continue
            on = gate and raw[f] and (not grouped or f == winner)
            below = _outcomes(child.children, child.mutually_exclusive_children, on, raw)
            parts.append([(p, s | {f}) if on else (p, s) for p, s in below])
        for combo in itertools.product(*parts):
            result.append(
                (p_draw * math.prod(p for p, _ in combo), frozenset().union(*(s for _, s in combo)))
            )
    return result


def _brute_force_distribution(model):
    """P(support pattern) for every pattern, by enumerating all 2^n raw firing patterns and
    every exclusive draw."""
    q = _active_before_hierarchy(model)
    roots = model.hierarchy.roots if model.hierarchy else []
    in_tree = {f for r in roots for f in r.get_all_feature_indices()}
    dist = defaultdict(float)
    for raw in itertools.product((False, True), repeat=len(q)):
        p_raw = math.prod(qi if r else 1 - qi for qi, r in zip(q, raw, strict=True))
        if p_raw == 0:
            continue
        outside = frozenset(f for f in range(len(q)) if raw[f] and f not in in_tree)
        for p, active in _outcomes(roots, False, True, raw):
            dist[active | outside] += p_raw * p
    return dist


def _entropy_bits(probs):
    return -sum(p * math.log2(p) for p in probs if p > 0)


def _hand_made_tree():
    """12 features: root 0 (children rescaled by it) with exclusive children 1, 2, 3; under 1 a
    free child 4 and an organisational exclusive node over 5 and 11; under 2 exclusive children
    6 and 7; an organisational root with exclusive children 8 and 9; 10 outside the hierarchy."""
    roots = [
        Node(
            0,
            mutually_exclusive_children=True,
            scale_children_by_parent=True,
            children=[
                Node(1, children=[Node(4), Node(None, [Node(5), Node(11)], True)]),
                Node(2, mutually_exclusive_children=True, children=[Node(6), Node(7)]),
                Node(3),
            ],
        ),
        Node(None, mutually_exclusive_children=True, children=[Node(8), Node(9)]),
    ]
    p = [0.8, 0.7, 0.6, 0.5, 0.9, 0.6, 0.7, 0.4, 0.5, 0.6, 0.3, 0.8]
    mean = [1.0, 0.5, 0.2, 1.5, 0.3, 0.8, -0.2, 1.0, 0.4, 0.6, 0.1, 0.5]
    std = [0.5, 1.0, 1.0, 0.0, 1.0, 0.7, 1.0, 0.5, 1.0, 0.0, 2.0, 1.0]
    return _model(roots, p, torch.tensor(mean), torch.tensor(std))


def _generated_hierarchy_model():
    """SynthSAEBench's recipe at 12 features: a generated tree (every parent exclusive, firing
    probabilities compensated, children rescaled), per-feature magnitude configs, no
    correlation."""
    cfg = SyntheticModelConfig(
        num_features=12,
        hidden_dim=4,
        firing_probability=ZipfianFiringProbabilityConfig(
            max_prob=0.4, min_prob=0.05, exponent=0.5
        ),
        hierarchy=HierarchyConfig(
            total_root_nodes=2,
            branching_factor=2,
            max_depth=2,
            mutually_exclusive_portion=1.0,
            compensate_probabilities=True,
            scale_children_by_parent=True,
        ),
        mean_firing_magnitudes=LinearMagnitudeConfig(start=1.0, end=0.2),
        std_firing_magnitudes=FoldedNormalMagnitudeConfig(mean=0.5, std=0.5),
        seed=3,
    )
    return SyntheticModel(cfg)


@pytest.mark.parametrize("build", [_hand_made_tree, _generated_hierarchy_model])
def test_equals_brute_force_enumeration(build):
    model = build()
    dist = _brute_force_distribution(model)
    assert math.isclose(sum(dist.values()), 1.0, abs_tol=1e-12)
    assert support_entropy(model) == pytest.approx(_entropy_bits(dist.values()), abs=1e-9)


def _assert_saelens_samples_agree(model, n=200_000):
    """SAELens' own sampler agrees with the enumeration and with ``support_entropy``: no
    impossible pattern appears, each pattern's frequency is within 5 standard errors of its
    exact probability, and the plug-in entropy of n samples is within 4 standard errors (plus
    its small downward bias)."""
    dist = _brute_force_distribution(model)
    torch.manual_seed(0)
    sample = model.activation_generator.sample(n)
    support = (sample.to_dense() if sample.is_sparse else sample) > 0
    codes = (support.long() * 2 ** torch.arange(support.shape[1])).sum(1)
    values, counts = torch.unique(codes, return_counts=True)
    exact = {sum(1 << f for f in s): p for s, p in dist.items()}
    assert all(exact.get(v, 0.0) > 0 for v in values.tolist())
    seen = dict(zip(values.tolist(), counts.tolist(), strict=True))
    for code, p in exact.items():
        assert abs(seen.get(code, 0) / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12
    truth = support_entropy(model)
    surprisal = [(-math.log2(p), p) for p in exact.values() if p > 0]
    sd = math.sqrt(sum(p * s * s for s, p in surprisal) - truth**2)
    bias = (len(surprisal) - 1) / (2 * n * math.log(2))
    plug_in = plugin_entropy(counts.tolist())
    assert abs(plug_in - truth) <= 4 * sd / math.sqrt(n) + bias


@pytest.mark.parametrize("build", [_hand_made_tree, _generated_hierarchy_model])
def test_equals_the_entropy_of_saelens_samples(build):
    _assert_saelens_samples_agree(build())


def test_independent_features_are_a_sum_of_binary_entropies():
    p = [0.5, 0.1, 0.9, 0.0, 1.0, 0.25]
    # h(0.5) + h(0.1) + h(0.9) + h(0) + h(1) + h(0.25) = 1 + 2 * 0.468996 + 0 + 0 + 0.811278
    assert support_entropy(_model([], p)) == pytest.approx(2.749269311637695, abs=1e-7)
    # mean 0, std 1: a fired feature is active half the time, so q = p / 2
    # h(0.25) + h(0.05) + h(0.45) + h(0) + h(0.5) + h(0.125)
    halved = 0.8112781244591328 + 0.28639695711595625 + 0.9927744539878084 + 1 + 0.5435644431995964
    assert support_entropy(_model([], p, mean=0.0, std=1.0)) == pytest.approx(halved, abs=1e-7)
    # mean <= 0 with no spread: relu leaves nothing, whatever fires
    assert support_entropy(_model([], p, mean=0.0, std=0.0)) == 0.0


def _random_forest(rng, n_tree):
    """A random forest over features 0..n_tree-1 (in shuffled order) with organisational nodes
    and random exclusive flags."""
    order = list(range(n_tree))
    rng.shuffle(order)
    nodes, roots = [], []
    while order or (nodes and rng.random() < 0.2 and len(nodes) < 2 * n_tree):
        index = order.pop() if order and rng.random() < 0.8 else None
        node = Node(index)
        if nodes and rng.random() < 0.8:
            rng.choice(nodes).children.append(node)
        else:
            roots.append(node)
        nodes.append(node)
    for node in nodes:
        node.mutually_exclusive_children = len(node.children) >= 2 and rng.random() < 0.6
    return roots


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_tree=st.integers(1, 8))
def test_random_forests_equal_brute_force(seed, n_tree):
    rng = random.Random(seed)
    n = n_tree + rng.randint(0, 2)  # a couple of features outside the hierarchy
    p = [rng.choice([0.0, 1.0, rng.random(), rng.random()]) for _ in range(n)]
    std = [rng.choice([0.0, 1.0]) for _ in range(n)]
    mean = [rng.uniform(-0.5, 1.5) for _ in range(n)]
    model = _model(_random_forest(rng, n_tree), p, torch.tensor(mean), torch.tensor(std))
    exact = _entropy_bits(_brute_force_distribution(model).values())
    assert support_entropy(model) == pytest.approx(exact, abs=1e-9)


def test_a_large_exclusive_group_matches_its_survivor_distribution():
    """40 exclusive siblings: P(sibling c survives) = q_c E[1 / (1 + K)], K the number of other
    active siblings, its distribution by dynamic programming."""
    q = [0.9 / (1 + i) ** 0.5 for i in range(40)]
    model = _model([Node(None, [Node(i) for i in range(40)], True)], q)
    q = _active_before_hierarchy(model)
    survive = []
    for c in range(40):
        pmf = [1.0]
        for j, qj in enumerate(q):
            if j != c:
                pmf = [a * (1 - qj) + b * qj for a, b in zip(pmf + [0.0], [0.0] + pmf, strict=True)]
        survive.append(q[c] * sum(pk / (k + 1) for k, pk in enumerate(pmf)))
    none = math.prod(1 - qj for qj in q)
    assert sum(survive) + none == pytest.approx(1.0, abs=1e-12)
    assert support_entropy(model) == pytest.approx(_entropy_bits([*survive, none]), abs=1e-9)


def test_a_deep_chain_is_the_entropy_of_its_active_prefix():
    """300 features, each the only child of the previous (SAELens' own validation recurses, so
    much deeper trees cannot be built): the support is the active prefix, whose length L has
    P(L = k) = q_1 ... q_k (1 - q_{k+1})."""
    n = 300
    chain = Node(n - 1)
    for index in range(n - 2, -1, -1):
        chain = Node(index, [chain])
    p = [1 - 0.5 / (1 + i) for i in range(n)]
    model = _model([chain], p)
    q = _active_before_hierarchy(model)
    lengths, prefix = [], 1.0
    for qk in q:
        lengths.append(prefix * (1 - qk))
        prefix *= qk
    lengths.append(prefix)
    assert support_entropy(model) == pytest.approx(_entropy_bits(lengths), abs=1e-9)


def test_a_correlated_model_is_refused_in_one_line():
    cfg = SyntheticModelConfig(
        num_features=16, hidden_dim=4, correlation=LowRankCorrelationConfig(rank=2), seed=0
    )
    with pytest.raises(ValueError, match="^support_entropy: a correlated SyntheticModel") as info:
        support_entropy(SyntheticModel(cfg))
    assert "\n" not in str(info.value) and "correlation=None" in str(info.value)


def test_sparse_sampling_is_read_only_where_it_draws_the_dense_support():
    """SAELens' sparse path keeps fired features of magnitude 0 as entries, and its hierarchy
    gates and draws on entries: the same support as the dense path only where no fired
    magnitude can be 0."""
    model = _hand_made_tree()
    model.use_sparse_tensors = True
    with pytest.raises(ValueError, match="^support_entropy: with use_sparse_tensors=True"):
        support_entropy(model)
    generator = model.activation_generator
    generator.std_firing_magnitudes.zero_()
    generator.mean_firing_magnitudes.fill_(1.0)
    _assert_saelens_samples_agree(model)


def test_a_modifier_other_than_the_hierarchy_is_refused():
    model = _model([], [0.5, 0.5])
    model.activation_generator = ActivationGenerator(2, 0.5, modify_activations=lambda a: a * 2)
    with pytest.raises(ValueError, match="^support_entropy: the model's activation generator"):
        support_entropy(model)
