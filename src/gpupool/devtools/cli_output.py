"""What must never reach a user of the CLI (issue 43): a Python repr of a dict or list, pydantic's "Value error,"
prefix, a traceback. tests/conftest.py checks the output of every CLI run in the tests with `problems`."""

from __future__ import annotations

FORBIDDEN = ("{'", "['", "Value error,", "Traceback (most recent call last)")


def problems(*outputs: str | bytes | None) -> list[str]:
    """The forbidden texts in a CLI run's outputs, each with the text around it."""
    found = []
    for output in outputs:
        text = output.decode(errors="replace") if isinstance(output, bytes) else output or ""
        for forbidden in FORBIDDEN:
            at = text.find(forbidden)
            if at >= 0:
                found.append(f"{forbidden!r} in: ...{text[max(0, at - 200):at + 200]}...")
    return found
