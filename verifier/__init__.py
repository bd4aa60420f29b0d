"""The verifier role: step replay, trace and proof checks, audit sampling, and the verifier node."""
