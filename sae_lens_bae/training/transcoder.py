"""Training for SAELens' ``Transcoder`` (a ReLU dictionary from one hook point to another).

SAELens ships the transcoder's inference class (architecture ``transcoder``, loadable with
``SAE.load_from_disk``) but no training class. ``train_transcoder`` trains one with the objective
of SAELens' standard SAE, only with a target that is not the input: squared error summed over
the output dimension plus an L1 penalty on the activations weighted by the decoder row norms,
Adam with gradients clipped to norm 1, as ``SAETrainer`` does.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from sae_lens.saes.transcoder import Transcoder, TranscoderConfig
from torch import Tensor
from tqdm.auto import trange

from sae_lens_bae.losses import reconstruction_loss
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
) -> tuple[Transcoder, list[dict[str, float]]]:
    """A ``Transcoder`` mapping ``inputs`` (e.g. an MLP's input) to ``targets`` (e.g. the layer's
    residual output), and its loss history (``reconstruction_loss`` is comparable with
    ``train_sae``'s: mean squared error over batch and dimensions)."""
    if inputs.ndim != 2 or targets.ndim != 2 or inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            f"inputs [n, d_in] and targets [n, d_out] need the same n; got {tuple(inputs.shape)} "
            f"and {tuple(targets.shape)}"
        )
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
    return transcoder, history
