"""Fault-injection suite: a Jepsen-style checker, cancellation fuzzing, bad input."""
