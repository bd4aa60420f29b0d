"""Content addressing: the stores that put and get bytes by CID (backends.py) and the UnixFS
encoding that makes those CIDs the ones `ipfs add` gives (unixfs.py)."""
