"""Task vectors, the steering hook (run_with_hooks, hooks context, generate) and bae steer icl."""

from __future__ import annotations

import json

import matplotlib.image
import pytest
import torch
from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig

from sae_lens_bae import (
    BAE,
    BAEConfig,
    BAETrainingSAE,
    BAETrainingSAEConfig,
    steer,
    steering_hook,
    task_vector,
)
from sae_lens_bae.models import load_model
from sae_lens_bae.prompts import ICLTemplate, build_icl_prompts, encode_prompts, first_token_ids
from sae_lens_bae.steering import SteeredClassifier, label_accuracy, mean_difference

HOOK = "blocks.0.hook_resid_post"
# the tiny tokenizer knows only w3..w99: templates and label words are made of those
TEMPLATE = ICLTemplate(demonstration="w10 {sentence} w11 {label} w12 ", query="w10 {sentence} w11")


@pytest.fixture(scope="module")
def hf_model(tiny_hf_llama_dir):
    return load_model(tiny_hf_llama_dir)


def _bae(d_in: int = 8, d_sae: int = 32) -> BAE:
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=d_in, d_sae=d_sae))
    torch.nn.init.normal_(bae.b_dec)
    return bae


def test_task_vector_is_the_top_mean_code_difference_decoded():
    bae = _bae()
    pos, neg = torch.randn(200, 8) + 0.5, torch.randn(300, 8) - 0.5
    diff = bae.encode_bits(pos).mean(0) - bae.encode_bits(neg).mean(0)
    keep = diff.abs().topk(5).indices
    sparse = torch.zeros_like(diff)
    sparse[keep] = diff[keep]
    assert torch.allclose(task_vector(bae, pos, neg, top=5), sparse @ bae.W_dec, atol=1e-5)
    assert torch.allclose(task_vector(bae, pos, neg, top=None), diff @ bae.W_dec, atol=1e-5)
    # states scaled before encoding, the vector back in the states' units
    scaled = task_vector(bae, pos, neg, top=5, input_scale=2.0)
    assert torch.allclose(scaled, task_vector(bae, 2 * pos, 2 * neg, top=5) / 2, atol=1e-5)
    assert torch.allclose(mean_difference(pos, neg), pos.mean(0) - neg.mean(0), atol=1e-6)


def test_a_framed_bae_s_task_vector_is_its_decoded_difference_in_the_states_units():
    """With its input frame set (k, t), a BAE's task vector is the difference of what it decodes
    from the two mean codes: (diff W_dec + b_dec) / k - t, the shift and bias cancelling."""
    torch.manual_seed(0)
    bae = BAETrainingSAE(BAETrainingSAEConfig(d_in=8, d_sae=32, input_variance=1.0))
    torch.nn.init.normal_(bae.b_dec)
    with torch.no_grad():
        bae.input_scale.fill_(0.25)
        bae.input_shift.normal_()
    pos, neg = torch.randn(200, 8) + 0.5, torch.randn(300, 8) - 0.5
    means = [bae.encode_bits(x).mean(0, keepdim=True) for x in (pos, neg)]
    decoded = (bae.decode(means[0]) - bae.decode(means[1]))[0]
    assert torch.allclose(task_vector(bae, pos, neg, top=None), decoded, atol=1e-4)


def test_task_vector_for_an_sae_and_bad_input():
    torch.manual_seed(0)
    sae = StandardSAE(StandardSAEConfig(d_in=8, d_sae=16))
    torch.nn.init.normal_(sae.b_enc)
    pos, neg = torch.randn(50, 8), torch.randn(60, 8)
    diff = sae.encode(pos).mean(0) - sae.encode(neg).mean(0)
    assert torch.allclose(task_vector(sae, pos, neg, top=None), diff @ sae.W_dec, atol=1e-5)
    with pytest.raises(ValueError, match="d_in = 8"):
        task_vector(sae, torch.randn(5, 7), torch.randn(5, 7))
    with pytest.raises(ValueError, match="NaN"):
        task_vector(sae, torch.full((5, 8), float("nan")), neg)
    with pytest.raises(ValueError, match="top"):
        task_vector(sae, pos, neg, top=0)


