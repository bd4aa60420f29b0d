"""The trainer role: the trainer node, its engines (one process or pipeline stages), checkpoints, the answer log and audit answers."""
