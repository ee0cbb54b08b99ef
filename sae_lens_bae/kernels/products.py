"""Faster exact products for the covariance penalty's tiles (``kernels.tiles.tiled_penalty``):
the co-occurrence counts
H^T H of 0/1 codes H [G, B, n] block by block (``gram``) and the codes times a block of signs
(``left``), exactly, whichever way is fastest where they run:

* ``DenseProducts``: (batched) matmuls, bf16 operands with fp32 accumulation on CUDA, fp32
  elsewhere (where this torch has no int8 product, and as the reference: ``CPU_INT8 = False``);
  also the centred products of codes that are not 0/1;
* ``Int8Products``, on CPU: int8 matmuls with int32 results (``torch._int_mm``): 0/1 codes and
  -1/0/1 signs are int8 numbers, and the CPU multiplies int8 2x (AVX2) to 4x (AVX-512 VNNI)
  faster than fp32;
* ``SparseProducts``, on CPU for very sparse codes: sums over the entries that are 1 only
  (``embedding_bag``), after flipping every bit that fires in more than half of the batch
  (|cov| does not change when a bit is flipped): rho * B * n^2 additions instead of
  B * n^2 multiply-adds at density rho.

``binary_products`` picks one for a set of codes; :func:`penalty_path` hands that choice to the
tiles.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from sae_lens_bae.kernels.tiles import DenseProducts as _PlainProducts
from sae_lens_bae.kernels.tiles import tiled_penalty

__all__ = [
    "CPU_INT8",
    "SPARSE_DENSITY",
    "SPARSE_DENSITY_FP32",
    "SPARSE_MIN_BLOCK",
    "DenseProducts",
    "Int8Products",
    "Products",
    "SparseProducts",
    "binary_products",
    "cpu_int8_products",
    "integer_mm",
    "penalty_path",
]


def _bf16_products(a: Tensor) -> bool:
    """Whether small-integer products run as bf16 matmuls with fp32 accumulation (on CUDA)."""
    return a.is_cuda


def integer_mm(a: Tensor, b: Tensor) -> Tensor:
    """fp32 (batched) product of matrices with small-integer entries (0/1 codes, -1/0/1 signs).

    On CUDA it multiplies bf16 inputs with fp32 accumulation and output: exact for such entries and
    several times faster than fp32. Elsewhere fp32, exact while sums stay below 2**24.
    """
    if _bf16_products(a):
        mm = torch.mm if a.ndim == 2 else torch.bmm
        try:
            return mm(a.bfloat16(), b.bfloat16(), out_dtype=torch.float32)
        except TypeError:  # a torch without mm(out_dtype=...); anything else (OOM) propagates
            pass
    return a.float() @ b.float()


CPU_INT8 = True
"""On CPU, binary codes multiply as int8 matmuls (``Int8Products``) when this torch can
(``cpu_int8_products``); False: fp32 matmuls, the path before them (benchmarks compare the two)."""


@functools.cache
def cpu_int8_products() -> bool:
    """Whether this torch multiplies int8 matrices on the CPU with int32 results (``_int_mm``)."""
    probe = torch.ones(2, 8, dtype=torch.int8)
    try:  # a 2 x 8 probe: the only failure it can meet is a torch without the kernel
        torch._int_mm(probe, probe.T.contiguous())
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    return True


SPARSE_DENSITY = 0.05
"""On CPU, binary codes whose density (after flipping the bits that fire more than half of the
time) is at most this take the sparse products (``SPARSE_DENSITY_FP32`` where the matmuls are
fp32): int8 matmuls cost the same at any density, sparse sums fall with it, and the two cross
between about 0.03 (AVX-512 VNNI) and 0.1 (AVX2); timings in docs/research/benchmarks.md."""
SPARSE_DENSITY_FP32 = 0.25
"""The same against fp32 matmuls, which the sparse sums beat below a density of about 0.3."""

SPARSE_MIN_BLOCK = 256
"""Sparse codes take the sparse products only in tiles at least this wide: each tile costs one
``embedding_bag`` call per member of a stack, so many small BAEs (45 of d_sae = 576 share tiles
116 wide) are faster through batched matmuls."""


class DenseProducts(_PlainProducts):
    """The plain products, with 0/1 entries multiplied as bf16 with fp32 accumulation on CUDA
    (``integer_mm``: exact, and several times faster than fp32)."""

    def _mm(self, a: Tensor, b: Tensor) -> Tensor:
        return integer_mm(a, b) if self.integer_entries else a @ b.to(a.dtype)


class Int8Products:
    """The same products for 0/1 codes on CPU as int8 matmuls with int32 results, one
    ``torch._int_mm`` per member of a stack: exact (int32 sums of 0/1 and -1/0/1 products). The
    codes' column blocks are made contiguous once (int8: a quarter of the fp32 codes, and
    faster to multiply than strided views); sign tiles are multiplied as they come, transposed
    views included."""

    int8_signs = True
    int32_results = True
    flips: Tensor | None = None

    def __init__(self, x: Tensor) -> None:
        self.x = x.to(torch.int8)
        self._blocks: dict[tuple[int, int], list[Tensor]] = {}
        self._transposed: dict[tuple[int, int], list[Tensor]] = {}

    def _columns(self, block: slice, transposed: bool = False) -> list[Tensor]:
        cache = self._transposed if transposed else self._blocks
        key = (block.start, block.stop)
        if key not in cache:
            cache[key] = [
                _row_major(codes[:, block].T if transposed else codes[:, block]) for codes in self.x
            ]
        return cache[key]

    def gram(self, rows: slice, cols: slice) -> Tensor:
        pairs = zip(self._columns(rows, transposed=True), self._columns(cols), strict=True)
        return _stack([torch._int_mm(a, b) for a, b in pairs])

    def left(self, rows: slice, matrix: Tensor) -> Tensor:
        signs = matrix.to(torch.int8)
        pairs = zip(self._columns(rows), signs, strict=True)
        return _stack(
            [torch._int_mm(a, b if 1 not in b.shape else _row_major(b)) for a, b in pairs]
        )


def _row_major(matrix: Tensor) -> Tensor:
    """``matrix`` with the strides of a fresh row-major one. ``contiguous()`` keeps any stride
    of a dimension of size 1, and ``torch._int_mm`` on CPU (torch 2.13) reads such a stride as
    the row length: a [1, 16] view with strides (1, 1) multiplies as garbage (strided and
    transposed views of wider matrices multiply right)."""
    rows, cols = matrix.shape
    if matrix.stride() == (cols, 1):
        return matrix
    return torch.empty((rows, cols), dtype=matrix.dtype, device=matrix.device).copy_(matrix)


_KEEP_COLUMNS_LIMIT = 1 << 24
"""Sparse codes keep their contiguous column blocks while they have at most this many
co-occurrence entries in all (n <= 4096 for one code set)."""

_Bags = list[tuple[Tensor, Tensor]]
"""Per code set of a stack: (the indices of the bags' members, the bags' start offsets)."""


class SparseProducts:
    """The same products for sparse 0/1 codes, as sums of the rows that the 1 entries pick.

    ``gram``: for each bit i of ``rows``, the sum of the rows x[k, cols] over the samples k
    where i fires. ``left``: for each sample, the sum of the rows of ``matrix`` of the bits of
    ``rows`` that fire in it. Both are ``embedding_bag`` sums of exact integers, so they equal the
    dense products bit for bit; the index lists are built once per set of codes.
    """

    int8_signs = False  # embedding_bag reads its weights in the work dtype: no conversion
    int32_results = False
    flips: Tensor | None = None  # +-1 per bit where the codes were flipped (1 - x)

    def __init__(self, x: Tensor, dtype: torch.dtype) -> None:
        self.x, self.dtype = x, dtype
        self.bits = x.bool()  # nonzero() on bool is twice as fast as on float
        # the blocks of columns of x, contiguous, are kept when they are small (the sign tiles
        # are too): together they are a copy of x, 128 MiB at n = 65536
        self.keep_columns = x.shape[0] * x.shape[2] ** 2 <= _KEEP_COLUMNS_LIMIT
        self._columns: dict[tuple[int, int], list[Tensor]] = {}
        self._by_bit: dict[tuple[int, int], _Bags] = {}
        self._by_sample: dict[tuple[int, int], _Bags] = {}

    def gram(self, rows: slice, cols: slice) -> Tensor:
        key = (cols.start, cols.stop)
        columns = self._columns.get(key)
        if columns is None:
            columns = [codes[:, cols].to(self.dtype).contiguous() for codes in self.x]
            if self.keep_columns:
                self._columns[key] = columns
        bags = self._bags(self._by_bit, rows, by_bit=True)
        out = [
            F.embedding_bag(samples, weight, offsets, mode="sum")
            for (samples, offsets), weight in zip(bags, columns, strict=True)
        ]
        return _stack(out)

    def left(self, rows: slice, matrix: Tensor) -> Tensor:
        out = []
        bags = self._bags(self._by_sample, rows, by_bit=False)
        for (bits, offsets), weight in zip(bags, matrix, strict=True):
            if not (weight.is_contiguous() and weight.dtype == self.dtype):
                weight = torch.empty(weight.shape, dtype=self.dtype).copy_(weight)
            out.append(F.embedding_bag(bits, weight, offsets, mode="sum"))
        return _stack(out)

    def _bags(self, cache: dict[tuple[int, int], _Bags], rows: slice, by_bit: bool) -> _Bags:
        """Per code set, the bags of the 1 entries of the bits ``rows``: by bit (each
        bit's samples) or by sample (each sample's bits, as indices into ``rows``), with
        the bags' start offsets. Built once per block of bits."""
        key = (rows.start, rows.stop)
        if key not in cache:
            cache[key] = []
            for bits in self.bits:
                block = bits[:, rows].T if by_bit else bits[:, rows]
                owners, members = block.nonzero(as_tuple=True)  # sorted by owner
                offsets = torch.zeros(block.shape[0], dtype=torch.long)
                offsets[1:] = torch.bincount(owners, minlength=block.shape[0]).cumsum(0)[:-1]
                cache[key].append((members, offsets))
        return cache[key]


