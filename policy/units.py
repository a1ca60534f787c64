"""Unit conversions shared by every part (constants only).

``JOULES_PER_KWH``: 1 kWh = 1000 W × 3600 s = 3.6e6 J. Joules divided by it are kWh; joules times
a carbon intensity in gCO2e/kWh divided by it are grams.
"""

from __future__ import annotations

JOULES_PER_KWH = 3.6e6
