"""The benchmark scripts run end to end at toy sizes and report what they say they report."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sae_lens_bae.experiments.synth_sae import PRESETS

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_runner_throughput_trains_each_sae_through_saelens_runner(
    tiny_hf_llama_dir, tiny_corpus, tmp_path
):
    """Three SAELens runner trainings on the tiny Llama: every run trains on exactly the tokens
    asked for in steps of the batch, its time split adds up to its wall time, a BAE's codes are
    0/1 (its density is a firing rate) and the profiler's heaviest operators are listed."""
    out = tmp_path / "throughput"
    _load_benchmark("runner_throughput").main(
        ["--model", str(tiny_hf_llama_dir), "--hook", "blocks.1.hook_resid_post", "--dataset",
         str(tiny_corpus), "--context-size", "16", "--training-tokens", "640", "--batch-size",
         "64", "--device", "cpu", "--out", str(out)]
    )  # fmt: skip
    report = json.loads((out / "runner_throughput.json").read_text())
    runs = {run["architecture"]: run for run in report["runs"]}
    assert list(runs) == ["standard", "topk", "bae"]
    assert report["info"]["d_in"] == 32
    assert report["info"]["d_sae"] == 128
    for run in runs.values():
        assert run["calls"]["SAE step"] == 10  # 640 tokens / 64
        assert run["tokens"] == 640
        assert sum(run["seconds"].values()) == pytest.approx(run["wall_seconds"], rel=1e-9)
        assert run["seconds"]["model forward"] > 0
        assert len(run["top_operators"]) == 8
    assert len(runs["bae"]["density_every_10_steps"]) == 1
    assert 0 < runs["bae"]["density_first_last"][0] < 1
    assert (out / "runner_throughput.md").read_text().count("| bae |") == 1


@pytest.mark.slow
def test_synthetic_cell_reads_one_cell_with_each_recipe_variant(tmp_path, capsys):
    """Each variant replaces recipe fields and is trained and read on the same cell: a variant
    without the convergence rule trains the whole budget, its trajectory has one point per
    stride, its estimate is the library's (``estimate_entropies`` on the same cell and recipe),
    and a bad variant is refused with one line (exit 2) before any training."""

    from sae_lens_bae.entropy import EntropyRecipe, estimate_entropies, planted_cell, recovered_bits

    out = tmp_path / "cell"
    common = ["--d", "16", "--r", "2", "--n-train", "2048", "--n-test", "512", "--steps", "400",
              "--every", "100", "--out", str(out)]  # fmt: skip
    benchmark = _load_benchmark("synthetic_cell")
    benchmark.main(
        [*common, "--variant", 'all steps={"converge": false}',
         "--variant", 'warm-up={"lr_warm_up_steps": 100, "converge": false}', "--save-bae"]
    )  # fmt: skip
    report = json.loads((out / "synthetic_cell.json").read_text())
    assert [v["name"] for v in report["variants"]] == ["all steps", "warm-up"]
    for variant in report["variants"]:
        assert variant["steps"] == 400
        assert len(variant["trajectory"]["reconstruction_loss"]) == 4
    plain, warm = report["variants"]
    train, test, _, bits = planted_cell(2, 16, 2048, 512, 2000)  # the synthetic presets' seeding
    recipe = EntropyRecipe.of(expansion=2, steps=400, lr=4e-3, converge=False)
    [direct] = estimate_entropies([train], recipe, eval_sets=[test], seeds=[0], normalise=False,
                                  progress=False)  # fmt: skip
    assert plain["bits"] == pytest.approx(direct.bits, rel=1e-6)
    assert plain["relative_error"] == pytest.approx(direct.relative_error, rel=1e-6)
    assert plain["within_bar"] == (abs(direct.bits - 2) <= 0.1 and direct.relative_error <= 0.02)
    assert plain["recovered_bits"] == recovered_bits(direct.bae.encode_bits(test), bits)
    saved = torch.load(out / "all steps.pt", weights_only=False)  # --save-bae: the kept BAE
    assert torch.equal(saved["state_dict"]["W_enc"], direct.bae.state_dict()["W_enc"])
    assert saved["data_seed"] == 2000 and "scale" not in saved  # the frame is in the state dict
    # the warm-up changes training: its first steps run at a fraction of the lr
    assert warm["trajectory"]["reconstruction_loss"] != plain["trajectory"]["reconstruction_loss"]
    assert (out / "synthetic_cell.md").read_text().count('| {"converge": false} |') == 1
    # the probe reads the saved BAE on the rebuilt held-out states: the run's error and bits
    [probed] = _load_benchmark("planted_code_probe").main([str(out / "all steps.pt")]).values()
    assert probed["relative_error"] == pytest.approx(plain["relative_error"], rel=1e-5)
    assert probed["copied_bits"] == plain["recovered_bits"]
    assert json.loads((out / "all steps_probe.json").read_text()) == probed
    code, error = _refused(capsys, benchmark, *common, "--variant", 'x={"lrr": 1}')
    assert code == 2 and "not EntropyRecipe fields: ['lrr']" in error


