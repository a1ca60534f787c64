"""The NADIKI Server Registry API's objects: defined once in :mod:`contracts.nadiki`, which the
provider half (this package) and the tenant half (the extender's and the report's NADIKI
readers) share."""

from joulesched.contracts import nadiki
from joulesched.contracts.nadiki import *  # noqa: F403

__all__ = nadiki.__all__
