"""The coordinator role: epoch advancement, building the verified global model, and the coordinator node."""
