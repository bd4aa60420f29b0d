"""Canonical bytes: the generic codec and its size limits (codec.py), the pseudo-gradient payload
(payload.py) and the JSON nesting bound (jsondepth.py)."""