def test_the_hook_changes_only_the_targeted_positions(tiny_llama):
    tokens = torch.randint(1, 100, (3, 10), generator=torch.Generator().manual_seed(0))
    vector = torch.randn(32)
    _, clean = tiny_llama.run_with_cache(tokens)
    with steer(tiny_llama, HOOK, vector, 3.0):
        _, steered = tiny_llama.run_with_cache(tokens)
    delta = steered[HOOK] - clean[HOOK]
    assert torch.allclose(delta[:, -1], (3.0 * vector).expand(3, -1), atol=1e-5)
    assert torch.equal(delta[:, :-1], torch.zeros_like(delta[:, :-1]))
    later = "blocks.1.hook_resid_post"  # causal: earlier positions never see the change
    assert torch.allclose(steered[later][:, :-1], clean[later][:, :-1], atol=1e-6)
    assert not torch.allclose(steered[later][:, -1], clean[later][:, -1])
    _, after = tiny_llama.run_with_cache(tokens)  # the hook is gone after the block
    assert torch.equal(after[HOOK], clean[HOOK])

    rows = torch.tensor([3, 5, 9])  # one position per row (right-padded prompts)
    hook = steering_hook(vector, 2.0, positions=rows)
    cache = {}
    tiny_llama.run_with_hooks(
        tokens,
        fwd_hooks=[(HOOK, hook), (HOOK, lambda act, **_: cache.__setitem__("a", act.clone()))],
    )
    changed = (cache["a"] - clean[HOOK]).abs().sum(-1) > 0
    expected = torch.zeros(3, 10, dtype=torch.bool)
    expected[torch.arange(3), rows] = True
    assert torch.equal(changed, expected)
    with pytest.raises(ValueError, match="Unknown hook"), steer(tiny_llama, HOOK + "t", vector):
        pass
    with pytest.raises(ValueError, match="size 31"):
        tiny_llama.run_with_hooks(tokens, fwd_hooks=[(HOOK, steering_hook(torch.randn(31)))])


def test_generate_with_steering(hf_model):
    model = hf_model
    final = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    target = int(model.W_U.norm(dim=0).argmax())  # the unembedding column with the largest norm
    prompt = torch.tensor([[1, 5, 6, 7]])
    kwargs = dict(max_new_tokens=4, do_sample=False, stop_at_eos=False, verbose=False)
    plain = model.generate(prompt, **kwargs)
    with steer(model, final, model.W_U[:, target].detach(), 1e4):
        steered = model.generate(prompt, **kwargs)
    assert steered[0, 4:].tolist() == [target] * 4  # every generated token steered
    assert torch.equal(model.generate(prompt, **kwargs), plain)  # and the hook removed after


@pytest.mark.parametrize("positions", [[2], [5], [1, 6], "per-row"])
def test_explicit_positions_steer_the_same_with_and_without_the_kv_cache(hf_model, positions):
    model = hf_model
    first = "blocks.0.hook_resid_post"  # later tokens read a steered position through attention
    vector = model.W_U[:, int(model.W_U.norm(dim=0).argmax())].detach()
    prompt = torch.tensor([[1, 5, 6, 7]])
    if positions == "per-row":
        positions = torch.tensor([5])  # a generated position, one per row
    outputs = []
    for cached in (False, True):
        kwargs = dict(max_new_tokens=4, do_sample=False, stop_at_eos=False, verbose=False,
                      use_past_kv_cache=cached)  # fmt: skip
        with steer(model, first, vector, 30.0, positions=positions):
            outputs.append(model.generate(prompt, **kwargs))
    plain = model.generate(prompt, max_new_tokens=4, do_sample=False, stop_at_eos=False,
                           verbose=False)  # fmt: skip
    assert torch.equal(outputs[0], outputs[1])  # the cache sees the position where it comes by
    assert not torch.equal(outputs[0], plain)  # and the position was steered


def test_steered_classifier_equals_a_full_forward(hf_model):
    template = TEMPLATE
    pairs = [(f"w{20 + i} w{40 + i}" + " w30" * (i % 3), ("w5", "w6")[i % 2]) for i in range(20)]
    prompts = build_icl_prompts(pairs, 0, 12, template=template)
    tokens, last = encode_prompts([p for p, _ in prompts], hf_model.tokenizer)
    ids = first_token_ids(hf_model.tokenizer, ["w5", "w6"])
    truth = torch.tensor([["w5", "w6"].index(y) for _, y in prompts])
    vector = torch.randn(32, generator=torch.Generator().manual_seed(0))
    classifier = SteeredClassifier(hf_model, tokens, last[:, 0], ids, truth, HOOK, batch_size=5)
    for strength in (0.0, 2.0, 8.0):
        full = label_accuracy(hf_model, tokens, last[:, 0], ids, truth, hook_name=HOOK,
                              vector=vector, strength=strength, batch_size=4)  # fmt: skip
        assert classifier.accuracy(vector, strength) == full


def _tiny_steer_config(tmp_path, model_dir, **changes):
    """A ``SteerICLConfig`` of seconds on the tiny model, with 80 labelled sentences of its
    vocabulary."""
    from sae_lens_bae.experiments.steer_icl import SteerICLConfig

    lines = ["label\tsentence"] + [f"{i % 2}\tw{20 + i % 50} w{40 + i % 37}" for i in range(80)]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    settings = dict(
        dataset=str(tmp_path / "train.tsv"),
        model=str(model_dir),
        label_words={"0": "w5", "1": "w6"},
        template=TEMPLATE,
        layer=0,
        shots=4,
        vector_prompts=16,
        eval_prompts=24,
        top=8,
        baselines=("standard",),
        steps=20,
        batch_size=64,
        strengths=(1.0, 4.0),
        out=tmp_path / "out",
    )
    return SteerICLConfig(**{**settings, **changes})


