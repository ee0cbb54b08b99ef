"""The bad-input matrix of the public functions: every bad input ends in one exception whose
message says what was wrong and what to do (the CLI's matrix is in test_cli.py), and a write
interrupted by a full disk leaves what was already written intact."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import sae_lens_bae.activations.cache as cache_module
from sae_lens_bae import (
    ActivationCache,
    code_entropy,
    compress,
    decompress,
    harvest_activations,
    load_model,
    load_sae,
    train_sae,
)
from sae_lens_bae.activations import META_FILE, check_hooks
from sae_lens_bae.data import load_token_dataset
from sae_lens_bae.experiments.quickstart import QuickstartConfig
from sae_lens_bae.features import FeatureRecords, top_k_records
from sae_lens_bae.saes.bae import BAE, BAEConfig, BAETrainingSAEConfig


def _bae(seed: int = 0) -> BAE:
    torch.manual_seed(seed)
    return BAE(BAEConfig(d_in=8, d_sae=32))


def _nan(n: int = 64) -> torch.Tensor:
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
    x[3, 2] = float("nan")
    return x


def _saved(tmp: Path, name: str, change: Callable[[Path], object]) -> Path:
    folder = tmp / name
    _bae().save_model(folder)
    change(folder)
    return folder


def _train(x: torch.Tensor, **kwargs: object) -> object:
    cfg = BAETrainingSAEConfig(d_in=8, d_sae=32)
    return train_sae(x, cfg, training_samples=128, batch_size=32, **kwargs)


def _records(rows: int, positions: int) -> object:
    return top_k_records(_bae(), torch.randn(rows, 8), torch.zeros(positions, 2, dtype=torch.long),
                         torch.zeros(rows, dtype=torch.long), "raw")  # fmt: skip


def _bytes(tmp: Path, n: int) -> Path:
    path = tmp / f"bytes{n}.safetensors"
    path.write_bytes(os.urandom(n))
    return path


def _other_prior(bae: BAE, x: torch.Tensor) -> object:
    stored = compress(bae, x, prior=torch.full((32,), 0.3))
    return decompress(bae, stored, prior=torch.full((32,), 0.7))  # another rounding


def cases(tmp: Path, tiny_llama: object) -> list[tuple[str, Callable[[], object], str]]:
    """(entry point and bad input, the call, what the error says)."""
    bae = _bae()
    return [
        ("BAE.encode wrong d_in", lambda: bae.encode(torch.randn(4, 5)),
         "last dimension d_in=8, got shape (4, 5)"),
        ("BAE.encode NaN", lambda: bae.encode(_nan()), "1 NaN/Inf values"),
        ("train_sae wrong d_in", lambda: _train(torch.randn(64, 5)),
         "activations must be [n, d_in=8], got (64, 5)"),
        ("train_sae NaN", lambda: _train(_nan()), "1 NaN/Inf values"),
        ("train_sae resume, no folder", lambda: _train(torch.randn(64, 8), resume=True),
         "resume=True needs the checkpoint_dir"),
        ("train_sae resume, nothing saved", lambda: _train(torch.randn(64, 8), resume=True,
                                                           checkpoint_dir=tmp),
         "no complete checkpoint under"),
        ("code_entropy wrong d_in", lambda: code_entropy(bae, torch.randn(9, 3)),
         "last dimension d_in=8, got shape (9, 3)"),
        ("code_entropy NaN", lambda: code_entropy(bae, _nan()), "1 NaN/Inf values"),
        ("top_k_records rows mismatch", lambda: _records(10, 7),
         "10 activation rows but 7 token positions"),
        ("compress wrong d_in", lambda: compress(bae, torch.randn(4, 6)),
         "h0 must be [n, 8] (the BAE's d_in), got (4, 6)"),
        ("decompress another prior", lambda: _other_prior(bae, torch.randn(16, 8)),
         "compressed with another prior"),
        ("load_sae no cfg.json", lambda: load_sae(tmp), "No cfg.json in"),
        ("load_sae malformed cfg.json",
         lambda: load_sae(_saved(tmp, "bad", lambda f: (f / "cfg.json").write_text("{ nope"))),
         "is not valid JSON"),
        ("load_sae foreign architecture",
         lambda: load_sae(_saved(tmp, "foreign", lambda f: (f / "cfg.json").write_text(
             json.dumps({"architecture": "martian", "d_in": 8})))),
         "names the architecture 'martian', which no imported package registers"),
        ("load_sae truncated weights",
         lambda: load_sae(_saved(tmp, "cut", lambda f: (f / "sae_weights.safetensors")
                                 .write_bytes(b"abc"))),
         "is not a readable safetensors file"),
        ("load_sae missing weights",
         lambda: load_sae(_saved(tmp, "gone", lambda f: (f / "sae_weights.safetensors")
                                 .unlink())),
         "No sae_weights.safetensors in"),
        ("load_token_dataset missing corpus",
         lambda: load_token_dataset(tmp / "missing.txt", None, 16), "No such file or folder"),
        ("load_model unknown name", lambda: load_model("no-such-model"),
         "unknown model name 'no-such-model'"),
        ("check_hooks unknown hook", lambda: check_hooks(tiny_llama, ["blocks.7.hook_resid_post"]),
         "Unknown hook name(s) ['blocks.7.hook_resid_post']"),
        ("ActivationCache not a cache", lambda: ActivationCache.load(tmp),
         "is not an activation cache"),
        ("FeatureRecords.load random bytes", lambda: FeatureRecords.load(_bytes(tmp, 300)),
         "is not a feature records file (SafetensorError"),
        ("FeatureRecords.load empty file", lambda: FeatureRecords.load(_bytes(tmp, 0)),
         "is not a feature records file"),
        ("FeatureRecords.load another safetensors file",
         lambda: FeatureRecords.load(_saved(tmp, "weights", str)
                                     / "sae_weights.safetensors"),
         "is not a feature records file (KeyError"),
        ("FeatureRecords.load missing", lambda: FeatureRecords.load(tmp / "none.safetensors"),
         "no feature records at"),
        ("QuickstartConfig negative steps", lambda: QuickstartConfig(steps=-5),
         "steps must be at least 1, got -5"),
        ("QuickstartConfig NaN fraction", lambda: QuickstartConfig(held_out_fraction=float("nan")),
         "held_out_fraction must be in (0.0, 1.0), got nan"),
    ]  # fmt: skip


CASE_NAMES = [name for name, _, _ in cases(Path("/nonexistent"), None)]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_input_gives_one_clear_error(name, tmp_path, tiny_llama):
    _, call, message = next(case for case in cases(tmp_path, tiny_llama) if case[0] == name)
    with pytest.raises((ValueError, FileNotFoundError)) as error:
        call()
    text = str(error.value)
    assert message in text and "\n" not in text, text


def test_disk_full_while_writing_a_shard_keeps_the_done_shards(tiny_llama, tmp_path,
                                                              monkeypatch):  # fmt: skip
    tokens = torch.randint(1, 100, (12, 16), generator=torch.Generator().manual_seed(0))
    hook = "blocks.0.hook_resid_post"
    written = []

    def disk_full_on_third(tensors, path, *args, **kwargs):
        if len(written) == 2:
            Path(path).write_bytes(b"half a shard")
            raise OSError(28, "No space left on device")
        written.append(path)
        return save_file(tensors, path, *args, **kwargs)

    monkeypatch.setattr(cache_module, "save_file", disk_full_on_third)
    with pytest.raises(OSError, match="No space left"):
        harvest_activations(tiny_llama, tokens, [hook], tmp_path, shard_sequences=4,
                            batch_size=4, progress=False)  # fmt: skip
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == [META_FILE, "shard_00000.safetensors",
                                            "shard_00001.safetensors"]  # fmt: skip
    assert json.loads((tmp_path / META_FILE).read_text())["n_shards_done"] == 2
    with pytest.raises(ValueError, match="did not finish \\(2 of 3 shards\\); run harvest_"):
        ActivationCache.load(tmp_path)
    resumed = harvest_activations(tiny_llama, tokens, [hook], tmp_path, shard_sequences=4,
                                  batch_size=4, progress=False)  # fmt: skip
    fresh = harvest_activations(tiny_llama, tokens, [hook], tmp_path / "fresh",
                                shard_sequences=4, batch_size=4, progress=False)  # fmt: skip
    assert torch.equal(resumed.activations(hook), fresh.activations(hook))


def test_a_ranged_field_refuses_every_value_outside_its_range():
    """``checks.ranged``: closed and open bounds, one side or both; NaN and a bool are never in
    a range, None (an optional field left out) always passes."""
    from dataclasses import dataclass

    from sae_lens_bae.checks import check_ranges, ranged

    @dataclass
    class Settings:
        steps: int = ranged(10, low=1)
        fraction: float = ranged(0.5, above=0.0, below=1.0)
        rate: float | None = ranged(None, above=0.0)
        cap: float = ranged(1.0, high=2.0)
        beta: float = ranged(0.5, low=0.0, below=1.0)

        def __post_init__(self) -> None:
            check_ranges(self)

    Settings(steps=1, fraction=0.999, rate=1e-9, cap=2.0, beta=0.0)
    refused = [
        ({"steps": 0}, "steps must be at least 1, got 0"),
        ({"fraction": 1.0}, "fraction must be in (0.0, 1.0), got 1.0"),
        ({"fraction": float("nan")}, "fraction must be in (0.0, 1.0), got nan"),
        ({"rate": 0.0}, "rate must be above 0.0, got 0.0"),
        ({"cap": 2.5}, "cap must be at most 2.0, got 2.5"),
        ({"beta": 1.0}, "beta must be in [0.0, 1.0), got 1.0"),
        ({"steps": True}, "steps must be a number, got True"),
        ({"steps": "5"}, "steps must be a number, got '5'"),
    ]
    for change, message in refused:
        with pytest.raises(ValueError) as error:
            Settings(**change)
        assert str(error.value) == message
