"""Shared contracts: metric names (``names``), the YAML reader (``documents``), site files and
carbon-intensity series (``sitefile``), live carbon-intensity APIs (``carbon_apis``), the
NADIKI server objects (``nadiki``) and their reading back by a tenant (``nadiki_read``), and
the generated metrics reference (``docgen``), the commands' bounded numbers (``cliargs``).

Error hierarchy::

    ContractError                 root of the errors this package defines (``contracts/errors.py``)
    ├── CarbonApiError            a live carbon-intensity API failed or answered nonsense
    ├── NadikiReadError           the registrar or InfluxDB could not be read
    ├── SeriesFileError           a carbon-intensity series file is wrong
    └── documents.DuplicateKeys   a YAML document gives a mapping key twice

    policy.errors.ConfigError     a document (config, site file) cannot be read, parsed or
                                  validated: what :func:`documents.read_yaml` and
                                  :func:`sitefile.load_site_file` raise

``ConfigError`` stays the one class for "a document failed validation" in every part, because the
documents are validated by :class:`policy.validate.Checker`, which raises it, and every command
line reports it the same way; contracts does not wrap it in a class of its own.
"""

from joulesched.contracts.errors import CarbonApiError, ContractError, NadikiReadError, SeriesFileError

__all__ = ["CarbonApiError", "ContractError", "NadikiReadError", "SeriesFileError"]
