# Test stub of the sglang package: only the names the mla plugin uses.
__version__ = "0.5.2"
