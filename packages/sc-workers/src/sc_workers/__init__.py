"""sc_workers."""
