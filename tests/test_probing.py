"""The judge-free feature measures: k-sparse probing (SAEBench's definition) and both of the
paper's `activated` counts."""

import pytest
import torch

from sae_lens_bae.features.probing import k_sparse_probe_accuracy, sentence_features, top_latents
from sae_lens_bae.features.records import FeatureRecords
from sae_lens_bae.features.statistics import TABLE_1_MIN_RECORDS


def _planted(labels: torch.Tensor, d_sae: int = 10) -> torch.Tensor:
    """Class 1 turns latents 3 and 7 on, class 0 latent 5; every other latent stays off."""
    x = torch.zeros(len(labels), d_sae)
    x[labels == 1, 3] = x[labels == 1, 7] = 1.0
    x[labels == 0, 5] = 1.0
    return x


def test_probing_accuracy_is_the_hand_computed_one_on_planted_class_directions():
    generator = torch.Generator().manual_seed(0)
    train_y = torch.randint(0, 2, (200,), generator=generator)
    test_y = torch.randint(0, 2, (100,), generator=generator)
    shown = test_y.clone()
    flipped = torch.randperm(100, generator=generator)[:13]
    shown[flipped] = 1 - shown[flipped]  # 13 held-out sentences look like the other class
    train, test = _planted(train_y), _planted(shown)
    # gaps: latents 3, 5, 7 differ by 1, the rest by 0; ties go to the lower index
    assert top_latents(train, train_y, 3).tolist() == [3, 5, 7]
    assert top_latents(train, train_y, 1).tolist() == [3]
    accuracy = k_sparse_probe_accuracy(train, train_y, test, test_y, ks=(1, 5, 20))
    by_hand = (shown == test_y).float().mean().item()  # the probe follows the planted pattern
    assert by_hand == pytest.approx(0.87)
    assert accuracy == {1: pytest.approx(by_hand), 5: pytest.approx(by_hand),
                        20: pytest.approx(by_hand)}  # fmt: skip


def test_the_latents_are_chosen_on_the_probes_training_sentences_only():
    """Held-out sentences that reward another latent do not move the choice or the probe."""
    generator = torch.Generator().manual_seed(1)
    train_y = torch.randint(0, 2, (120,), generator=generator)
    test_y = torch.randint(0, 2, (60,), generator=generator)
    train, test = _planted(train_y), _planted(test_y)
    decoy = test.clone()
    decoy[:, 9] = test_y.float() * 5  # a latent that separates the held-out classes alone
    assert k_sparse_probe_accuracy(train, train_y, test, test_y, ks=(1,)) == {1: 1.0}
    assert k_sparse_probe_accuracy(train, train_y, decoy, test_y, ks=(1,)) == {1: 1.0}
    with pytest.raises(ValueError, match="one class only"):
        top_latents(train, torch.ones(120, dtype=torch.long), 1)


def test_both_activated_definitions_on_hand_made_records():
    """Algorithm 1 counts a feature with at least n_I + 1 = 6 records; Table 1's caption one
    with more than 8."""
    counts = {0: 5, 1: 6, 2: 8, 3: 9, 4: 30}  # records per feature; feature 5 has none
    features = torch.tensor([f for f, n in counts.items() for _ in range(n)])[:, None]
    n = len(features)
    records = FeatureRecords(
        features=features, magnitudes=torch.ones(n, 1), token_positions=torch.zeros(n, 2),
        token_ids=torch.zeros(n, dtype=torch.long), d_sae=6, magnitude="raw",
    )  # fmt: skip
    assert records.counts().tolist() == [5, 6, 8, 9, 30, 0]
    assert records.activated(5) == 4  # 6, 8, 9 and 30 records
    assert records.activated(TABLE_1_MIN_RECORDS) == 2  # 9 and 30


def test_sentence_features_average_each_sentences_codes_over_its_tokens_after_bos(tiny_llama):
    """Fed the rows of ``prompt_states`` (right-padded sentences), each sentence's vector is the
    mean of its own tokens' codes, as one forward pass of that sentence alone gives them."""
    from sae_lens_bae import BAE, BAEConfig
    from sae_lens_bae.activations import prompt_states

    torch.manual_seed(0)
    sae = BAE(BAEConfig(d_in=tiny_llama.cfg.d_model, d_sae=16))
    hook = "blocks.0.hook_resid_post"
    sentences = [torch.tensor([1, 5, 6, 7]), torch.tensor([1, 9])]
    padded = torch.tensor([[1, 5, 6, 7], [1, 9, 1, 1]])  # right-padded with BOS
    states, where, _ = prompt_states(tiny_llama, padded, torch.tensor([3, 1]), hook, progress=False)
    assert where.tolist() == [[0, 1], [0, 2], [0, 3], [1, 1]]
    features = sentence_features(sae, states, where[:, 0], 2, input_scale=2.0)
    for row, tokens in zip(features, sentences, strict=True):
        _, cache = tiny_llama.run_with_cache(tokens[None], names_filter=hook)
        expected = sae.encode(cache[hook][0, 1:] * 2.0).mean(0)
        torch.testing.assert_close(row, expected)


class _SignSplit:
    """An SAE stand-in whose latents are relu(x) and relu(-x)."""

    W_dec = torch.zeros(4, 2)

    def encode(self, x):
        return torch.cat([x, -x], dim=1).clamp(min=0)


def test_each_split_is_probed_on_its_own_sentences_and_ood_reads_the_next_task(monkeypatch):
    """Task a writes its label along +x0, task b along -x0. Each task's probe reads its own
    held-out half perfectly (test); on OOD it reads the other task's held-out half, where the
    direction is reversed, and gets every sentence wrong: OOD never copies test. One task: no
    OOD probe."""
    from types import SimpleNamespace

    from sae_lens_bae.experiments import compare_read

    def sentence(task, i):
        return (f"{task} {i}", "pos" if i % 2 else "neg")

    def states_of(_lm, texts, _last, _hook, **_options):
        signs = [
            (1.0 if int(t.split()[1]) % 2 else -1.0) * (1 if t[0] == "a" else -1) for t in texts
        ]
        states = torch.tensor([[s, 0.0] for s in signs])
        where = torch.arange(len(texts))[:, None]
        return states, where, None

    monkeypatch.setattr(
        compare_read, "encode_prompts", lambda texts, _tok: (texts, torch.zeros(len(texts), 1))
    )
    monkeypatch.setattr(compare_read, "prompt_states", states_of)
    tasks = {t: [sentence(t, i) for i in range(40)] for t in ("a", "b")}
    data = SimpleNamespace(hook="h", scales={"h": 1.0})
    lm = SimpleNamespace(tokenizer=None)
    found = compare_read.probe_reads({"m": _SignSplit()}, data, tasks, lm, seed=0, replicates=10)
    for task in ("a", "b"):
        test, ood = found["m"]["test"][task], found["m"]["ood"][task]
        assert test["sentences"] == ood["sentences"] == 20  # each task's held-out half
        assert all(a == 1.0 for a in test["accuracy"].values())
        assert all(a == 0.0 for a in ood["accuracy"].values())
        assert all(e == 0.0 for e in test["standard_error"].values())
        assert len(test["replicates"]["5"]) == 10
    alone = compare_read.probe_reads({"m": _SignSplit()}, data, {"a": tasks["a"]}, lm, 0, 10)
    assert alone["m"]["ood"] == {} and alone["m"]["test"]["a"]["accuracy"]["1"] == 1.0
