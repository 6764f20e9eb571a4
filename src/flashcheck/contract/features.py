"""The names of the attention variants (their meaning is :mod:`flashcheck.features.variant`'s): the keywords
a kernel may take, how ALiBi slopes make a bias, and where a cap and a bias meet. Torch-free, for what a
command line reads before it imports torch."""

__all__ = ["FEATURES", "ALIBI_MODES", "BIAS_ORDERS"]

# In the order a kernel receives them; each is declared by the spec flag of the same name (ALiBi: ``alibi``).
FEATURES = ("softcap", "alibi_slopes", "attn_bias", "window", "chunk", "sinks")
ALIBI_MODES = ("symmetric", "linear")
BIAS_ORDERS = ("cap_first", "bias_first")
