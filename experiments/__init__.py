"""Command-line entry points: run (sweep), report (re-derive tables/plots of a run)."""
