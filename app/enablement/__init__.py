"""Effective enablement of context memory: company flags, space and user settings."""
