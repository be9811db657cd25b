"""Folders domain: the `user-memory` folder tree and the one access check over its ACL."""
