"""sc_ray."""
