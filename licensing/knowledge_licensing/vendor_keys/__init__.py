"""Vendor public keys (``<key_id>.pub``) shipped as package data: the production trust anchors."""
