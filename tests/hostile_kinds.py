"""The hostile-input table's two axes: kinds of hostile values, and public parameters.

Every public parameter is declared once as a ``Param`` (in tests/hostile_*.py modules: each
exposes ``PARAMS: list[Param]``); the battery crosses each with every hostile kind in
``KINDS``. A kind the parameter accepts as a valid spelling (numpy ints for an int, a
generator for a sequence, ``None`` for an optional) is listed in ``valid`` and must be
accepted; every other kind must raise ``error`` (a TmaflowError subclass) whose message names
the parameter (``field`` pattern), never crash, hang or pass silently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


def _generator():
    return (v for v in (8, 8))


# name -> a factory of the hostile value (a factory: generators and arrays are single-use or
# mutable, and each case gets a fresh one).
KINDS: dict[str, Callable[[], object]] = {
    "none": lambda: None,
    "str": lambda: "8",
    "empty_str": lambda: "",
    "bytes": lambda: b"\x08",
    "bool": lambda: True,
    "np_bool": lambda: np.bool_(True),
    "float": lambda: 2.5,
    "integral_float": lambda: 128.0,
    "nan": lambda: float("nan"),
    "inf": lambda: float("inf"),
    "np_float": lambda: np.float32(2.0),
    "zero": lambda: 0,
    "negative": lambda: -1,
    "huge": lambda: 2**64,
    "np_int": lambda: np.int64(8),
    "np_uint_huge": lambda: np.uint64(2**63 + 8),
    "tuple": lambda: (8, 8),
    "nested": lambda: ((8, 8), (8, 8)),
    "generator": _generator,
    "ndarray_2d": lambda: np.ones((2, 2), dtype=np.int64),
    "dict": lambda: {"a": 8},
    "object": lambda: object(),
    "complex": lambda: 1 + 2j,
    "surrogate_str": lambda: "a\ud800",
    "newline_str": lambda: "name\n",
}


@dataclass(frozen=True)
class Param:
    """One public parameter: ``call(value)`` calls ``function`` with every other argument
    valid and this one set to ``value``. ``valid`` names the kinds that are valid spellings
    (the call must then succeed, or raise only for a reason unrelated to the value's type,
    given by ``valid_error``); any other kind must raise ``error`` with a message matching
    ``field`` (the parameter's name as the message spells it, a regex)."""

    function: str
    name: str
    call: Callable[[object], object]
    valid: frozenset = frozenset()
    error: type = Exception  # narrowed to the TmaflowError subclass expected
    field: str = ""          # regex; defaults to re.escape(name)
    gpu: bool = False        # the call needs a device
    skip: frozenset = frozenset()  # kinds not meaningful here (say why in a comment)
    valid_error: str = ""    # regex: the unrelated error a valid kind may still meet (e.g. a rank
                             # mismatch with another argument); empty: valid kinds must succeed
