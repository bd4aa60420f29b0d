"""The DiLoCoX math every role runs: the inner step (AdamW, block by block), the compressor, the start
rules, the schedule, the outer optimizer and the aggregation. Trainers train with it, verifiers and
the coordinator replay it; no module here knows about nodes, chains or stores."""
