"""flashcheck's own Triton flash-attention kernel (forward, backward, compile cache) and the planted bugs that
edit its source."""
