"""NVLink topology from what NVML reports per link: pure functions, no NVML import.

NVML tells, for each active NVLink of a GPU, the PCI bus ID at the far end, or that the far end is an NVSwitch.
Two GPUs are NVLink peers when a link joins them (seen from either end, since one side may not report it) or when
both reach an NVSwitch (HGX boards: every GPU talks to every other through the switches).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LinkEnds:
    """The far ends of one GPU's active NVLinks: canonical PCI bus IDs of devices, and whether one is an NVSwitch."""

    bus_ids: frozenset[str] = field(default_factory=frozenset)
    reaches_switch: bool = False


def norm_bus_id(bus_id: str) -> str:
    """Canonical "dddddddd:bb:dd.f", so NVML's 4- and 8-digit PCI domain spellings compare equal.

    A string that is not a PCI address comes back lower-cased and stripped, unchanged otherwise.
    """
    text = bus_id.strip().lower()
    try:
        domain, bus, rest = text.split(":")
        device, function = rest.split(".")
        return f"{int(domain, 16):08x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16)}"
    except ValueError:
        return text


def link_peers(uuids: list[str], bus_ids: list[str | None], ends: list[LinkEnds]) -> list[list[str]]:
    """Per GPU i (all three lists are indexed alike), the UUIDs of its NVLink peers in index order, never itself.

    `bus_ids[i]` is GPU i's own canonical bus ID, None when unknown (then only switch links or the other GPU's view
    of the link can make it a peer).
    """

    def linked(i: int, j: int) -> bool:
        if ends[i].reaches_switch and ends[j].reaches_switch:
            return True
        return bus_ids[j] in ends[i].bus_ids or (bus_ids[i] is not None and bus_ids[i] in ends[j].bus_ids)

    return [[uuids[j] for j in range(len(uuids)) if j != i and linked(i, j)] for i in range(len(uuids))]
