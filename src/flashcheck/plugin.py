"""pytest plugin of flashcheck (loaded through the ``pytest11`` entry point)."""
