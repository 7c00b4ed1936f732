"""The leader daemon (``labq leader``): one per lab, the single writer of the store.

Services over one in-memory state, the HTTP server and its routes, settings and the start-up in
``main``. Nothing here is imported by the core, the agent or the TUI (tests/unit/test_layers.py).
"""
