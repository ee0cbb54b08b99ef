"""Checkpoints that a killed run can trust: complete ones carry a marker written last.

SAELens writes a checkpoint as several files; a run killed while writing one leaves a folder
that looks like a checkpoint but is not. Every training path (``train_sae``, ``bae train`` and
``train_stacked_baes``) writes ``checkpoint_complete.json`` (atomically) after every other file
of a checkpoint, resuming picks the newest folder that has it, and ``check_resumable`` is the one
rule for whether a run may go on from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from sae_lens_bae.reports import read_json, read_torch, write_json

__all__ = [
    "COMPLETE_MARKER",
    "DAMAGED_CHECKPOINT_FIX",
    "check_checkpoint_files",
    "check_resumable",
    "fingerprint",
    "latest_checkpoint",
    "mark_complete",
    "read_marker",
    "refuse_other_ranks",
]

DAMAGED_CHECKPOINT_FIX = (
    "delete that checkpoint folder and resume from an earlier one, or start again"
)
"""What a refusal of a damaged checkpoint tells the user to do."""
COMPLETE_MARKER = "checkpoint_complete.json"
"""Written last into a checkpoint folder: ``{"n_training_samples", "n_training_steps", ...}``."""


FINGERPRINT_ROWS = 4096
"""Rows of a data set read for its fingerprint, evenly spaced: a set of any size (a memory-mapped
cache included) costs a fixed read, and another set differs in them."""


def fingerprint(sets: Sequence[Tensor], settings: dict[str, Any]) -> str:
    """What makes two training calls the same run (``run["inputs"]`` of ``check_resumable``):
    the settings, and every data set's shape and the bytes of ``FINGERPRINT_ROWS`` of its rows.
    Bytes, not sums: a sum's rounding depends on the number of threads that reduce it, so a
    run resumed with another thread count would read as another run."""
    digest = hashlib.sha256(repr(sorted(settings.items())).encode())
    for x in sets:
        rows = x[:: max(1, x.shape[0] // FINGERPRINT_ROWS)].detach()
        digest.update(repr(tuple(x.shape)).encode())
        digest.update(rows.to("cpu", torch.float64).contiguous().numpy())  # exact for any float
    return digest.hexdigest()[:16]


def mark_complete(checkpoint: str | Path, **info: Any) -> None:
    """Mark ``checkpoint`` complete (call after everything else of it is written)."""
    write_json(Path(checkpoint) / COMPLETE_MARKER, info)


def read_marker(checkpoint: str | Path) -> dict[str, Any]:
    """The marker of a complete checkpoint."""
    return read_json(
        Path(checkpoint) / COMPLETE_MARKER,
        "a checkpoint's completion marker",
        DAMAGED_CHECKPOINT_FIX,
        ("n_training_samples",),
    )


def latest_checkpoint(path: str | Path) -> Path:
    """``path`` itself if it is a complete checkpoint, else the complete checkpoint under it
    (at any depth: SAELens' runner nests them under a run id) with the most training samples."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"nothing to resume from: {path} does not exist")
    if (path / COMPLETE_MARKER).is_file():
        return path
    complete = [marker.parent for marker in path.rglob(COMPLETE_MARKER)]
    if not complete:
        raise FileNotFoundError(
            f"no complete checkpoint under {path} (a run writes them when it has checkpoints "
            "on: n_checkpoints / --checkpoints); start the run again without resuming"
        )
    return max(complete, key=lambda folder: int(read_marker(folder)["n_training_samples"]))


def check_checkpoint_files(checkpoint: Path) -> None:
    """Refuse, in one line naming it, a checkpoint whose SAELens files (weights, optimiser and
    scheduler state, activation scaler) are missing or damaged: SAELens reads them with no check
    of its own, and a damaged one would end a resumed run in a traceback."""
    fix = DAMAGED_CHECKPOINT_FIX
    for name in ("sae_weights.safetensors", "trainer_state.pt", "activation_scaler.json"):
        if not (checkpoint / name).is_file():
            raise ValueError(f"{checkpoint} lacks {name}; {fix}")
    try:
        load_file(checkpoint / "sae_weights.safetensors")
    except SafetensorError as error:
        raise ValueError(f"{checkpoint}'s weights are damaged ({error}); {fix}") from None
    state = read_torch(checkpoint / "trainer_state.pt", "SAELens' trainer state", fix)
    if not isinstance(state, dict) or {"optimizer", "lr_scheduler"} - set(state):
        raise ValueError(f"{checkpoint}'s trainer_state.pt is not SAELens' trainer state; {fix}")
    read_json(checkpoint / "activation_scaler.json", "SAELens' activation scaler", fix)


def refuse_other_ranks(marker: dict[str, Any], world: int, where: str, why: str) -> None:
    """Refuse, in one line, to resume a checkpoint written by another number of ranks (markers
    without ``world_size`` are of one process) where the data stream depends on it."""
    ranks = int(marker.get("world_size", 1))
    if ranks != world:
        raise ValueError(
            f"{where} was written by {ranks} rank(s), this run has {world}: {why}, so resume it "
            f"with {ranks}"
        )


def check_resumable(
    checkpoint: Path,
    run: dict[str, Any],
    *,
    rank_streams: str | None = None,
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The one rule every training path resumes by; returns ``checkpoint``'s marker. Refuses, in
    one line and before any data is read, a checkpoint this run would not continue exactly:

    - another global minibatch (``run["global_batch_size"]``; another objective: the entropy is a
      property of the minibatch);
    - another number of ranks (``run["world_size"]``) where each rank's data stream is in the
      checkpoint: ``rank_streams`` says why, or the run or the checkpoint reads a cache in
      blocks (``"data": "cache blocks"``);
    - another run where the run says what its inputs are (``run["inputs"]``: a fingerprint of
      its data and settings, against the marker's);
    - another model (``model``: the run's config dict against the checkpoint's ``cfg.json``).
    """
    marker = read_marker(checkpoint)
    wanted = run.get("global_batch_size")
    saved = marker.get("global_batch_size", wanted)
    if saved != wanted:
        raise ValueError(
            f"The checkpoint was trained on global minibatches of {saved} rows, this run makes "
            f"{wanted} (ranks x batch_size): resume with batch_size x ranks = {saved}"
        )
    if marker.get("inputs") != run.get("inputs"):
        raise ValueError(
            f"{checkpoint} holds another run (other data or settings): use another folder, or "
            "delete it to start again"
        )
    if rank_streams is None and "cache blocks" in (marker.get("data"), run.get("data")):
        rank_streams = "a cache is read in blocks, one per rank"
    if rank_streams is not None:
        refuse_other_ranks(marker, run["world_size"], str(checkpoint), rank_streams)
    if model is not None:
        stored = read_json(
            checkpoint / "cfg.json",
            "an SAE config",
            DAMAGED_CHECKPOINT_FIX,
        )
        for key in ("architecture", "d_in", "d_sae", "bits_per_feature"):
            if stored.get(key) != model.get(key):
                raise ValueError(
                    f"{checkpoint} holds a {key}={stored.get(key)} model, these options make "
                    f"{key}={model.get(key)}: resume with the options of the interrupted run"
                )
    return marker
