"""The corrupt-file matrix: every loader of a file the package writes, against every way such a
file goes bad (empty, cut short, random bytes, another format, our own format without its
fields). Each ends in one line that names the file and says what to do, and leaves the file as
it was."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sae_lens_bae import BAE, BAEConfig, load_sae
from sae_lens_bae.activations import ActivationCache
from sae_lens_bae.experiments.synthetic import run_grid
from sae_lens_bae.experiments.synthetic_grids import GRIDS
from sae_lens_bae.features import FeatureRecords, top_k_records
from sae_lens_bae.stacks import train_stacked_baes
from sae_lens_bae.training.checkpoints import check_resumable, mark_complete


def _records(folder: Path) -> tuple[Path, Callable[[], object]]:
    bae = BAE(BAEConfig(d_in=4, d_sae=8))
    records = top_k_records(bae, torch.randn(6, 4), torch.zeros(6, 2, dtype=torch.long),
                            torch.arange(6), "raw", k=2)  # fmt: skip
    records.save(folder / "records.safetensors")
    return folder / "records.safetensors", lambda: FeatureRecords.load(
        folder / "records.safetensors"
    )


def _sae_config(folder: Path) -> tuple[Path, Callable[[], object]]:
    BAE(BAEConfig(d_in=4, d_sae=8)).save_model(folder / "bae")
    return folder / "bae" / "cfg.json", lambda: load_sae(folder / "bae")


def _sae_weights(folder: Path) -> tuple[Path, Callable[[], object]]:
    BAE(BAEConfig(d_in=4, d_sae=8)).save_model(folder / "bae")
    return folder / "bae" / "sae_weights.safetensors", lambda: load_sae(folder / "bae")


def _cache_index(folder: Path) -> tuple[Path, Callable[[], object]]:
    (folder / "cache").mkdir()
    meta = {"complete": True, "n_shards": 1, "hooks": ["h"], "n_sequences": 1,
            "shard_sequences": 1, "context_size": 2, "drop_bos": False}  # fmt: skip
    (folder / "cache" / "activations.json").write_text(json.dumps(meta))
    return folder / "cache" / "activations.json", lambda: ActivationCache.load(folder / "cache")


def _cache_shard(folder: Path) -> tuple[Path, Callable[[], object]]:
    from safetensors.torch import save_file

    _cache_index(folder)
    save_file({"tokens": torch.zeros(1, 2, dtype=torch.long)},
              str(folder / "cache" / "shard_00000.safetensors"))  # fmt: skip
    return folder / "cache" / "shard_00000.safetensors", lambda: ActivationCache.load(
        folder / "cache"
    ).tokens()


def _checkpoint_marker(folder: Path) -> tuple[Path, Callable[[], object]]:
    (folder / "ckpt").mkdir()
    mark_complete(folder / "ckpt", n_training_samples=8, global_batch_size=4)
    run = {"global_batch_size": 4, "world_size": 1}
    return folder / "ckpt" / "checkpoint_complete.json", lambda: check_resumable(
        folder / "ckpt", run
    )


def _stacked_state(folder: Path) -> tuple[Path, Callable[[], object]]:
    from sae_lens_bae.saes.bae import BAETrainingSAEConfig

    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    cfg = BAETrainingSAEConfig(d_in=4, d_sae=8)
    run = dict(training_samples=4 * 16, batch_size=16, progress=False, checkpoint=folder / "st")
    train_stacked_baes([x], cfg, **run)
    return folder / "st" / "stacked_state.pt", lambda: train_stacked_baes([x], cfg, **run)


def _synthetic_results(folder: Path) -> tuple[Path, Callable[[], object]]:
    preset = GRIDS["test"]
    (folder / "syn").mkdir()
    (folder / "syn" / "synthetic.json").write_text(json.dumps({"preset": {}, "results": []}))
    return folder / "syn" / "synthetic.json", lambda: run_grid(preset, folder / "syn",
                                                                progress=False)  # fmt: skip


def _comsem_cache(folder: Path) -> tuple[Path, Callable[[], object]]:
    from sae_lens_bae.comsem.cache import ReplyCache

    cache = ReplyCache(folder / "replies.sqlite")
    cache.put("k", {"model": "m"}, {"text": "a reply"})
    cache.close()
    return folder / "replies.sqlite", lambda: len(ReplyCache(folder / "replies.sqlite"))


def _comsem_features(folder: Path) -> tuple[Path, Callable[[], object]]:
    from sae_lens_bae.dashboard.pages import comsem_results

    rows = [{"feature": f, "explanation": "dates" * f, "score": 0.5} for f in range(7)]
    (folder / "features.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder / "features.jsonl", lambda: comsem_results(folder)


def _train_sae_checkpoint(name: str) -> Callable[[Path], tuple[Path, Callable[[], object]]]:
    """A file ``name`` of the checkpoint ``train_sae`` resumes from (SAELens' or ours)."""

    def make(folder: Path) -> tuple[Path, Callable[[], object]]:
        from sae_lens_bae.saes.bae import BAETrainingSAEConfig
        from sae_lens_bae.training import train_sae

        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        cfg = BAETrainingSAEConfig(d_in=4, d_sae=8)
        run = dict(training_samples=64, batch_size=16, checkpoint_dir=folder / "ckpt")
        train_sae(x, cfg, n_checkpoints=0, save_final_checkpoint=True, **run)
        (path,) = (folder / "ckpt").rglob(name)
        return path, lambda: train_sae(x, cfg, resume=True, **run)

    return make


def _finished_transcoder(folder: Path) -> tuple[Path, Callable[[], object]]:
    from sae_lens_bae.training import train_transcoder

    x, y = torch.randn(2, 64, 4, generator=torch.Generator().manual_seed(0))
    run = dict(training_samples=32, batch_size=16, progress=False, checkpoint=folder / "t.pt")
    train_transcoder(x, y, 8, **run)
    return folder / "t.pt", lambda: train_transcoder(x, y, 8, **run)


@functools.cache
def _finished_test_grid() -> Path:
    """A folder where the ``test`` grid ran to the end (made once, copied by each case)."""
    folder = Path(tempfile.mkdtemp()) / "syn"
    run_grid(GRIDS["test"], folder, progress=False)
    return folder


def _synthetic_dynamics(folder: Path) -> tuple[Path, Callable[[], object]]:
    from sae_lens_bae.experiments.synthetic_report import DYNAMICS

    shutil.copytree(_finished_test_grid(), folder / "syn")
    return folder / "syn" / DYNAMICS, lambda: run_grid(
        GRIDS["test"], folder / "syn", progress=False
    )


def _gathered_states(folder: Path) -> tuple[Path, Callable[[], object]]:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from sae_lens_bae.activations.states import gather_states

    cfg = HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_head=4, d_vocab=20,
                                  act_fn="relu", d_mlp=16)  # fmt: skip
    model = HookedTransformer(cfg)
    tokens, positions = torch.randint(0, 20, (4, 6)), torch.tensor([[1, 3]]).expand(4, -1)
    call = (model, tokens, ["blocks.0.hook_resid_post"], positions)
    gather_states(*call, progress=False, keep=folder / "states.pt")
    return folder / "states.pt", lambda: gather_states(
        *call, progress=False, keep=folder / "states.pt"
    )


