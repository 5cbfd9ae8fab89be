"""Morphogen: two-server page PIR, wire-compatible with the morphogenesis protocol."""
