"""Cost terms of the amp-search model: pure functions of numbers, one term per function.

This package imports nothing from `amp_search` (the planner depends on it, not the reverse).
"""
