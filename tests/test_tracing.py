"""Entropy tracing on the tiny offline Llama: states gathering, cells, positions, ICL, two-token."""

import json
import math

import matplotlib.image
import pytest
import torch

from sae_lens_bae.activations import gather_states
from sae_lens_bae.entropy.cells import (
    TRACING_RECIPE,
    EntropyRecipe,
    estimate_entropies,
)
from sae_lens_bae.entropy.reference import reference_sizes
from sae_lens_bae.experiments import entropy_icl, entropy_positions, two_token
from sae_lens_bae.experiments.entropy_icl import ICLTracingConfig, trace_icl
from sae_lens_bae.experiments.entropy_positions import PositionTracingConfig
from sae_lens_bae.experiments.two_token import TwoTokenConfig, two_token_sequences
from sae_lens_bae.models import load_model
from sae_lens_bae.prompts import ICLTemplate, build_icl_prompts, first_token_ids

QUICK = EntropyRecipe.of(expansion=2, steps=60, batch_size=128)
SMALL_BATCH = EntropyRecipe.of(expansion=2, steps=30, batch_size=8)
# the tiny tokenizer knows only w3..w99: templates and label words are made of those
TEMPLATE = ICLTemplate(demonstration="w10 {sentence} w11 {label} w12 ", query="w10 {sentence} w11")


@pytest.fixture(scope="module")
def tiny_model(tiny_hf_llama_dir):
    return load_model(str(tiny_hf_llama_dir))


def test_gather_states_matches_run_with_cache_on_right_padded_rows(tiny_model):
    torch.manual_seed(0)
    tokens = torch.randint(3, 100, (5, 12))
    tokens[:, 0] = 1
    positions = torch.tensor([[3, 7], [1, 11], [0, 5], [2, 2], [9, 4]])
    hooks = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_mid"]
    states, logits = gather_states(
        tiny_model, tokens, hooks, positions, batch_size=2, logit_tokens=[5, 9], progress=False
    )
    full_logits, cache = tiny_model.run_with_cache(tokens, prepend_bos=False)
    rows = torch.arange(5)[:, None]
    for hook in hooks:
        assert states[hook].shape == (5, 2, 32)
        assert torch.allclose(states[hook], cache[hook][rows, positions], atol=1e-5)
    assert torch.allclose(logits, full_logits[rows, positions][..., [5, 9]], atol=1e-4)
    # right padding does not change a row's earlier states (causal model)
    padded = torch.cat([tokens, torch.full((5, 4), 1)], dim=1)
    again, _ = gather_states(tiny_model, padded, hooks, positions, progress=False)
    assert torch.allclose(again[hooks[0]], states[hooks[0]], atol=1e-5)


def test_gather_states_bad_input(tiny_model):
    tokens = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="Unknown hook"):
        gather_states(tiny_model, tokens, ["blocks.7.hook_resid_post"], torch.zeros(2, 1).long())
    with pytest.raises(ValueError, match=r"lie in \[0, 3\]"):
        gather_states(tiny_model, tokens, ["blocks.0.hook_resid_post"], torch.full((2, 1), 4))


def test_first_token_ids_must_differ(tiny_model):
    assert first_token_ids(tiny_model.tokenizer, ["w5", "w6"]) == [5, 6]
    with pytest.raises(ValueError, match="share first tokens"):
        first_token_ids(tiny_model.tokenizer, ["unknown", "words"])  # both <unk>


def test_estimate_entropies_per_cell():
    torch.manual_seed(0)
    constant = torch.ones(512, 8) * 3.0
    points = torch.randn(4, 8)
    four_points = points[torch.arange(512) % 4]
    cells = estimate_entropies(
        [constant, four_points, four_points * 1000.0], QUICK, seeds=[0, 1, 1], progress=False
    )
    assert cells[0].bits == 0.0 and cells[0].relative_error is None
    # each BAE frames its set at one scale, so a 1000x larger copy gets the same BAE and estimate
    assert cells[2].scale == pytest.approx(cells[1].scale / 1000)
    assert cells[2].bits == pytest.approx(cells[1].bits, abs=1e-3)
    assert cells[2].relative_error == pytest.approx(cells[1].relative_error, rel=1e-2, abs=1e-4)
    # four distinct states: a 2-bit ceiling; the estimate is the mean over the cell's seeds
    assert (cells[1].n_distinct, cells[1].ceiling_bits) == (4, 2.0)
    assert cells[1].bits == pytest.approx(sum(cells[1].bits_per_seed) / len(cells[1].bits_per_seed))
    with pytest.raises(ValueError, match="set 1 is"):
        estimate_entropies([constant, torch.zeros(10, 4)], progress=False)
    with pytest.raises(ValueError, match="NaN"):
        estimate_entropies([constant * float("nan")], progress=False)


