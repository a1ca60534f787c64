"""The commands' bounded numbers: one ``argparse`` type for every flag that takes one.

``number(above=0, unit="seconds")`` is a ``type=`` for ``add_argument``: it accepts a finite
number (a whole one with ``whole=True``) within the bounds given and refuses anything else with
one message in one form, which argparse prints as a usage error (exit 2) naming the flag::

    joulesched report: error: argument --timeout: must be a finite number > 0 seconds, got 'nan'

NaN and infinities are refused whatever the bounds: no flag of joulesched means "unbounded" by
``inf``, and a NaN compares false with every bound, so it would pass a check written as a
negated comparison.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def bounds_text(
    *, above: float | None = None, at_least: float | None = None, below: float | None = None, at_most: float | None = None
) -> str:
    """``> 0``, ``>= 1``, ``>= 0.1 and <= 60``: the bounds as the messages write them."""
    parts = [(">", above), (">=", at_least), ("<", below), ("<=", at_most)]
    return " and ".join(f"{op} {bound:g}" for op, bound in parts if bound is not None)


def number(
    *,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    at_most: float | None = None,
    whole: bool = False,
    unit: str = "",
) -> Callable[[str], float]:
    """An argparse ``type=``: the flag's text as a finite number within the bounds (an ``int``
    with ``whole``), else ``argparse.ArgumentTypeError`` saying what it must be and what it got."""
    wanted = " ".join(
        w
        for w in (
            "a whole number" if whole else "a finite number",
            bounds_text(above=above, at_least=at_least, below=below, at_most=at_most),
            unit,
        )
        if w
    )

    def convert(text: str) -> float:
        try:
            value: float = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        ok = (
            math.isfinite(value)
            and (above is None or value > above)
            and (at_least is None or value >= at_least)
            and (below is None or value < below)
            and (at_most is None or value <= at_most)
        )
        if not ok:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    convert.__name__ = "whole number" if whole else "number"  # argparse's word for the type, should it ever name it
    return convert


# A grid's carbon intensity in gCO2e/kWh given on the command line (measure, report,
# weblog-report): no grid averages past about 1,100 (lignite), so a figure above this bound is a
# unit slip (g/MWh, or kg for g), refused rather than taken.
MAX_GRID_INTENSITY = 5000.0
INTENSITY = number(at_least=0, at_most=MAX_GRID_INTENSITY, unit="gCO2e/kWh")
