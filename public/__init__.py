"""What every role reads about a run from public data alone: the rank/H schedule derived from the chain and
the store (`schedule`), and the verified global models recomputed from G_0 and the passing payloads
(`globals`). Trainers, verifiers and the coordinator are peers over this room and import none of each
other; `dilocox/` below it stays the math they replay, with no chain, store or run in it."""