def _compressed_states(folder: Path) -> tuple[Path, Callable[[], object]]:
    from sae_lens_bae.compression import CompressedStates, compress

    bae = BAE(BAEConfig(d_in=4, d_sae=8))
    codes = compress(bae, torch.randn(16, 4), prior=torch.full((8,), 0.3))
    codes.save(folder / "codes.safetensors")
    return folder / "codes.safetensors", lambda: CompressedStates.load(folder / "codes.safetensors")


def _comsem_template(folder: Path) -> tuple[Path, Callable[[], object]]:
    from importlib import resources

    from sae_lens_bae.comsem.prompts import load_templates

    packaged = resources.files("sae_lens_bae.comsem").joinpath("templates", "judge.json")
    (folder / "judge.json").write_text(packaged.read_text())
    return folder / "judge.json", lambda: load_templates(folder)


def _text_corpus(folder: Path) -> tuple[Path, Callable[[], object]]:
    from sae_lens_bae.data import iter_texts

    rows = [{"text": f"sentence number {i} " * (i % 5 + 1)} for i in range(9)]
    (folder / "texts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder / "texts.jsonl", lambda: list(iter_texts(str(folder / "texts.jsonl")))


def _labelled_sentences(folder: Path) -> tuple[Path, Callable[[], object]]:
    from sae_lens_bae.data import load_labelled_sentences

    rows = [{"sentence": f"w{i} " * (i % 4 + 1), "label": i % 2} for i in range(9)]
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder / "train.jsonl", lambda: load_labelled_sentences(str(folder / "train.jsonl"))


def _activation_store_state(folder: Path) -> tuple[Path, Callable[[], object]]:
    """The state ``bae train --resume`` reads back into its activation store (checked before the
    store is touched, so a bare store reads it here)."""
    from safetensors.torch import save_file

    from sae_lens_bae.activations.store import ResumableActivationsStore

    state = {
        "mixing_storage": torch.zeros(4, 2),
        "mixing_serving": torch.zeros(4, 2),
        "mixing_rng": torch.Generator().get_state(),
        "n_dataset_processed": torch.tensor(0),
    }
    save_file(state, str(folder / "activations_store_state.safetensors"))
    store = object.__new__(ResumableActivationsStore)
    path = folder / "activations_store_state.safetensors"
    return path, lambda: store.load(str(path))


LOADERS = {
    "feature records": _records,
    "saved SAE cfg.json": _sae_config,
    "saved SAE weights": _sae_weights,
    "activation cache index": _cache_index,
    "activation cache shard": _cache_shard,
    "checkpoint marker": _checkpoint_marker,
    "stacked training checkpoint": _stacked_state,
    "synthetic results": _synthetic_results,
    "synthetic dynamics": _synthetic_dynamics,
    "ComSem reply cache": _comsem_cache,
    "ComSem features (dashboard)": _comsem_features,
    "training loss history": _train_sae_checkpoint("history.json"),
    "training checkpoint weights": _train_sae_checkpoint("sae_weights.safetensors"),
    "training checkpoint optimiser": _train_sae_checkpoint("trainer_state.pt"),
    "training checkpoint activation scaler": _train_sae_checkpoint("activation_scaler.json"),
    "finished transcoder": _finished_transcoder,
    "gathered states": _gathered_states,
    "activation store state": _activation_store_state,
    "compressed states": _compressed_states,
    "ComSem template": _comsem_template,
    "text corpus (JSONL)": _text_corpus,
    "labelled sentences (JSONL)": _labelled_sentences,
}


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: max(1, len(data) // 2)])


def _noise(path: Path) -> None:
    path.write_bytes(os.urandom(512))


def _other_format(path: Path) -> None:
    """A file of the other kind: JSON where a binary file belongs, binary where JSON does."""
    binary = path.suffix in (".safetensors", ".pt")
    path.write_bytes(b'{"a": 1}' if binary else b"\x00\x01PK\x03\x04binary")


def _other_version(path: Path) -> None:
    """Our own kind of file, without what this version reads from it."""
    if path.suffix == ".json":
        path.write_text(json.dumps({"version": 0}))
    elif path.suffix == ".pt":
        torch.save({"version": 0}, path)
    else:
        from safetensors.torch import save_file

        save_file({"unrelated": torch.zeros(2)}, str(path))


CORRUPTIONS = {"empty": _empty, "cut short": _cut, "random bytes": _noise,
               "another format": _other_format, "another version": _other_version}  # fmt: skip


LEGITIMATE = {("ComSem features (dashboard)", "empty"): {}, ("ComSem reply cache", "empty"): 0}
"""Corruptions that leave a file this package writes itself: an empty features.jsonl is a ComSem
run that judged no feature; an empty reply cache is one a run killed right after creating it left
(SQLite's empty database), read as a cache without replies."""


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_corrupt_file_is_refused_in_one_line_and_left_as_it_was(loader, corruption, tmp_path):
    path, load = LOADERS[loader](tmp_path)
    CORRUPTIONS[corruption](path)
    before = path.read_bytes()
    if (loader, corruption) in LEGITIMATE:
        assert load() == LEGITIMATE[loader, corruption]
        return
    with pytest.raises((ValueError, FileNotFoundError)) as error:
        load()
    message = str(error.value)
    assert "\n" not in message, message
    assert path.name in message or path.parent.name in message, message
    assert path.read_bytes() == before  # nothing the user had is overwritten