def test_build_icl_prompts_same_queries_for_every_k():
    pairs = [(f"s{i}", "pos" if i % 2 else "neg") for i in range(20)]
    zero = build_icl_prompts(pairs, 0, 4)
    four = build_icl_prompts(pairs, 4, 4, seed=1)
    assert [label for _, label in zero] == [label for _, label in four] == ["neg", "pos"] * 2
    assert zero[1][0] == "sentence: s1 sentiment:"
    prompt = four[1][0]
    assert prompt.endswith("sentence: s1 sentiment:") and prompt.count("sentiment:") == 5
    demos = [line.split()[1] for line in prompt.splitlines()[:-1]]
    assert all(int(d[1:]) >= 4 for d in demos)  # demonstrations never come from the queries
    assert all(f"sentiment: {'pos' if int(d[1:]) % 2 else 'neg'}" in prompt for d in demos)
    with pytest.raises(ValueError, match="cannot give"):
        build_icl_prompts(pairs, 17, 4)
    with pytest.raises(ValueError, match="must contain"):
        ICLTemplate(query="no slot")


def test_icl_accuracy_matches_the_models_own_prediction(tiny_model):
    pairs = [(" ".join(f"w{20 + (i * 7 + j) % 70}" for j in range(4)), f"w{5 + i % 2}")
             for i in range(40)]  # fmt: skip
    rows, accuracy = trace_icl(
        tiny_model, pairs, layers=[0, 1], shots=(0, 2), n_prompts=16, recipe=SMALL_BATCH,
        template=TEMPLATE, batch_size=5, progress=False,
    )  # fmt: skip
    assert sorted((r["layer"], r["shots"]) for r in rows) == [(0, 0), (0, 2), (1, 0), (1, 2)]
    assert all(r["n_samples"] == 16 for r in rows)
    # recompute the 2-shot accuracy prompt by prompt with the model's full forward pass
    import random

    shuffled = list(pairs)
    random.Random(0).shuffle(shuffled)
    correct = 0
    for prompt, label in build_icl_prompts(shuffled, 2, 16, template=TEMPLATE):
        tokens = tiny_model.to_tokens(prompt, prepend_bos=False)
        tokens = torch.cat([torch.tensor([[1]]), tokens], dim=1)
        last = tiny_model(tokens)[0, -1]
        correct += int(("w5", "w6")[int(last[6] > last[5])] == label)
    assert accuracy[2] == pytest.approx(correct / 16)


def test_position_tracing_writes_json_table_and_plot(tiny_hf_llama_dir, tiny_corpus, tmp_path):
    cfg = PositionTracingConfig(
        model=str(tiny_hf_llama_dir),
        dataset=str(tiny_corpus),
        layers=(0, 1),
        max_log2_position=3,
        n_sequences=200,
        recipe=QUICK,
        out=tmp_path,
    )
    rows = entropy_positions.run(cfg, progress=False)["cells"]
    assert [(r["layer"], r["position"]) for r in rows] == [
        (layer, p) for layer in (0, 1) for p in (1, 2, 4, 8)
    ]
    saved = json.loads((tmp_path / "positions.json").read_text())
    assert saved["cells"] == rows and saved["config"]["n_sequences_used"] == 200
    assert all(r["n_samples"] == 200 for r in rows)
    for r in rows:  # the ceiling is log2 of the distinct states
        assert r["ceiling_bits"] == pytest.approx(math.log2(r["n_distinct"]), abs=1e-9)
        assert r["bits"] == pytest.approx(sum(r["bits_per_seed"]) / len(r["bits_per_seed"]))
    assert matplotlib.image.imread(tmp_path / "positions.png").shape[0] > 100
    report = (tmp_path / "positions.md").read_text()
    assert "| layer | position | bits |" in report
    for r in rows:  # the k-means reference of every cell (on by default), from the same states
        distinct = r["n_distinct"]
        assert r["reference_k"] in reference_sizes(distinct)
        assert (r["reference_k"] == reference_sizes(distinct)[-1]) or r["reference_reads_cell"]
    assert "| k-means K | k-means bits |" in report and "k-means reference:" in report
    with pytest.raises(ValueError, match="do not exist"):
        entropy_positions.run(PositionTracingConfig(model=str(tiny_hf_llama_dir), layers=(2,)))


