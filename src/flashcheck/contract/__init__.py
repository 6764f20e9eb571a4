"""What a kernel is promised and promises: dtype formats and devices, precision contracts, counts, the calling
convention, masks, the kernel spec."""
