"""Integer resource units and their parsing at the edges.

All accounting inside gpupool is in integers: milli-GPU (1 GPU = 1000), milli-CPU (1 core = 1000),
MiB of memory and MiB of GPU memory. Decimal strings such as "0.5" exist only where people type or
read amounts; `parse_milli` and `format_milli` are the only conversions.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

MILLI = 1000
GPU = "gpu_milli"
CPU = "cpu_milli"
MEMORY = "memory_mib"
GPU_MEMORY = "gpu_memory_mib"
RESOURCE_NAMES = (GPU, CPU, MEMORY, GPU_MEMORY)
#: the largest node's CPU and GPU (ALGORITHMS.md §2.4): the default scale of the bestfit, dotprod and gpuclustering
#: scores
MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8_000


def parse_milli(text: str | int, *, field: str = "amount") -> int:
    """Parse a decimal amount ("0.5", "2", "1.25") into milli-units; reject anything finer than 1/1000.

    Raises ValueError naming `field` for negative, non-numeric or over-precise input.
    """
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation:
        raise ValueError(f"{field}: {text!r} is not a number") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"{field}: {text!r} must be a non-negative number")
    milli = value * MILLI
    if milli != milli.to_integral_value():
        raise ValueError(f"{field}: {text!r} is finer than 1/1000")
    return int(milli)


def format_milli(milli: int) -> str:
    """Render milli-units as the shortest decimal string ("500" -> "0.5", "2000" -> "2")."""
    whole, frac = divmod(milli, MILLI)
    if frac == 0:
        return str(whole)
    return f"{whole}.{frac:03d}".rstrip("0")


def trunc_div(numerator: int, denominator: int) -> int:
    """Integer division truncated toward zero (Go's and C's `/` on ints), unlike Python's floor `//`."""
    quotient = abs(numerator) // abs(denominator)
    return quotient if (numerator >= 0) == (denominator > 0) else -quotient
