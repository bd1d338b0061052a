"""The README's and the guides' code blocks, each run as a reader would paste it."""
