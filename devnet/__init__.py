"""Local infrastructure for development and tests: py-evm over JSON-RPC, anvil and js-ipfs launchers,
and the devnet that starts them and deploys the contract. Imports `protocol` only; `veriloco`'s CLI
runs it (`veriloco devnet`)."""
