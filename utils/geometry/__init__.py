"""Plane geometry the tasks share: rotated boxes (utils/geometry/rotated.py)."""
