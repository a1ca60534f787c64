"""Energy sources: the only code that touches hardware interfaces.

Files are named ``<technology>_<mechanism>`` (``rapl_sysfs``, ``rapl_msr``, ``ipmi_dcmi``,
``redfish``, ``nvml``). Each module provides a class implementing :class:`~measurement.sources.base.Source`.
"""
