"""Conversations domain: stored chat history and the four history modes."""
