"""Ids as unique prefixes, as git takes them: every command that takes an object id takes any prefix of it that
names one object the caller can see. An ambiguous prefix is an error listing the candidates; one that names
nothing is "<what> not found: <prefix>"."""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.cli.client import ApiError

#: candidates an ambiguous prefix's error lists
SHOWN = 10
#: an id in full (uuid4 hex): no look-up needed
FULL = 32


def pick(given: str, ids: Iterable[str], what: str) -> str:
    """The one of `ids` that `given` is (or is a prefix of); ApiError (404 or 409) otherwise."""
    ids = sorted(set(ids))
    if given in ids:
        return given
    matches = [i for i in ids if i.startswith(given)] if given else []
    if not matches:
        raise ApiError(404, f"{what} not found: {given}")
    if len(matches) > 1:
        shown = ", ".join(matches[:SHOWN]) + (f" and {len(matches) - SHOWN} more" if len(matches) > SHOWN else "")
        raise ApiError(409, f"{what} id {given} is ambiguous: it begins {shown}")
    return matches[0]
