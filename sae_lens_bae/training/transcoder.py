"""Training for SAELens' ``Transcoder`` (a ReLU dictionary from one hook point to another).

SAELens ships the transcoder's inference class (architecture ``transcoder``, loadable with
``SAE.load_from_disk``) but no training class. ``train_transcoder`` trains one with the objective
of SAELens' standard SAE, only with a target that is not the input: squared error summed over
the output dimension plus an L1 penalty on the activations weighted by the decoder row norms,
Adam with gradients clipped to norm 1, as ``SAETrainer`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from sae_lens.saes.transcoder import Transcoder, TranscoderConfig
from torch import Tensor
from tqdm.auto import trange

from sae_lens_bae.reports import read_torch, write_torch
from sae_lens_bae.saes.objective import reconstruction_loss
from sae_lens_bae.training.checkpoints import fingerprint
from sae_lens_bae.training.trainer import activation_batches

__all__ = ["train_transcoder"]


def train_transcoder(
    inputs: Float[Tensor, "n d_in"],
    targets: Float[Tensor, "n d_out"],
    d_sae: int,
    *,
    training_samples: int,
    l1_coefficient: float = 5.0,
    batch_size: int = 512,
    lr: float = 5e-4,
    device: str = "cpu",
    seed: int = 0,
    record_every: int = 10,
    progress: bool = True,
    checkpoint: str | Path | None = None,
) -> tuple[Transcoder, list[dict[str, float]]]:
    """A ``Transcoder`` mapping ``inputs`` (e.g. an MLP's input) to ``targets`` (e.g. the layer's
    residual output), and its loss history (``reconstruction_loss`` is comparable with
    ``train_sae``'s: mean squared error over batch and dimensions). ``checkpoint``: a file where
    the finished transcoder is kept, with a fingerprint of its data and settings; the same call
    run again returns it without training."""
    if inputs.ndim != 2 or targets.ndim != 2 or inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            f"inputs [n, d_in] and targets [n, d_out] need the same n; got {tuple(inputs.shape)} "
            f"and {tuple(targets.shape)}"
        )
    settings = {
        "shape": d_sae,
        "schedule": (training_samples, batch_size, lr, seed, record_every),
        "l1": l1_coefficient,
    }
    inputs_key = fingerprint([inputs, targets], settings)
    if checkpoint is not None and Path(checkpoint).exists():
        return _load_finished(Path(checkpoint), inputs_key, device)
    d_in = inputs.shape[1]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        cfg = TranscoderConfig(
            d_in=d_in, d_sae=d_sae, d_out=targets.shape[1], apply_b_dec_to_input=False
        )
        transcoder = Transcoder(cfg).to(device)
    optimizer = torch.optim.Adam(transcoder.parameters(), lr=lr)
    pairs = activation_batches(torch.cat([inputs, targets], dim=1).float(), batch_size, seed=seed)
    history: list[dict[str, float]] = []
    for step in trange(
        training_samples // batch_size, desc="Training transcoder", disable=not progress
    ):
        batch = next(pairs).to(device)
        x, y = batch[:, :d_in], batch[:, d_in:]
        acts = transcoder.encode(x)
        out = transcoder.decode(acts)
        mse = (out - y).pow(2).sum(-1).mean()
        l1 = l1_coefficient * (acts * transcoder.W_dec.norm(dim=1)).sum(-1).mean()
        (mse + l1).backward()
        torch.nn.utils.clip_grad_norm_(transcoder.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % record_every == 0:
            row: dict[str, Any] = {
                "step": float(step),
                "mse_loss": mse.item(),
                "l1_loss": l1.item(),
            }
            row["reconstruction_loss"] = reconstruction_loss(out.detach(), y).item()
            history.append(row)
    transcoder.eval()
    if checkpoint is not None:  # whole or not at all: a kill leaves no half file
        state = {
            "inputs": inputs_key,
            "cfg": (d_in, d_sae, targets.shape[1]),
            "weights": transcoder.state_dict(),
            "history": history,
        }
        write_torch(checkpoint, state)
    return transcoder, history


def _load_finished(
    path: Path, inputs: str, device: str
) -> tuple[Transcoder, list[dict[str, float]]]:
    fix = "delete it to train the transcoder again"
    state = read_torch(path, "a finished transcoder", fix, map_location=device, weights_only=True)
    try:
        d_in, d_sae, d_out = state["cfg"]
        config = TranscoderConfig(d_in=d_in, d_sae=d_sae, d_out=d_out, apply_b_dec_to_input=False)
        transcoder = Transcoder(config).to(device)
        transcoder.load_state_dict(state["weights"])
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"{path} is not a finished transcoder ({type(error).__name__}); {fix}"
        ) from None
    if state.get("inputs") != inputs:
        raise ValueError(f"{path} holds a transcoder of other data or settings; {fix}")
    transcoder.eval()
    return transcoder, state["history"]
