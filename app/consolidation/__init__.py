"""The durable job queue, the consolidation pipeline, its prompts and the offline engine."""
