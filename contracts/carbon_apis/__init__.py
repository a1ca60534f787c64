"""Live carbon-intensity sources: the APIs operators use, beside the CSV series of ``sitefile``.

One small adapter per provider, each a :class:`policy.site.CarbonIntensitySource` (``name``,
``at(t)``, ``integral(a, b)``) for past, present and — where the API forecasts — future times:

===================== ======================== ==========================================
provider              module                   what it gives
===================== ======================== ==========================================
electricity_maps      ``electricity_maps.py``  a zone's average intensity, history, forecast
watttime              ``watttime.py``          a region's marginal rate (MOER), history,
                                               forecast; lbs/MWh converted to g/kWh
uk_carbon_intensity   ``uk_grid.py``           Great Britain, national or regional,
                                               half-hourly, forecast 48 h ahead
===================== ======================== ==========================================

Caching, deadlines and the stale rule are shared (``base.py``, described there). A site file
names a provider in its ``carbon_api`` section (``contracts/sitefile.py``, docs/carbon.md);
:func:`open_source` builds the source from those settings.
"""

from __future__ import annotations

from typing import Any

from joulesched.contracts.carbon_apis.base import ApiSettings, LiveIntensity, Reading, Secret, live_source
from joulesched.contracts.carbon_apis.electricity_maps import ElectricityMaps
from joulesched.contracts.carbon_apis.uk_grid import UkCarbonIntensity
from joulesched.contracts.carbon_apis.watttime import WattTime

PROVIDERS: dict[str, type[LiveIntensity]] = {
    ElectricityMaps.provider: ElectricityMaps,
    WattTime.provider: WattTime,
    UkCarbonIntensity.provider: UkCarbonIntensity,
}


def open_source(settings: ApiSettings, **options: Any) -> LiveIntensity:
    """The live source of ``settings.provider`` (``options``: ``clock``, ``get``, ``spawn`` of
    :class:`LiveIntensity`); nothing is fetched until it is first asked."""
    return PROVIDERS[settings.provider](settings, **options)


__all__ = ["PROVIDERS", "ApiSettings", "LiveIntensity", "Reading", "Secret", "live_source", "open_source"]
