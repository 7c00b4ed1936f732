"""The Textual terminal UI (labq.tui)."""
