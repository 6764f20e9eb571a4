"""flashcheck judged by planted bugs and correct kernels, beside the field's usual rules."""
