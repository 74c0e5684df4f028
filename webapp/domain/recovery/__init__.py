"""Back from a checkpoint: restore tests, the loader, and resumes."""
