"""commit."""
