"""A warm-up cell is an e2e cell whose warm-up step count is an axis: the same measurement."""

from cs336sys.studies.e2e.measure import measure

__all__ = ["measure"]
