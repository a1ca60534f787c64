"""Shared contracts."""
