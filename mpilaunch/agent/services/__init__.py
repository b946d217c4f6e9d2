"""Rank-facing services of the agent: PMI flavours and guards (see base.py, registry.py)."""
