"""Values a kernel cannot predict: secret seeds, signed inputs spread over magnitudes,
and varied output poison.

Inputs are built from random bits: a random sign, a random mantissa and an exponent
drawn from a small window (2**-(E+1) .. 2**E), so values are signed, no two runs share
them, and arithmetic with fewer mantissa bits or a narrower range than the dtype (TF32,
bf16, fp16 accumulation, fixed point) fails the tolerance. Poison (what an output holds
before a run) is random as well: a kernel cannot recognise it by its bit pattern (the
old single NaN), and an element left unwritten still equals it bit for bit.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FloatFormat", "float_format", "random_poison", "secret_seed", "spread_values"]


@dataclass(frozen=True)
class FloatFormat:
    """The bit layout of an IEEE binary float type, and the inputs' exponent window."""

    bits: int
    mantissa_bits: int
    exponent_bias: int
    order_bits: int  # inputs span 2**order_bits binary orders of magnitude, centred on 1

    @property
    def unsigned(self) -> Any:
        """The unsigned integer type of the same width (np.uint16, ...)."""
        return {16: np.uint16, 32: np.uint32, 64: np.uint64}[self.bits]

    @property
    def epsilon(self) -> float:
        """One unit in the last place, relative: 2**-mantissa_bits."""
        return 2.0 ** -self.mantissa_bits


# fp16 spans fewer orders (0.25 .. 4): a 8192-term sum of products below 16 stays far
# below its largest finite value (65504). bf16 (fp32's exponent, 7 mantissa bits), fp32
# and fp64: 1/16 .. 16.
_FORMATS = {
    "float16": FloatFormat(16, 10, 15, 2),
    "bfloat16": FloatFormat(16, 7, 127, 3),
    "float32": FloatFormat(32, 23, 127, 3),
    "float64": FloatFormat(64, 52, 1023, 3),
}


def float_format(dtype: np.dtype) -> FloatFormat:
    return _FORMATS[np.dtype(dtype).name]


def secret_seed() -> int:
    """A seed nobody can guess (the operating system's random source)."""
    return secrets.randbits(63)


def _random_words(rng: np.random.Generator, count: int,
                  unsigned: Any) -> np.ndarray:
    words_per_raw = 8 // np.dtype(unsigned).itemsize
    raw = rng.bit_generator.random_raw(-(-count // words_per_raw))
    return raw.view(unsigned)[:count]


def spread_values(rng: np.random.Generator, shape: tuple[int, ...],
                  dtype: np.dtype) -> np.ndarray:
    """Random signed values of `dtype`, every mantissa bit random, magnitudes spread
    over 2**order_bits binary orders (see the module docstring)."""
    fmt = float_format(dtype)
    kind = fmt.unsigned
    count = int(np.prod(shape, dtype=np.int64))
    bits = _random_words(rng, count, kind)
    # Keep the sign, the mantissa and the exponent's low order_bits (the order), then
    # add the window's lowest exponent: it cannot carry into the sign. Two passes over
    # the words (fresh inputs for every run are on the harness's hot path).
    window = (1 << fmt.order_bits) - 1
    bits &= kind((1 << (fmt.bits - 1)) | (window << fmt.mantissa_bits)
                 | ((1 << fmt.mantissa_bits) - 1))
    bits += kind((fmt.exponent_bias - (1 << (fmt.order_bits - 1))) << fmt.mantissa_bits)
    return bits.view(np.dtype(dtype)).reshape(shape)


def random_poison(rng: np.random.Generator, count: int,
                  dtype: np.dtype) -> np.ndarray:
    """`count` poison values: random bit patterns, a mix of finite values of any
    magnitude, infinities and NaNs with random payloads."""
    return _random_words(rng, count, float_format(dtype).unsigned).view(np.dtype(dtype))
