"""A convention a spec declares as a record (MLA's cached row, sparse index sets, block lists): the one rule that
turns what a user wrote into the record or an error naming the field."""

from __future__ import annotations

from ..errors import InvalidArgument

__all__ = ["declared_record"]


def declared_record(argument: str, value, record: type, default, fix: str):
    """``value`` as a ``record``: None or False (none), True (``default``), a record, or a mapping of its fields."""
    if value is None or value is False:
        return None
    if value is True:
        return default
    if isinstance(value, record):
        return value
    if isinstance(value, dict) and set(value) <= set(record.__dataclass_fields__):
        return record(**value)
    raise InvalidArgument(argument, value, f"expected True, a {record.__name__} or a dict of its fields", fix)
