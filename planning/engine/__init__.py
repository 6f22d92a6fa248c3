"""The planning engine: pure functions from model text to validated, schedulable plans."""
