"""Hidden states at chosen token positions, gathered with TransformerLens hooks.

The tracing experiments need only a few positions of every sequence (powers of two, or each
prompt's last token), not whole ``[batch, ctx, d]`` caches: a hook on each requested point keeps
just those rows, and the forward pass stops after the last requested layer unless logits are
needed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from sae_lens_bae.activations.hooks import check_hooks, stop_layer, unembeds_residual
from sae_lens_bae.reports import read_torch, write_torch

__all__ = ["gather_states", "prompt_states"]


@torch.no_grad()
def gather_states(
    model: HookedTransformer,
    tokens: Int[Tensor, "n_seq ctx"],
    hooks: Sequence[str],
    positions: Int[Tensor, "n_seq n_pos"],
    *,
    batch_size: int = 32,
    logit_tokens: Sequence[int] | None = None,
    progress: bool = True,
    desc: str = "Gathering hidden states",
    keep: str | Path | None = None,
) -> tuple[dict[str, Float[Tensor, "n_seq n_pos d"]], Float[Tensor, "n_seq n_pos k"] | None]:
    """States of ``hooks`` at ``positions[i]`` of every row ``tokens[i]``, plus (optionally) the
    logits of the ``logit_tokens`` there. ``keep``: a file where they are kept once gathered; the
    same call run again (after a kill) reads them instead of running the model, and refuses the
    file of another call.

    Rows may be right-padded with any token: in a causal model the state at position p depends on
    tokens 0..p only, so gathering each row's own positions is exact. A HookedTransformer's
    logits are computed from the gathered final residual only (never a [batch, ctx, vocab]
    tensor); a bridge's are read from its whole forward pass. States come back in float32 on the
    CPU. NaN/Inf states stop with an error naming the rows.
    """
    hooks = list(dict.fromkeys(hooks))
    check_hooks(model, hooks)
    call = (model, tokens, hooks, positions, logit_tokens)
    if keep is None:
        return _gather(*call, batch_size, progress, desc)
    key = _call_key(*call)
    if Path(keep).exists():
        return _read_kept(Path(keep), key)
    states, logits = _gather(*call, batch_size, progress, desc)
    write_torch(keep, {"key": key, "states": states, "logits": logits})
    return states, logits


def _call_key(
    model: HookedTransformer,
    tokens: Tensor,
    hooks: Sequence[str],
    positions: Tensor,
    logit_tokens: Sequence[int] | None,
) -> str:
    """What makes two calls gather the same states: the model (its name, shape and embedding),
    the rows, positions, hooks and logit tokens."""
    cfg = model.cfg
    rows = model.W_E[:: max(1, cfg.d_vocab // 4096)].detach()  # a fixed read, whatever the vocab
    identity = (cfg.model_name, cfg.n_layers, cfg.d_model)
    ids = None if logit_tokens is None else list(logit_tokens)
    digest = hashlib.sha256(repr((identity, list(hooks), ids)).encode())
    # the embedding's bytes, not a sum: a sum's rounding depends on the thread count
    digest.update(rows.to("cpu", torch.float64).contiguous().numpy())
    for tensor in (tokens, positions):
        digest.update(tensor.to(torch.int64).cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _read_kept(path: Path, key: str) -> tuple[dict[str, Tensor], Tensor | None]:
    fix = "delete it to gather the states again"
    kept = read_torch(path, "gathered states", fix, weights_only=True)
    if not isinstance(kept, dict) or {"key", "states", "logits"} - set(kept):
        raise ValueError(f"{path} is not gathered states (not their fields); {fix}")
    stored, states, logits = kept["key"], kept["states"], kept["logits"]
    if stored != key:
        raise ValueError(f"{path} holds the states of another model, text or layers; {fix}")
    return states, logits


def _gather(
    model: HookedTransformer,
    tokens: Tensor,
    hooks: list[str],
    positions: Tensor,
    logit_tokens: Sequence[int] | None,
    batch_size: int,
    progress: bool,
    desc: str,
) -> tuple[dict[str, Tensor], Tensor | None]:
    final = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    wanted = hooks if logit_tokens is None else list(dict.fromkeys([*hooks, final]))
    if tokens.ndim != 2 or positions.ndim != 2 or positions.shape[0] != tokens.shape[0]:
        raise ValueError(
            f"tokens must be [n_seq, ctx] and positions [n_seq, n_pos] with the same n_seq; got "
            f"{tuple(tokens.shape)} and {tuple(positions.shape)}"
        )
    if positions.numel() and (positions.min() < 0 or positions.max() >= tokens.shape[1]):
        raise ValueError(
            f"positions must lie in [0, {tokens.shape[1] - 1}] (the rows' length); got "
            f"{int(positions.min())}..{int(positions.max())}"
        )
    ids = None
    if logit_tokens is not None:
        ids = torch.as_tensor(list(logit_tokens), dtype=torch.long, device=model.cfg.device)
    # a bridge's logits come from its own head: the whole forward pass runs
    stop_at = stop_layer(wanted) if ids is None or unembeds_residual(model) else None
    gathered: dict[str, list[Tensor]] = {h: [] for h in wanted}
    logits_parts: list[Tensor] = []
    for start in tqdm(
        range(0, tokens.shape[0], batch_size), desc=desc, unit="batch", disable=not progress
    ):
        batch = tokens[start : start + batch_size].to(model.cfg.device)
        index = positions[start : start + batch_size].to(model.cfg.device)

        # the name each hook was asked for: a bridge's hook point answers to its canonical name
        def keep(act: Tensor, hook: Any, name: str, index=index, start=start) -> None:  # noqa: ARG001
            rows = torch.gather(act, 1, index[..., None].expand(-1, -1, act.shape[-1]))
            if not torch.isfinite(rows).all():
                raise ValueError(
                    f"NaN/Inf hidden states at {name} in rows {start}..{start + len(rows) - 1}"
                )
            gathered[name].append(rows.float().cpu())

        output = model.run_with_hooks(
            batch,
            fwd_hooks=[(h, partial(keep, name=h)) for h in wanted],
            stop_at_layer=stop_at,
            prepend_bos=False,
        )
        if ids is not None:
            logits = _label_logits(model, output, gathered[final][-1], index, ids)
            logits_parts.append(logits.float().cpu())
    states = {h: torch.cat(gathered[h]) for h in hooks}
    return states, None if ids is None else torch.cat(logits_parts)


def _label_logits(
    model: Any, output: Tensor, final_rows: Tensor, index: Tensor, ids: Tensor
) -> Tensor:
    """The ``ids`` logits at the gathered positions: from the final residual rows where the
    model's logits are ``ln_final(resid) @ W_U + b_U`` (a HookedTransformer), else from the
    forward pass's own logits."""
    if unembeds_residual(model):
        resid = final_rows.to(model.cfg.device, model.cfg.dtype)
        return model.ln_final(resid) @ model.W_U[:, ids] + model.b_U[ids]
    rows = torch.arange(output.shape[0], device=output.device)[:, None]
    return output[rows, index][..., ids]


def prompt_states(
    model: HookedTransformer,
    tokens: Int[Tensor, "n ctx"],
    last: Int[Tensor, " n"],
    hook: str,
    *,
    batch_size: int = 16,
    progress: bool = True,
    desc: str = "prompt states",
) -> tuple[Float[Tensor, "m d"], Int[Tensor, "m 2"], Float[Tensor, "n d"]]:
    """States of right-padded prompts (``sae_lens_bae.prompts.encode_prompts``) at ``hook``:
    every real token but BOS, their (prompt, position), and each prompt's last token."""
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
    states, _ = gather_states(
        model, tokens, [hook], positions, batch_size=batch_size, progress=progress, desc=desc
    )
    every = states[hook]
    real = (positions >= 1) & (positions <= last[:, None])
    return every[real], real.nonzero(), every[torch.arange(tokens.shape[0]), last]
