"""sc_core."""
