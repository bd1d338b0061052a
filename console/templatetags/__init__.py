"""The console's template tags."""
