"""The ``flashcheck`` command (:func:`main`), one module per subcommand. Nothing here imports torch."""

from .main import main

__all__ = ["main"]
