"""Layouts and transports: Python enums whose values come from the C header (via stria.capi)."""

from __future__ import annotations

import enum
from typing import Union

from . import capi


class Layout(enum.IntEnum):
    """How a rank's L = S/N tokens map to global positions (DESIGN.md, "Layouts").

    CONTIGUOUS: rank r holds positions r*L .. r*L+L-1 (unbalanced under a causal mask).
    STRIPED: local token i of rank r is position i*N + r (balanced; the default).
    ZIGZAG: rank r holds chunks r and 2N-1-r of 2N chunks (balanced; needs S % 2N == 0).
    """

    CONTIGUOUS = capi.STRIA_LAYOUT_CONTIGUOUS
    STRIPED = capi.STRIA_LAYOUT_STRIPED
    ZIGZAG = capi.STRIA_LAYOUT_ZIGZAG

    @classmethod
    def of(cls, value: LayoutLike) -> Layout:
        """A Layout from a Layout, its name ("striped", any case) or its C value."""
        return _parse(cls, value, "layout")


class Transport(enum.IntEnum):
    """How ranks exchange K/V blocks: in-process threads, UCX (hosts) or NCCL (GPUs)."""

    LOCAL = capi.STRIA_TRANSPORT_LOCAL
    UCX = capi.STRIA_TRANSPORT_UCX
    NCCL = capi.STRIA_TRANSPORT_NCCL

    @classmethod
    def of(cls, value: TransportLike) -> Transport:
        """A Transport from a Transport, its name ("ucx", any case) or its C value."""
        return _parse(cls, value, "transport")


LayoutLike = Union[Layout, str, int]
TransportLike = Union[Transport, str, int]


def _parse(cls, value, what):
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            return cls[value.upper()]
        except KeyError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        # An unknown number goes through: the library reports it with its own message.
        try:
            return cls(value)
        except ValueError:
            return value
    names = ", ".join(repr(m.name.lower()) for m in cls)
    raise ValueError(f"unknown {what} {value!r} (expected one of {names}, or a stria.{cls.__name__})")
