"""The benchmark harness (not part of the package, not run by the test suite).

``bash bench/run.sh [--quick] [--only a,b] [--reps N]`` runs every scenario against one
PostgreSQL, prints a markdown table and writes plots; see docs/benchmarks.md.
"""
