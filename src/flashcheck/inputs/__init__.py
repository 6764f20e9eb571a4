"""What a kernel is given: regimes, hypothesis strategies over recipes, presets, the case, its memory layouts,
the saved-case format."""
