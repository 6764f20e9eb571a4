"""From a kernel's output to a verdict: the comparison with the budget, the envelope, the exact properties, the
backward check, diagnoses."""
