"""The contract binding: calls, events and their errors (binding.py, errors.py), audit sampling and
proofs as the contract checks them (audit.py), and riding out an outage of the chain or the store."""
