"""The veriloco shell: the command line, the demo and the simulation. The only package that imports the roles."""
