"""flashcheck inside a kernel author's own tests: the pytest run's session, assert_passes, property_test."""
