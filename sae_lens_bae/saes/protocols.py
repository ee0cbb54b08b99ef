"""What the stages after the SAE read of it: any SAE encodes; a binary autoencoder also gives its
binary code."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

__all__ = ["BinaryEncoder", "Encoder"]


@runtime_checkable
class Encoder(Protocol):
    """An SAE's encoder: feature activations of a batch of hidden states."""

    def encode(self, x: Tensor) -> Tensor: ...


@runtime_checkable
class BinaryEncoder(Encoder, Protocol):
    """A BAE's encoder: also the binary code h_B."""

    def encode_bits(self, x: Tensor) -> Tensor: ...
