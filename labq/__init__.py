"""labq: a shared GPU job queue for small research labs."""

__version__ = "0.1.0"
