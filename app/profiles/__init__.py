"""User memory profiles: the memory.md document, its update operations and its size control."""
