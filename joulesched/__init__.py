"""joulesched: an energy-aware scheduler extender for Kubernetes.

This package holds only the ``joulesched`` command line (and ``configdoc``, which renders the
config tables in docs/); the parts live in ``extender``, ``measurement``, ``policy`` and ``sim``.
"""

__version__ = "0.1.0"
