"""Durable persistence of the leader's state (labq.store)."""
