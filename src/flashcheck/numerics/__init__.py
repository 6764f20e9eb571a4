"""The numbers that judge a kernel: the float64 oracle with its certified bound, exact gradients, the error
budgets, the precision-faithful twin."""
