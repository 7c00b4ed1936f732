"""labq: a shared GPU job queue for small research labs."""

import os as _os

__version__ = "0.1.0"

# In a checkout, agent/, store/ and tui/ sit beside labq/ and are labq.agent, labq.store and labq.tui (a built
# wheel has them inside labq/, by pyproject's package-dir). So that a plain path entry serves a checkout (the
# .pth file of install.sh's editable install, PYTHONPATH), labq's subpackages are also looked for in the
# checkout's folder, after labq/ itself: two stats here, where an import hook would cost every Python start in
# the venv about 10 ms.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if (not _os.path.isdir(_os.path.join(__path__[0], "store"))
        and _os.path.isfile(_os.path.join(_checkout, "store", "tinydb_store.py"))):
    __path__.append(_checkout)
del _checkout