def test_synthetic_cell_on_the_paper_base_takes_variants_through_the_preset(tmp_path, capsys):
    """``--recipe-base long_run``: a variant's lr alone goes through ``EntropyRecipe.long_run(d)``
    (lr_end a tenth of it, the preset's T and beta2 kept), and the estimate is the library's
    with that recipe."""
    from sae_lens_bae.entropy import EntropyRecipe, estimate_entropies, planted_cell

    out = tmp_path / "paper"
    benchmark = _load_benchmark("synthetic_cell")
    benchmark.main(
        ["--d", "16", "--r", "2", "--n-train", "2048", "--n-test", "512", "--steps", "200",
         "--recipe-base", "long_run", "--variant", 'low={"lr": 0.001, "lr_warm_up_steps": 20}',
         "--out", str(out)]
    )  # fmt: skip
    [variant] = json.loads((out / "synthetic_cell.json").read_text())["variants"]
    recipe = EntropyRecipe.long_run(16, expansion=2, steps=200, lr=0.001, lr_warm_up_steps=20)
    assert variant["recipe"]["lr_end"] == pytest.approx(1e-4)
    assert variant["recipe"]["surrogate_temperature"] == 0.15
    assert variant["recipe"] == json.loads(json.dumps(recipe.record()))
    train, test, _, _ = planted_cell(2, 16, 2048, 512, 2000)
    [direct] = estimate_entropies([train], recipe, eval_sets=[test], seeds=[0], normalise=False,
                                  progress=False)  # fmt: skip
    assert variant["bits"] == pytest.approx(direct.bits, rel=1e-6)
    assert variant["relative_error"] == pytest.approx(direct.relative_error, rel=1e-6)
    # the preset's 1000-step warm-up does not fit 200 steps: one line, exit 2, nothing trained
    code, error = _refused(capsys, benchmark, "--d", "16", "--steps", "200",
                           "--recipe-base", "long_run", "--variant", 'x={"lr": 0.001}',
                           "--out", str(tmp_path / "x"))  # fmt: skip
    assert code == 2
    assert "variant 'x': lr_warm_up_steps must be in [0, steps=200), got 1000" in error
    assert not (tmp_path / "x").exists()


