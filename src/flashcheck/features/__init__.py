"""The features of the attention problem beyond plain softmax attention, one module each (a cap,
biases, restrictions of the keys, sinks), each declaring itself in one
:class:`~flashcheck.features.base.Feature`; :mod:`.registry` lists them, and :mod:`.variant` holds the
:class:`~flashcheck.features.variant.Variant` record of a case's features (``flashcheck.Variant``). The serving
forms (packed sequences, a paged KV cache, split-KV) are one module each too, each declaring a
:class:`~flashcheck.features.forms.Form`, which :mod:`.forms` lists."""
