"""The orchestrator's two calls per chat turn: load/inject and turn-save."""
