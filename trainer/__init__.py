"""The trainer role: the DiLoCoX inner loop, the compressor, one-step-delay bookkeeping, pipeline stages, and the trainer node."""
