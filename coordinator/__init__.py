"""The coordinator role: aggregation (decode, mean, outer Nesterov), epoch advancement, and the coordinator node."""
