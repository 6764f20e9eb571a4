"""Options records: a public function's options as one frozen dataclass, taken whole, as keywords or both
(``recipes(options, max_n=64)``, ``check_merge(merge, cases=8)``), and checked once, where the record is made.

A record derives from :class:`Options`; the function takes ``(options=None, **keywords)`` and reads
``Record.of(options, keywords)``. :func:`keywords_of` gives such a function the signature its callers see
(``help()``, :func:`inspect.signature`): each field as a keyword with its default.
"""

from __future__ import annotations

import dataclasses
import inspect

from ..errors import InvalidArgument

__all__ = ["OptionError", "Options", "keywords_of"]


class OptionError(InvalidArgument, TypeError):
    """A keyword that names no option, or options of the wrong kind: the TypeError Python gives an unexpected
    keyword, which says what is known."""


class Options:
    """Base of a frozen dataclass of options."""

    @classmethod
    def of(cls, options, keywords: dict):
        """``options`` (None: the defaults) with the fields ``keywords`` names replaced."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [name for name in keywords if name not in known]
        if unknown:
            raise OptionError(unknown[0], keywords[unknown[0]], f"not an option of {cls.__name__}",
                              f"Use one of {known}.")
        if options is not None and not isinstance(options, cls):
            raise OptionError("options", options, f"expected a {cls.__name__} or None",
                              f"Pass {cls.__name__}(...), or its fields as keywords.")
        return dataclasses.replace(options or cls(), **keywords)


def keywords_of(record: type[Options]):
    """Decorate a function whose ``**keywords`` are ``record``'s fields: its signature lists them, keyword-only,
    with their defaults, in place of ``**keywords``."""
    def decorate(function):
        signature = inspect.signature(function)
        kept = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        fields = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                    annotation=f.type) for f in dataclasses.fields(record)]
        function.__signature__ = signature.replace(parameters=kept + fields)
        return function

    return decorate
