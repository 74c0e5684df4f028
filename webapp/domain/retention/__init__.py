"""Which checkpoints go, and deleting their local files inside the allowed roots."""
