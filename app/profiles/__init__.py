"""Profiles domain."""