@pytest.mark.slow  # one command line runs in a process of its own
def test_heldout_entropy_reads_each_set_through_both_paths(tmp_path, capsys):
    """Each (case, seed, shift) is read by ``estimate_entropies`` with the recipe (the default's
    fields changed by ``--recipe``) and by a registry ``entropy`` BAE trained through
    ``train_sae``: each row is what the library gives on the same set, with the planted bits its
    code copies; a shifted set is the same set moved (its variance unchanged), and a bad case or
    recipe field is refused with one line (exit 2)."""
    from sae_lens_bae.entropy import EntropyRecipe, code_entropy, estimate_entropies, recovered_bits
    from sae_lens_bae.saes.bae_recipes import bae_config
    from sae_lens_bae.training import train_sae

    benchmark = _load_benchmark("heldout_entropy")
    fair_bit_set = benchmark.fair_bit_set

    out = tmp_path / "heldout"
    benchmark.main(
        ["--cases", "8:2", "--shifts", "0,5", "--n-train", "1024", "--n-test", "256",
         "--recipe-steps", "400", "--recipe", '{"lr": 0.003}', "--registry-steps", "200",
         "--out", str(out)]
    )  # fmt: skip
    rows = json.loads((out / "heldout_entropy.json").read_text())["rows"]
    assert [(row["path"], row["shift"]) for row in rows] == [
        ("recipe", 0.0), ("registry", 0.0), ("recipe", 5.0), ("registry", 5.0)
    ]  # fmt: skip
    train, test = fair_bit_set(8, 2, 1024, 256, seed=0, shift=5.0)
    plain, _ = fair_bit_set(8, 2, 1024, 256, seed=0, shift=0.0)
    moved = train - plain
    assert torch.allclose(moved, moved[0].expand_as(moved), atol=1e-4)  # one vector for all
    [cell] = estimate_entropies([train], EntropyRecipe.of(steps=400, lr=0.003), eval_sets=[test],
                                seeds=[0], progress=False)  # fmt: skip
    assert rows[2]["bits"] == pytest.approx(cell.bits, rel=1e-6)
    _, same_test, test_bits = benchmark.planted_fair_bit_set(8, 2, 1024, 256, seed=0, shift=5.0)
    assert torch.equal(same_test, test)
    assert rows[2]["recovered_bits"] == recovered_bits(cell.codes(test), test_bits)
    assert rows[2]["typical_relative_error"] == pytest.approx(cell.typical_relative_error)
    cfg = bae_config(8, recipe="entropy", training_steps=200)
    run = train_sae(train, cfg, training_samples=200 * 512, batch_size=512, lr=4e-3, seed=0)
    direct = code_entropy(run.sae.eval(), test)
    assert rows[3]["bits"] == pytest.approx(direct.bits, rel=1e-6)
    assert rows[3]["relative_error"] == pytest.approx(direct.relative_error, rel=1e-6)
    assert rows[3]["recovered_bits"] == recovered_bits(run.sae.eval().encode_bits(test), test_bits)
    assert [row["recovered_bits"] for row in rows] == [2, 2, 2, 2]  # both bits, both paths
    code, error = _refused(capsys, benchmark, "--recipe", '{"rate": 1}')
    assert code == 2 and "not EntropyRecipe fields: ['rate']" in error
    # and as a user runs it: the script's command line, in a process of its own
    bad = subprocess.run([sys.executable, str(BENCHMARKS / "heldout_entropy.py"), "--cases", "4:6"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].endswith("0 < r <= d, got '4:6'")


@pytest.mark.slow
def test_heldout_entropy_trains_the_paper_recipe_for_each_cases_dimension(tmp_path, capsys):
    """``--recipe-base long_run`` reads each case with ``EntropyRecipe.long_run(d)`` (its lr
    rule for that d), ``--recipe`` changing its fields; a budget its warm-up does not fit is refused
    before any training, in one line (exit 2)."""
    from sae_lens_bae.entropy import EntropyRecipe, estimate_entropies

    benchmark = _load_benchmark("heldout_entropy")
    out = tmp_path / "paper"
    benchmark.main(
        ["--cases", "8:2,12:2", "--paths", "recipe", "--n-train", "1024", "--n-test", "256",
         "--recipe-base", "long_run", "--recipe-steps", "200", "--recipe",
         '{"lr_warm_up_steps": 20}', "--out", str(out)]
    )  # fmt: skip
    rows = json.loads((out / "heldout_entropy.json").read_text())["rows"]
    for row, d in zip(rows, (8, 12), strict=True):
        recipe = EntropyRecipe.long_run(d, steps=200, lr_warm_up_steps=20)
        assert recipe.optimiser.lr == pytest.approx(4e-3 * (512 / d) ** 0.5)
        train, test = benchmark.fair_bit_set(d, 2, 1024, 256, seed=0, shift=0.0)
        [cell] = estimate_entropies([train], recipe, eval_sets=[test], seeds=[0], progress=False)
        assert row["bits"] == pytest.approx(cell.bits, rel=1e-6)
        assert row["relative_error"] == pytest.approx(cell.relative_error, rel=1e-6)
        assert row["steps"] == 200  # no convergence stop in this recipe
    lowered = benchmark.recipe_for(16, "long_run", None, {"lr": 1e-3})
    # as EntropyRecipe.long_run(16, lr=1e-3): the cosine ends at a tenth of the lr given
    assert (lowered.optimiser.lr, lowered.optimiser.lr_end) == (1e-3, 1e-4)
    code, error = _refused(capsys, benchmark, "--recipe-base", "long_run",
                           "--recipe-steps", "500", "--out", str(tmp_path / "bad"))  # fmt: skip
    assert code == 2 and "lr_warm_up_steps must be in [0, steps=500)" in error
    assert not (tmp_path / "bad").exists()


def test_trace_frontier_reads_one_trace_cell_at_each_strength(
    tiny_hf_llama_dir, tiny_corpus, tmp_path, capsys
):
    """Each multiplier's row is what ``estimate_entropies`` gives on the cell's states with the
    tracing recipe's coefficients times that multiplier (0: without the objective); a negative
    multiplier is refused with one line (exit 2)."""

    from sae_lens_bae.activations import gather_states
    from sae_lens_bae.data import document_windows, iter_texts
    from sae_lens_bae.entropy import TRACING_RECIPE, estimate_entropies
    from sae_lens_bae.models import load_model

    out = tmp_path / "frontier"
    frontier = _load_benchmark("trace_frontier")
    common = ["--model", str(tiny_hf_llama_dir), "--dataset", str(tiny_corpus), "--layer", "1",
              "--position", "4", "--n-sequences", "300", "--expansion", "2",
              "--steps", "200"]  # fmt: skip
    frontier.main([*common, "--multipliers", "1,0", "--quantizer-sizes", "8,32",
                   "--out", str(out)])  # fmt: skip
    report = json.loads((out / "trace_frontier.json").read_text())
    assert [row["multiplier"] for row in report["rows"]] == [1.0, 0.0]
    assert (out / "trace_frontier.png").stat().st_size > 0
    model = load_model(str(tiny_hf_llama_dir))
    tokens = document_windows(iter_texts(tiny_corpus), model.tokenizer, 4, max_sequences=300)
    assert report["info"]["n_states"] == tokens.shape[0]
    states, _ = gather_states(model, tokens, ["blocks.1.hook_resid_post"],
                              torch.full((tokens.shape[0], 1), 4), progress=False)  # fmt: skip
    x = states["blocks.1.hook_resid_post"][:, 0]
    for row, objective in zip(report["rows"], (True, False), strict=True):
        recipe = TRACING_RECIPE.changed(seeds=1, expansion=2, steps=200, objective=objective)
        [cell] = estimate_entropies([x], recipe, seeds=[0], bootstrap=0, progress=False)
        assert row["bits"] == pytest.approx(cell.bits, rel=1e-6)
        assert row["relative_error"] == pytest.approx(cell.relative_error, rel=1e-6)
        assert row["ceiling_bits"] == cell.ceiling_bits == report["info"]["ceiling_bits"]
    for row, k in zip(report["quantizers"], (8, 32), strict=True):
        expected, centroids = frontier.quantizer_row(x, k)
        assert {key: row[key] for key in ("k", "assignment_bits", "used_bits", "iterations")} \
            == {key: expected[key] for key in ("k", "assignment_bits", "used_bits",
                                               "iterations")}  # fmt: skip
        assert row["bits"] == pytest.approx(expected["bits"], rel=1e-9)
        assert row["relative_error"] == pytest.approx(expected["relative_error"], rel=1e-6)
        halfspace = [row for row in report["halfspace"] if row["k"] == k]
        assert [row["margin"] for row in halfspace] == [0.5, 0.85, 1.0]
        for row in halfspace:
            direct = frontier.halfspace_row(x, centroids, row["margin"])
            assert row["bits"] == pytest.approx(direct["bits"], rel=1e-6)
            assert row["l0"] == pytest.approx(direct["l0"], rel=1e-9)
    assert report["info"]["components_for_80pct"] == frontier.components_for(x, 0.8)
    assert "| 32 |" in (out / "trace_frontier.md").read_text()
    code, error = _refused(capsys, frontier, *common, "--multipliers", "1,-1")
    assert code == 2 and "--multipliers must be >= 0, got 1,-1" in error
    code, error = _refused(capsys, frontier, *common, "--multipliers", "1,x")
    assert code == 2 and "numbers separated by commas, got 1,x" in error
    code, error = _refused(capsys, frontier, *common, "--quantizer-sizes", "8,100000")
    assert code == 2 and f"at most the {x.shape[0]} states, got 8,100000" in error


def _load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _refused(capsys, benchmark, *args: str) -> tuple[object, str]:
    """The exit code and the last stderr line of a loaded ``benchmark`` given ``args``, run in this
    process as its command line runs it: a refusal is argparse's exit 2 and one line, and any
    other exception (a traceback on the command line) fails the test."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        benchmark.main(list(args))
    return stop.value.code, capsys.readouterr().err.strip().splitlines()[-1]


def test_quantizer_reference_codes_a_set_of_distinct_states_exactly():
    """k-means with one centroid per distinct state loses nothing; its one-hot code's
    per-bit sum is sum_k H_b(p_k) and its joint entropy H(p), here for states held 1, 1, 2
    and 4 times in 8; a coarser K spends at most log2 K + log2 e bits. A BAE built from the
    centroids (bit k: (x - mean) . u_k > a |u_k|^2) carries the same one-hot code where
    each state passes its own bit's threshold and no other: here at a = 0.9, not at 1/2
    (the state held once at 4 e_1 also passes the bit of the state at 0)."""
    frontier = _load_benchmark("trace_frontier")
    states = torch.cat([torch.zeros(1, 6), 4 * torch.eye(6)[:3]]) + 50.0  # far from the origin
    x = states[[0, 1, 2, 2, 3, 3, 3, 3]]
    row, centroids = frontier.quantizer_row(x, 4)
    assert row["relative_error"] == 0.0 and row["typical_relative_error"] == 0.0
    assert row["assignment_bits"] == pytest.approx(1.75, abs=1e-12)  # 1/8, 1/8, 1/4, 1/2
    h = lambda p: -p * math.log2(p) - (1 - p) * math.log2(1 - p)  # noqa: E731
    assert row["bits"] == pytest.approx(2 * h(1 / 8) + h(1 / 4) + 1.0, abs=1e-9)
    assert row["used_bits"] == 4
    built = frontier.halfspace_row(x, centroids, 0.9)  # one bit per state, as the quantizer
    assert built["l0"] == 1.0 and built["silent"] == 0.0
    assert built["bits"] == pytest.approx(row["bits"], rel=1e-6)
    assert built["relative_error"] < 1e-6  # the 1e-3 ridge's shrinkage: 4e-7
    assert row["ceiling_bits"] == built["ceiling_bits"] == 2.0  # 4 distinct states
    assert not row["reliable"] and not built["reliable"]  # 2.90 bits: over the ceiling
    assert frontier.halfspace_row(x, centroids, 0.5)["l0"] == 1.125
    assert frontier.halfspace_row(x, centroids, 1.01)["silent"] == 1.0  # nothing passes |u|^2
    spread = torch.randn(500, 6, generator=torch.Generator().manual_seed(1))
    coarse, _ = frontier.quantizer_row(spread, 16)
    assert coarse["assignment_bits"] <= coarse["bits"] <= math.log2(16) + math.log2(math.e)
    assert 0 < coarse["relative_error"] < 1
    assert (
        frontier.components_for(
            torch.tensor([[2.0, 0, 0], [-2, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]]),
            0.8,
        )
        == 2
    )
    assert frontier.default_quantizer_sizes(16384, 2304) == [16, 64, 256, 1024, 2304, 4096]


def test_the_op_counter_counts_work_not_views():
    """Two ops that compute (an add, a sum) and none for a view, a transpose or an
    allocation."""
    counter_class = _load_benchmark("train_step")._OpCounter
    a = torch.ones(3, 4)
    with counter_class() as counter:
        b = a.view(4, 3).t()
        torch.empty(5)
        (b + 1).sum()
    assert counter.count == 2


def test_a_term_that_is_off_is_a_zero_and_adds_nothing():
    """With the covariance term off, the objective and its total are SAELens' ``mse_loss`` (the
    squared error, its sum over d_in and its mean over the batch: three kernels), the mean code
    (one reduction, shared with the running mean), the entropy (its sum in the same kernel, then
    a_e: one product), the covariance term that is off as one zero (not computed) and the two
    adds of the total: nine kernels (ATen ops as the step benchmark counts them)."""
    from sae_lens_bae.saes.objective import bae_objective

    generator = torch.Generator().manual_seed(0)
    sae_in, sae_out = torch.randn(2, 64, 8, generator=generator).unbind()
    bits = (torch.rand(64, 24, generator=generator) < 0.3).float()
    counter_class = _load_benchmark("train_step")._OpCounter
    with counter_class() as kernels:
        terms = bae_objective(sae_in, sae_out, bits, entropy_coefficient=1e-2,
                              covariance_coefficient=0.0)  # fmt: skip
    total = terms["loss"]
    assert kernels.ops == ["mse_loss", "sum", "mean", "mean", "binary_cross_entropy", "mul",
                           "zeros_like", "add", "add"]  # fmt: skip
    assert terms["covariance_loss"].item() == 0.0 and terms["covariance_loss"].shape == ()
    expected = terms["mse_loss"] + terms["entropy_loss"]
    assert torch.equal(total, expected)
    assert torch.allclose(terms["mse_loss"], ((sae_out - sae_in) ** 2).sum(-1).mean())
    # a stack of 3: the off terms have its shape, and the sum is per member
    stacked = bae_objective(sae_in.expand(3, -1, -1), sae_out.expand(3, -1, -1),
                            bits.expand(3, -1, -1), entropy_coefficient=0.0,
                            covariance_coefficient=0.0)  # fmt: skip
    assert stacked["entropy_loss"].shape == stacked["covariance_loss"].shape == (3,)
    assert torch.equal(stacked["loss"], stacked["mse_loss"])


def test_a_bae_step_without_the_covariance_dispatches_what_a_standard_step_does():
    """One SAELens training step of a BAE without its covariance term, on inputs as given, costs
    fewer ATen ops than SAELens' ``standard`` SAE (the step is SAELens' own, its reconstruction
    SAELens' summed squared error divided by d_in), so that a GPU step whose launches dominate
    costs no more than ``standard``'s does; the input frame adds its own elementwise ops, and
    the extreme-state screen of the step (``sae_lens_bae.outliers``) its own, counted apart."""
    bench = _load_benchmark("train_step")
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig

    torch.manual_seed(0)
    batch = torch.randn(64, 16)
    saes = {
        "standard": StandardTrainingSAE(StandardTrainingSAEConfig(d_in=16, d_sae=64)),
        "bae_no_covariance": bench.bae_at_density(  # the step alone
            16, 64, batch, None, covariance_coefficient=0.0, input_variance=None,
            extreme_norm_ratio=None,
        ),
    }  # fmt: skip
    screened = bench.bae_at_density(
        16, 64, batch, None, covariance_coefficient=0.0, input_variance=None
    )
    ops = bench.ops_per_step({**saes, "bae_screened": screened}, batch)
    assert ops["bae_no_covariance"] <= ops["standard"] - 3, ops
    assert 0 < ops["bae_screened"] - ops["bae_no_covariance"] <= 20, ops  # the screen's ops


def test_a_bae_set_at_a_density_keeps_it_through_its_first_step():
    """The step benchmark's BAEs fire at the density they are named for in the frame they train
    in: the frame is fixed before the encoder bias is set, so the first step does not move it."""
    bench = _load_benchmark("train_step")
    torch.manual_seed(0)
    batch = torch.randn(512, 64) + 3.0  # states off the origin: the frame moves them
    sae = bench.bae_at_density(64, 256, batch, 0.05)
    before = sae.encode_bits(batch).mean().item()
    bench._trainer(sae, batch).step(batch)
    assert before == pytest.approx(0.05, abs=0.005)
    assert sae.encode_bits(batch).mean().item() == pytest.approx(before, abs=0.005)


def test_the_step_benchmark_times_compiled_steps_beside_the_eager_ones():
    """``--compile``: standard, topk and the BAEs timed again through ``compile_step`` (SAELens'
    ``compile_sae``) in each mode asked for, their ATen ops left uncounted (None) and out of the
    ratios of op counts."""
    bench = _load_benchmark("train_step")
    timings = bench.step_timings(
        8, 32, 64, 2, "cpu", [], compile_backend="eager", compile_modes=("default", "max-autotune")
    )
    compiled = {name for name in timings["seconds_per_step"] if "_compiled" in name}
    assert compiled == {
        f"{name}_compiled{mode}" for name in bench.COMPILED for mode in ("", "_max-autotune")
    }
    assert {name: timings["ops_per_step"][name] for name in compiled} == dict.fromkeys(compiled)
    assert compiled.isdisjoint(timings["ops_over_standard"])
    assert timings["ops_per_step"]["standard"] > 0


def test_the_ratio_interval_is_exact_for_scaled_rounds_and_widens_with_their_spread():
    """``median_ratio_interval``: rounds twice as slow give 2 at both ends; a ratio that varies
    round to round gives an interval around the ratio of medians, and a wider one for more
    spread."""
    bench = _load_benchmark("train_step")
    base = [1.0, 1.1, 0.9, 1.2, 1.0, 0.95]
    assert bench.median_ratio_interval([2 * t for t in base], base) == (2.0, 2.0)
    torch.manual_seed(0)
    rounds = 1 + 0.1 * torch.rand(200)
    base = rounds.tolist()
    narrow = (1.3 * rounds * (1 + 0.01 * torch.randn(200))).tolist()
    wide = (1.3 * rounds * (1 + 0.1 * torch.randn(200))).tolist()
    low, high = bench.median_ratio_interval(narrow, base)
    assert 1.28 < low < 1.3 < high < 1.32
    wide_low, wide_high = bench.median_ratio_interval(wide, base)
    assert wide_high - wide_low > 3 * (high - low)
    with pytest.raises(ValueError, match="paired rounds"):
        bench.median_ratio_interval([1.0], [1.0, 2.0])


def test_the_step_profile_finds_the_covariance_function_in_the_bae_step_alone(tmp_path):
    """``--profile``: per model a step's wall time split into host time inside profiled calls
    and outside them, no device time on a CPU, the BAE step's covariance penalty as one autograd
    Function call (and one backward) per step that the BAE without the term never makes, and a
    Chrome trace per model."""
    bench = _load_benchmark("train_step")
    batch = bench.step_batch(64, 8, "cpu")
    models = bench.base_models(8, 32, batch)
    saes = {name: models[name]() for name in bench.PROFILED}
    report = bench.profile_steps(saes, batch, 2, top=1000, trace_dir=tmp_path)
    assert list(report) == ["standard", "bae", "bae_no_covariance"]
    calls = {name: {row["call"]: row["calls_per_step"] for row in model["by_host_time"]}
             for name, model in report.items()}  # fmt: skip
    assert calls["bae"]["_TiledPenalty"] == calls["bae"]["_TiledPenaltyBackward"] == 1.0
    assert "_TiledPenalty" not in calls["bae_no_covariance"]
    assert "_TiledPenalty" not in calls["standard"]
    for model in report.values():
        assert model["device_busy_ms_per_step"] == 0.0 and model["by_device_time"] == []
        parts = model["host_in_calls_ms_per_step"] + model["host_outside_calls_ms_per_step"]
        assert parts == pytest.approx(model["wall_ms_per_step"], rel=1e-9)
    for name in report:
        trace = json.loads((tmp_path / f"trace_{name}.json").read_text())
        names = {event.get("name") for event in trace["traceEvents"]}
        assert "Optimizer.step#Adam.step" in names, name


def test_planted_bits_ica_finds_bits_from_r_squared_states_and_none_from_fewer(tmp_path):
    """A start on a planted direction is a fixed point (found at iteration 0); from random
    starts, 4 r^2 states let every start find a bit and r^2 / 4 let none, as the JSON and the
    table record (r = 32, 8 starts, 100 iterations)."""
    ica = _load_benchmark("planted_bits_ica")
    z, rotation = ica.whitened_bits(8, 512, torch.Generator().manual_seed(0))
    assert ica.one_unit_fastica(z, rotation[[2, 5]], rotation, 5, 0.95) == [0, 0]
    report = ica.main(["--ranks", "32", "--per-rank-squared", "0.25", "4", "--starts", "8",
                       "--iterations", "100", "--out", str(tmp_path)])  # fmt: skip
    rows = json.loads((tmp_path / "planted_bits_ica.json").read_text())["rows"]
    assert rows == json.loads(json.dumps(report["rows"]))
    assert [(row["n"], row["found"]) for row in rows] == [(256, 0), (4096, 8)]


def test_the_code_probe_splits_the_error_between_copied_and_mixed_bits():
    """A hand-built BAE on all 16 states of 4 planted bits: code bits 0 and 1 copy planted bits 0
    and 1; code bits 2 and 3 mix planted bits 2 and 3 (b2 AND b3, b2 AND NOT b3), so bit 2 is
    decoded exactly (c2 + c3) and bit 3 only as 1/2 where b2 = 0. The least-squares decoder then
    loses half of bit 3's variance: relative error 2 / 16, all of it from the uncopied bits, none
    off the span (to the float32 weights' rounding)."""
    from sae_lens_bae.saes.bae import BAETrainingSAE
    from sae_lens_bae.saes.bae_recipes import bae_config

    probe = _load_benchmark("planted_code_probe")
    bits = torch.tensor([[(i >> k) & 1 for k in range(4)] for i in range(16)]).float()
    basis = torch.linalg.qr(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))[0].T
    m0, m1, m2, m3 = basis
    bae = BAETrainingSAE(bae_config(8, 4, apply_b_dec_to_input=False, input_variance=1.0))
    root2 = 2**0.5
    with torch.no_grad():
        bae.W_enc.copy_(torch.stack([m0, m1, (m2 + m3) / root2, (m2 - m3) / root2], dim=1))
        bae.b_enc.copy_(torch.tensor([-0.5, -0.5, -1.5 / root2, -0.5 / root2]))
        bae.W_dec.copy_(torch.stack([m0, m1, m2 + m3 / 2, m2 - m3 / 2]))
        bae.b_dec.copy_(m3 / 2)
    shift, scale = torch.full((8,), 0.25), 3.0  # the probe reads states in the BAE's own frame
    with torch.no_grad():  # the same BAE in that frame: (x + t) k in, out / k - t out
        bae.input_shift.copy_(shift)
        bae.input_scale.fill_(scale)
        bae.b_enc.sub_(shift @ bae.W_enc)
        bae.W_enc.div_(scale)
        bae.W_dec.mul_(scale)
        bae.b_dec.add_(shift).mul_(scale)
    report = probe.probe_code(bae, bits @ basis, bits)
    assert report["relative_error"] == pytest.approx(0.125, abs=1e-6)
    assert report["error_from_uncopied_bits"] == pytest.approx(0.125, abs=1e-6)
    assert report["error_from_copied_bits"] == pytest.approx(0.0, abs=1e-6)
    assert report["error_out_of_span"] == pytest.approx(0.0, abs=1e-6)
    assert report["lost_fraction_per_bit"] == pytest.approx([0, 0, 0, 0.5], abs=1e-6)
    assert report["best_agreement_per_bit"] == [1.0, 1.0, 0.75, 0.75]
    assert report["copied_bits"] == 2
    # bits 0, 1: thresholds midway between -1/2 and 1/2; bits 2, 3 (nearest code bit: c2, the
    # first of two equally near): means -1/sqrt(2) and 0, the threshold on the firing mean
    assert report["threshold_position_median_copied"] == pytest.approx(0.5, abs=1e-6)
    assert report["threshold_position_median_uncopied"] == pytest.approx(1.0, abs=1e-6)
    assert report["best_agreement_histogram"] == {
        "[0.5, 0.75)": 0, "[0.75, 0.9)": 2, "[0.9, 0.95)": 0, "[0.95, 0.99)": 0, "[0.99, 1)": 2
    }  # fmt: skip
    assert (report["firing_code_bits"], report["copying_code_bits"]) == (4, 2)
    assert report["mixing_code_bits_on_uncopied"] == 2
    assert report["participation_median_mixing"] == pytest.approx(2.0, abs=1e-6)
    assert report["top_two_share_median_mixing_on_uncopied"] == pytest.approx(1.0, abs=1e-6)


