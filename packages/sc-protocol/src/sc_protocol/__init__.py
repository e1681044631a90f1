"""sc_protocol."""
