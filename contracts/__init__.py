"""Shared contracts: metric names (``names``), the YAML reader (``documents``), site files and
carbon-intensity series (``sitefile``), live carbon-intensity APIs (``carbon_apis``), and the
generated metrics reference (``docgen``).

Error hierarchy::

    ContractError                 root of the errors this package defines (``contracts/errors.py``)
    └── SeriesFileError           a carbon-intensity series file has bad lines or fields (every
                                  problem listed; a site file reports it as a ConfigError)
    └── CarbonApiError            a carbon-intensity API request failed (transport, deadline,
                                  status, JSON shape); the live source keeps its last data and
                                  raises policy.site.IntensityUnavailable once that is too old

    policy.errors.ConfigError     a document (config, site file) cannot be read, parsed or
                                  validated: what :func:`documents.read_yaml` and
                                  :func:`sitefile.load_site_file` raise

``ConfigError`` stays the one class for "a document failed validation" in every part, because the
documents are validated by :class:`policy.validate.Checker`, which raises it, and every command
line reports it the same way; contracts does not wrap it in a class of its own.
"""

from joulesched.contracts.errors import CarbonApiError, ContractError, SeriesFileError

__all__ = ["CarbonApiError", "ContractError", "SeriesFileError"]
