"""Context Memory Service: memory as a service for AI chat orchestrators."""