def test_a_killed_position_trace_does_not_train_its_baes_again(
    tiny_hf_llama_dir, tiny_corpus, tmp_path, training_steps, count_calls
):
    """Killed while its BAEs train, the same command goes on from the last checkpoint and writes
    the rows an uninterrupted run writes, taking only the steps the killed run had not and no
    forward pass (the gathered states are kept beside the checkpoint); the checkpoint is removed
    once the results are written."""
    from transformer_lens import HookedTransformer

    from sae_lens_bae.experiments.common import TRAINING_CHECKPOINT

    passes = count_calls(HookedTransformer, "run_with_hooks")

    recipe = QUICK.changed(converge=False, steps=20, seeds=1, repair_rounds=0)  # one training
    common = dict(model=str(tiny_hf_llama_dir), dataset=str(tiny_corpus), layers=(1,),
                  max_log2_position=1, n_sequences=200, recipe=recipe, reference=False)  # fmt: skip
    whole = entropy_positions.run(PositionTracingConfig(**common, out=tmp_path / "a"), False)
    training_steps.kill(after=12)
    with pytest.raises(KeyboardInterrupt):
        entropy_positions.run(PositionTracingConfig(**common, out=tmp_path / "b"), False)
    assert (tmp_path / "b" / TRAINING_CHECKPOINT / "checkpoint_complete.json").is_file()
    training_steps.count()
    passes.clear()
    again = entropy_positions.run(PositionTracingConfig(**common, out=tmp_path / "b"), False)
    assert training_steps.taken == 20 - 12  # the trace's stacked training took only the steps left
    assert passes == []  # and the states were read, not gathered again
    assert again["cells"] == whole["cells"]
    assert not (tmp_path / "b" / TRAINING_CHECKPOINT).exists()


def test_icl_tracing_from_a_tsv(tiny_hf_llama_dir, tmp_path):
    lines = ["label\tsentence"] + [f"{i % 2}\tw{20 + i} w{40 + i}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    cfg = ICLTracingConfig(
        dataset=str(tmp_path),
        model=str(tiny_hf_llama_dir),
        label_words={"0": "w5", "1": "w6"},
        layers=(1,),
        shots=(0, 1, 4),
        n_prompts=24,
        template=TEMPLATE,
        recipe=SMALL_BATCH,
        out=tmp_path / "out",
    )
    summary = entropy_icl.run(cfg, progress=False)
    rows, accuracy = summary["cells"], summary["accuracy"]
    assert sorted(accuracy) == [0, 1, 4]
    for k, a in accuracy.items():  # the fraction of 24 prompts answered right, on every row of k
        assert a * 24 == pytest.approx(round(a * 24), abs=1e-6)
        assert [r["accuracy"] for r in rows if r["shots"] == k] == [a]
    saved = json.loads((tmp_path / "out" / "icl.json").read_text())
    assert saved["cells"] == rows and len(rows) == 3
    assert matplotlib.image.imread(tmp_path / "out" / "icl.png").shape[0] > 100
    with pytest.raises(ValueError, match="fewer than one minibatch"):  # before any forward pass
        trace_icl(None, [], layers=(1,), n_prompts=24, recipe=QUICK)


def test_two_token_sequences_and_entropy():
    rows, h = two_token_sequences((5, 6), r=3, n=4000, bos=1, seed=0)
    assert rows.shape == (4000, 4) and (rows[:, 0] == 1).all()
    assert set(rows[:, 1:].unique().tolist()) == {5, 6}
    assert h == pytest.approx(3.0, abs=0.01)  # 8 sequences, about equally often
    assert two_token_sequences((5, 6), r=0, n=10, bos=1)[1] == 0.0


@pytest.mark.slow
def test_two_token_benchmark_stays_under_its_ceiling(tiny_hf_llama_dir, tmp_path):
    cfg = TwoTokenConfig(
        model=str(tiny_hf_llama_dir),
        layer=1,
        words=("w5", "w6"),
        planted_bits=(0, 1, 2, 3),
        n_samples=1024,
        recipe=TRACING_RECIPE,  # the default of the LLM runs
        out=tmp_path,
    )
    rows = two_token.run(cfg, progress=False)["results"]
    assert [r["r"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["bits"] == 0.0  # r = 0: every state is the BOS's
    assert all(r["within_ceiling"] for r in rows), [(r["r"], r["bits"]) for r in rows]
    assert rows[3]["bits"] > 1.5  # the states do differ: the estimate is not trivially 0
    assert matplotlib.image.imread(tmp_path / "two_token.png").shape[0] > 100