Products = DenseProducts | Int8Products | SparseProducts
"""What ``binary_products`` returns: ``x`` (the codes multiplied, int8 / bf16 / as given),
``gram``, ``left``, and ``int8_signs`` / ``int32_results`` (the sign tiles' and the results'
dtypes)."""


def _stack(tiles: list[Tensor]) -> Tensor:
    return tiles[0].unsqueeze(0) if len(tiles) == 1 else torch.stack(tiles)


def _cpu_int8() -> bool:
    return CPU_INT8 and cpu_int8_products()


def _cpu_matmuls(x: Tensor) -> Int8Products | DenseProducts:
    """The matmul products of 0/1 codes on CPU: int8 where this torch has them (``CPU_INT8``)."""
    return Int8Products(x) if _cpu_int8() else DenseProducts(x, True)


def binary_products(
    x: Tensor, counts: Tensor, dtype: torch.dtype, block: int
) -> tuple[Products, Tensor, Tensor, Tensor | None]:
    """(products, codes, counts, bit signs) for 0/1 codes x [G, B, n].

    On CPU (outside ``torch.compile``, whose graphs need fixed shapes) codes whose flipped density
    is at most ``SPARSE_DENSITY``, in tiles at least ``SPARSE_MIN_BLOCK`` wide, come back with
    every bit that fires in more than half of the batch flipped (1 - x), their counts, the
    sparse products and the +-1 signs that map the gradient back. Elsewhere the codes as they
    are and matmuls: bf16 on CUDA (exact for 0/1, half the memory), int8 on CPU where this torch
    has the product (``CPU_INT8``), else fp32.
    """
    if x.is_cuda:
        x = x.bfloat16()
        return DenseProducts(x, True), x, counts, None
    if torch.compiler.is_compiling() or min(block, x.shape[2]) < SPARSE_MIN_BLOCK:
        return _cpu_matmuls(x), x, counts, None
    batch = x.shape[1]
    flipped = counts > batch / 2
    rare_counts = torch.where(flipped, batch - counts, counts)
    limit = SPARSE_DENSITY if _cpu_int8() else SPARSE_DENSITY_FP32
    if float(rare_counts.sum()) > limit * x.numel():
        return _cpu_matmuls(x), x, counts, None
    if not flipped.any():
        return SparseProducts(x, dtype), x, counts, None
    x = torch.where(flipped[:, None, :], 1 - x, x)
    signs = 1.0 - 2.0 * flipped.to(dtype)
    return SparseProducts(x, dtype), x, rare_counts, signs


def _choose(x: Tensor, counts: Tensor, dtype: torch.dtype, block: int) -> tuple[Products, Tensor]:
    """``binary_products`` as ``tiled_penalty`` takes a choice: the products (carrying their
    bit flips) and the counts of the codes they multiply."""
    products, _, counts, flips = binary_products(x, counts, dtype, block)
    products.flips = flips
    return products, counts


def penalty_path(
    codes: Tensor, block: int | None, binary: bool | None, share: tuple[int, int], scale: float
) -> Tensor:
    """The tiles with the products ``binary_products`` picks (every device)."""
    return tiled_penalty(codes, block, binary, share, scale, _choose)
