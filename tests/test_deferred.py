"""A training loop's bookkeeping without waits for the device (``training.deferred``)."""

from __future__ import annotations

import torch

from sae_lens_bae.training import deferred
from sae_lens_bae.training.deferred import (
    LossHistory,
    fits_on_device,
    progress_bits,
    sets_on_device,
)


def test_the_history_in_blocks_equals_the_history_a_step_at_a_time():
    """Blocks of 3 steps, members that drop out midway, a term that appears later: every
    member's list is what reading each step at once gives, in order."""
    generator = torch.Generator().manual_seed(0)
    history = LossHistory(3, block=3)
    expected: list[dict[str, list[float]]] = [{} for _ in range(3)]
    schedule = [[0, 1, 2]] * 5 + [[0, 2]] * 4 + [[2]] * 2
    for step, members in enumerate(schedule):
        terms = {"a": torch.rand(len(members), generator=generator)}
        if step >= 7:
            terms["b"] = torch.rand(len(members), generator=generator).double()
        history.record(members, terms)
        for name, values in terms.items():
            for g, value in zip(members, values.tolist(), strict=True):
                expected[g].setdefault(name, []).append(value)
    history.flush()
    assert history.histories == expected
    assert [len(h["a"]) for h in history.histories] == [9, 5, 11]
    assert [len(h.get("b", [])) for h in history.histories] == [2, 0, 4]


def test_sets_move_to_a_cuda_device_only_within_its_share_of_free_memory(monkeypatch):
    """The rule decides before any copy, so it runs without a GPU: a tensor given twice (a
    stack's seeds or restarts of one set) counts once; beyond DEVICE_SHARE of the free memory
    the sets stay where they are."""
    a, b = torch.ones(64, 8), torch.zeros(64, 8)  # 2048 bytes each
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _device=None: (10000, 32000))
    assert deferred.DEVICE_SHARE == 0.25  # 2500 bytes of the 10000 free
    assert fits_on_device([a, a, a], "cuda")
    assert not fits_on_device([a, b], "cuda")
    kept = sets_on_device([a, b], "cuda")
    assert kept[0] is a and kept[1] is b
    assert fits_on_device([a, b], "cpu") and not fits_on_device([a], "meta")
    copies = []
    original = torch.Tensor.to
    monkeypatch.setattr(
        torch.Tensor, "to", lambda x, *args, **kw: copies.append(x) or original(x, *args, **kw)
    )
    on_cpu = sets_on_device([a, b, a], "cpu")
    monkeypatch.setattr(torch.Tensor, "to", original)
    assert len(copies) == 2  # a once, b once
    assert on_cpu[0] is on_cpu[2] and torch.equal(on_cpu[0], a) and torch.equal(on_cpu[1], b)


def test_the_progress_bar_shows_one_members_bits_or_the_range_of_several():
    assert progress_bits([511.96]) == "512.0"
    assert progress_bits([3.04, 8.26, 5.0]) == "3.0-8.3"
