"""What every veriloco role shares: hashing and digests, Merkle traces, formats, chain and store."""
