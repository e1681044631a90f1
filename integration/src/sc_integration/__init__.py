"""sc integration."""
