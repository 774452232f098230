"""Engine adapters (SGLang, vLLM): thin layers over mla's ops; each module imports its engine
only when used."""
import importlib


def first_missing(names):
    """The first "module.name" of names (pairs) that does not import or is absent, else None."""
    for module, name in names:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            found = None
        if found is None:
            return f"{module}.{name}"
    return None
