"""Erasure: `DELETE /v1/me` forgets everything the service holds about the caller, in one
transaction, leaving one audit event with the counts."""