def test_recipe_study_trains_variants_at_their_scales_and_judges_them(tmp_path, capsys):
    """``recipe_study``: a saved validation model, a seed of ``default`` and two variants (one at
    scales of its own) at the ``cpu`` preset's width per dimension, and a report whose decision
    lines judge each variant against its folder's default and, with ``--baseline``, every family
    of another folder against the baseline's default (identical rows: no difference)."""
    study = _load_benchmark("recipe_study")
    model, first = tmp_path / "model", tmp_path / "A"
    study.main(["build", "--seed", "7", "--size", "64,8", "--out", str(model)])
    for seed in ("100", "101"):
        study.main(["train", "--model", str(model), "--seed", seed, "--steps", "6",
                    "--variants", "covariance_equal,width_2d",
                    "--scales", '{"covariance_equal": [2, 4]}',
                    "--out", str(first)])  # fmt: skip
    held = json.loads((first / "seed-100.json").read_text())
    scales = PRESETS["cpu"].settings["bae"]  # a variant without scales of its own takes these
    default = {("bae", s) for s in scales}
    wide = {("bae:width_2d", s) for s in scales}
    assert {(r["family"], r["setting"]) for r in held["rows"]} == (
        default | wide | {("bae:covariance_equal", 2.0), ("bae:covariance_equal", 4.0)}
    )
    assert (held["study"]["width"], held["study"]["steps"]) == (8 * 256 // 48, 6)
    widths = {r["family"]: r["ev_ceiling"] for r in held["rows"]}
    assert widths["bae:width_2d"] != widths["bae"]  # 16 bits against 42: its own ceiling
    copy = tmp_path / "B"
    copy.mkdir()
    for path in first.glob("seed-*.json"):  # every row converged: the verdicts read them all
        run = json.loads(path.read_text())
        run["rows"] = [{**row, "converged": True} for row in run["rows"]]
        for folder in (first, copy):
            (folder / path.name).write_text(json.dumps(run))
    study.main(["report", str(first), str(copy), "--baseline", str(first), "--out",
                str(tmp_path / "report")])  # fmt: skip
    lines = (tmp_path / "report" / "study.md").read_text().splitlines()
    decided = {line.split(" | ")[0][2:]: line for line in lines if " vs " in line}
    assert {"bae:covariance_equal vs default (A)", "bae:width_2d vs default (B)"} <= set(decided)
    twin = decided["bae vs default of A (B)"]
    assert twin.split(" | ")[1] == "no difference (+0.000)"
    rows = 2 * 2 * len(scales)  # both defaults' rows, 2 seeds each, every row converged
    assert twin.split(" | ")[5] == f"{rows}/{rows}"
    assert "bae vs default of A (A)" not in decided  # the baseline is not judged against itself
    code, error = _refused(capsys, study, "train", "--model", str(model), "--seed", "1",
                           "--variants", "paper,topk", "--out", str(tmp_path / "x"))  # fmt: skip
    assert code == 2 and "unknown variants ['topk']; choose from covariance_equal" in error
    code, error = _refused(capsys, study, "train", "--model", str(model), "--seed", "1",
                           "--scales", "{paper: 1}", "--out", str(tmp_path / "x"))  # fmt: skip
    assert code == 2 and "--scales takes JSON like" in error


def test_the_recipe_rule_needs_a_gain_and_no_loss_on_quality_or_density():
    study = _load_benchmark("recipe_study")
    read = lambda mcc, f1, dense: {  # noqa: E731
        f"bae.{m}": {"verdict": v} for m, v in (("mcc", mcc), ("f1", f1), ("dense", dense))
    }
    assert study.beats(read("better", "no difference", "no difference"))
    assert study.beats(read("no difference", "better", "better"))
    assert not study.beats(read("better", "worse", "better"))
    assert not study.beats(read("better", "better", "worse"))
    assert not study.beats(read("no difference", "no difference", "better"))
    assert study.beats(read("better", "too few points", "no difference"))  # F1 unread: not worse


def test_budget_curve_trains_each_family_per_budget_on_one_harvest(
    tiny_hf_llama_dir, tiny_corpus, tmp_path, capsys
):
    """``budget_curve``: each budget trains every family for exactly that many steps on the one
    harvest (its test tokens the same), reads it on test with KL, and a rerun with one more
    budget trains only that one."""
    curve = _load_benchmark("budget_curve")
    common = ["--dataset", str(tiny_corpus), "--model", str(tiny_hf_llama_dir),
              "--context-size", "32", "--max-sequences", "96", "--d-sae", "32", "--topk-k", "4",
              "--out", str(tmp_path)]  # fmt: skip
    curve.main([*common, "--steps", "6,3"])
    rows = json.loads((tmp_path / "curve.json").read_text())["rows"]
    assert [(r["steps"], r["family"]) for r in rows] == [
        (s, f) for s in (3, 6) for f in ("bae", "topk", "jumprelu")
    ]
    assert len({r["tokens"] for r in rows}) == 1
    for steps in (3, 6):  # SAELens names a final checkpoint by the samples it trained on
        finals = sorted(p.name for p in (tmp_path / f"steps-{steps}").rglob("final_*"))
        assert finals == [f"final_{steps * 256}"] * 3
    for row in rows:
        assert row["kl"] is not None and row["kl"] >= 0
        assert row["dense_fraction"] == row["dense"] / 32
        assert row["l0"] == 4 if row["family"] == "topk" else 0 <= row["l0"] <= 32
    first = (tmp_path / "curve.json").read_text()
    curve.main([*common, "--steps", "3,6,9"])
    again = json.loads((tmp_path / "curve.json").read_text())["rows"]
    assert again[:6] == json.loads(first)["rows"]
    assert [r["steps"] for r in again[6:]] == [9, 9, 9]
    code, error = _refused(capsys, curve, *common, "--steps", "6,x")
    assert code == 2 and "--steps takes step counts separated by commas, got '6,x'" in error
    code, error = _refused(capsys, curve, *common[:2], "--model", "no-such-model", "--steps", "2",
                           "--out", str(tmp_path / "other"))  # fmt: skip
    assert code == 2 and "Cannot load a model from 'no-such-model'" in error
    variant = tmp_path / "variant"  # a BAE variant alone, on the same harvest
    curve.main([*common[:-1], str(variant), "--steps", "3", "--families", "bae",
                "--bae-fields", '{"input_variance": null}'])  # fmt: skip
    rows = json.loads((variant / "curve.json").read_text())["rows"]
    assert [r["family"] for r in rows] == ["bae"] and rows[0]["tokens"] == again[0]["tokens"]
    (cfg,) = (variant / "steps-3").rglob("final_*/cfg.json")
    assert json.loads(cfg.read_text())["input_variance"] is None
    for flag, value, said in [
        ("--families", "bae,gated", "--families takes some of bae,topk,jumprelu, got bae,gated"),
        ("--bae-fields", "[1]", "--bae-fields takes a JSON object such as"),
        ("--bae-fields", '{"lr": 1}', "--bae-fields: lr is not a BAE config field"),
        ("--bae-fields", '{"d_sae": 3}', "--bae-fields: set d_sae through --d-sae"),
        ("--bae-fields", '{"recipe": "paper"}', "--bae-fields: recipe is not a BAE config field"),
        ("--bae-fields", '{"input_variance": "x"}', 'no BAE config takes {"input_variance": "x"}'),
        (
            "--bae-fields",
            '{"entropy_coefficient": 1}',
            "bae sets entropy_coefficient from its setting, not as fields",
        ),
    ]:
        code, error = _refused(capsys, curve, *common, "--steps", "3", flag, value)
        assert code == 2 and said in error
    code, error = _refused(capsys, curve, *common, "--steps", "3", "--families", "topk",
                           "--bae-fields", '{"input_variance": null}')  # fmt: skip
    assert code == 2 and "--bae-fields needs the bae family in --families" in error
    code, error = _refused(capsys, curve, *common, "--steps", "3", "--lr", "1e-3")
    assert code == 2 and "holds a curve run with other options; give another --out" in error
