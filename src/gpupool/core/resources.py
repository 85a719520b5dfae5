"""ResourceVector: an immutable, non-negative integer amount per resource name.

Units are those of `gpupool.core.units` (milli-GPU, milli-CPU, MiB). Floats are rejected at
construction, and a subtraction that would go negative raises: both are bugs, not outcomes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fractions import Fraction


class ResourceVector(Mapping[str, int]):
    """A frozen mapping resource -> int >= 0; missing resources read as 0, and equality ignores zeros.

    `_map` holds the amounts in name order (arithmetic keeps it so, and iteration relies on it).
    """

    __slots__ = ("_hash", "_map")
    _hash: int | None
    _map: dict[str, int]

    def __init__(self, amounts: Mapping[str, int] | None = None, **kwargs: int) -> None:
        merged = {**(amounts or {}), **kwargs}
        for name, value in merged.items():
            if type(value) is not int:
                raise TypeError(f"{name}: resource amounts are integers, got {value!r}")
            if value < 0:
                raise ValueError(f"{name}: resource amounts are non-negative, got {value}")
        self._map = dict(sorted(merged.items()))
        self._hash = None

    @classmethod
    def _trusted(cls, amounts: dict[str, int]) -> ResourceVector:
        """Build from amounts already known to be non-negative ints (arithmetic results)."""
        vector = cls.__new__(cls)
        vector._map = dict(sorted(amounts.items()))
        vector._hash = None
        return vector

    def _nonzero(self) -> tuple[tuple[str, int], ...]:
        return tuple(item for item in self._map.items() if item[1])

    def __getitem__(self, name: str) -> int:
        return self._map.get(name, 0)

    def items(self) -> Iterator[tuple[str, int]]:  # type: ignore[override]
        return iter(self._map.items())

    def __contains__(self, name: object) -> bool:
        """Whether the vector names `name` (even with amount 0, e.g. a limit of 0); missing names read as 0."""
        return name in self._map

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._nonzero())
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ResourceVector):
            return self._nonzero() == other._nonzero()
        return NotImplemented

    def __repr__(self) -> str:
        return f"ResourceVector({dict(self._nonzero())})"

    def __add__(self, other: Mapping[str, int]) -> ResourceVector:
        out = self._map.copy()
        get = out.get
        for name, value in other.items():
            out[name] = get(name, 0) + value
        if not isinstance(other, ResourceVector):
            return ResourceVector(out)
        if len(out) == len(self._map):  # no new names: `out` is still in name order
            vector = ResourceVector.__new__(ResourceVector)
            vector._map, vector._hash = out, None
            return vector
        return ResourceVector._trusted(out)

    def __sub__(self, other: Mapping[str, int]) -> ResourceVector:
        out = dict(self._map)
        for name, value in other.items():
            left = out.get(name, 0) - value
            if left < 0:
                raise ValueError(f"{name}: subtracting {value} from {out.get(name, 0)} goes negative")
            out[name] = left
        return ResourceVector._trusted(out) if isinstance(other, ResourceVector) else ResourceVector(out)

    def changes_from(self, before: ResourceVector) -> list[tuple[str, int]]:
        """(name, amount - before's amount) for every name of this vector whose amount differs, in name order."""
        prior = before._map
        return [(name, value - prior.get(name, 0)) for name, value in self._map.items() if value != prior.get(name, 0)]

    def scaled(self, factor: int) -> ResourceVector:
        """Every amount multiplied by a non-negative integer factor."""
        return ResourceVector({k: v * factor for k, v in self._map.items()})

    def fits_within(self, capacity: Mapping[str, int]) -> bool:
        """True when every amount is at most the capacity's amount for that resource."""
        return all(value <= capacity.get(name, 0) for name, value in self._map.items())

    def dominant_share(self, total: Mapping[str, int]) -> Fraction:
        """max over resources of amount/total (DRF); resources with total 0 are ignored."""
        shares = [Fraction(v, total[k]) for k, v in self._map.items() if total.get(k, 0) > 0]
        return max(shares, default=Fraction(0))


#: the vector with no amounts, shared (vectors are immutable): a default that costs no construction
EMPTY = ResourceVector()