def test_steer_icl_on_the_tiny_model(tiny_hf_llama_dir, tmp_path):
    from sae_lens_bae.experiments import steer_icl

    cfg = _tiny_steer_config(tmp_path, tiny_hf_llama_dir)
    summary = steer_icl.run(cfg, progress=False)
    rows = {row["model"]: row for row in summary["models"]}
    assert set(rows) == {"bae", "standard", "mean_difference"}
    swept = sorted(rows["bae"]["accuracy"], key=float)
    # the given strengths, then doublings of the largest while some vector has not turned down
    assert swept[:3] == ["0", "1.0", "4.0"]
    assert [float(s) for s in swept[3:]] == [4.0 * 2**n for n in range(1, len(swept) - 2)]
    assert float(swept[-1]) <= steer_icl.STRENGTH_CAP
    before_last = [{s: row["accuracy"][s] for s in swept[:-1]} for row in rows.values()]
    if len(swept) > 3:  # it went on only while some vector had not turned down
        assert not all(steer_icl.turned_down(by_strength) for by_strength in before_last)
    for row in rows.values():
        assert sorted(row["accuracy"], key=float) == swept
        assert row["accuracy"]["0"] == summary["unsteered_0_shot_accuracy"]
        assert row["best_accuracy"] == max(row["accuracy"].values())
        assert row["peaked"] == steer_icl.turned_down(row["accuracy"])
        assert row["peaked"] or float(swept[-1]) * 2 > steer_icl.STRENGTH_CAP
    assert rows["mean_difference"]["cosine_to_mean_difference"] == pytest.approx(1.0)
    saved = json.loads((tmp_path / "out" / "steer.json").read_text())
    assert saved["models"] == summary["models"]
    assert "| bae |" in (tmp_path / "out" / "steer.md").read_text()
    assert matplotlib.image.imread(tmp_path / "out" / "steer.png").shape[0] > 100
    with pytest.raises(ValueError, match="labelled sentences"):
        too_many = _tiny_steer_config(tmp_path, tiny_hf_llama_dir, eval_prompts=100)
        steer_icl.run(too_many, progress=False)


def test_steer_icl_refuses_a_k_above_d_sae_before_gathering_prompts(
    tiny_hf_llama_dir, tmp_path, count_calls
):
    from sae_lens_bae.experiments import steer_icl

    gathered = count_calls(steer_icl, "prompt_states")
    # SAELens' k = 100 against d_sae = 2 x the tiny model's 32
    cfg = _tiny_steer_config(tmp_path, tiny_hf_llama_dir, baselines=("topk",), expansion=2)
    with pytest.raises(ValueError, match=r"k must be a whole number in \[1, d_sae\]"):
        steer_icl.run(cfg, progress=False)
    assert gathered == []


def test_steer_icl_sweeps_past_the_given_strengths_until_every_vector_turns_down(
    tiny_hf_llama_dir, tmp_path, monkeypatch
):
    """An accuracy still rising at the largest given strength is not the vector's best: the
    sweep doubles the strength until it falls (here after 16), and reads the best inside."""
    from sae_lens_bae.experiments import steer_icl

    def rising_to_16(self, vector=None, strength=0.0):  # noqa: ARG001
        return {0.0: 0.1, 1.0: 0.2, 4.0: 0.3, 8.0: 0.4, 16.0: 0.6}.get(float(strength), 0.35)

    monkeypatch.setattr(steer_icl.SteeredClassifier, "accuracy", rising_to_16)
    summary = steer_icl.run(_tiny_steer_config(tmp_path, tiny_hf_llama_dir), progress=False)
    for row in summary["models"]:
        assert list(row["accuracy"]) == ["0", "1.0", "4.0", "8.0", "16.0", "32.0"]
        assert (row["best_strength"], row["best_accuracy"], row["peaked"]) == (16.0, 0.6, True)
    assert "α=32.0" in (tmp_path / "out" / "steer.md").read_text()


def test_the_sweep_stops_at_its_cap_and_says_the_best_is_at_the_edge():
    from sae_lens_bae.experiments.steer_icl import STRENGTH_CAP, sweep_strengths

    calls = []

    def accuracy(name, strength):
        calls.append((name, strength))
        return strength / 1000 if name == "rising" else 0.5 - abs(strength - 2) / 100

    results = sweep_strengths(accuracy, ["rising", "peaks_at_2"], [1.0, 2.0, 4.0], 0.0, False)
    strengths = [float(s) for s in results["rising"]]
    assert (
        strengths == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0] and strengths[-1] == STRENGTH_CAP
    )
    assert len(calls) == 2 * 7  # every vector at every strength, each once
    assert results["peaks_at_2"]["64.0"] < results["peaks_at_2"]["2.0"]
    stopped = sweep_strengths(accuracy, ["peaks_at_2"], [1.0, 2.0, 4.0], 0.0, False)
    assert list(stopped["peaks_at_2"]) == ["0", "1.0", "2.0", "4.0"]  # turned down: no more
