"""The veriloco shell: the command line, the demo and the devnet. The only package that imports the roles."""
