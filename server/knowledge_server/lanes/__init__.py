"""Adapters that put the lane stores behind the coordinator's Lane interface."""
