# Test stub of the sglang package: only the names the mla plugin uses (copied from SGLang 0.5.x).
__version__ = "0.5.2"
