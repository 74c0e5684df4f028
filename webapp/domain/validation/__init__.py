"""Checking checkpoints: integrity of the bytes, then what the files contain."""
