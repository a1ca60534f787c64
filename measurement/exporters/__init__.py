"""Exporters: they read snapshots and nothing else (Prometheus text, the profile JSON, recordings)."""
