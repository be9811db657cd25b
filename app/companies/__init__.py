"""Companies as records: the registry of the companies the service serves, the platform-level
log that outlives them, and the durable records of their offboardings."""
