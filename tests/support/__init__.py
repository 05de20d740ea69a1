"""Helpers shared by the test suite (test-only: nothing here ships with tritonshm)."""
