"""``?``: the keys of the screen below, and of the app."""

from __future__ import annotations

from dataclasses import replace

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

FILTERS = """filters (/): user:alice  state:running  node:ws1  class:high  name:bert  id:12  free text
             a leading ! negates a word (!state:held); all words must hold
sort (o then a letter): i id, u user, n name, s state, c class, g gpus, p placement, t time, r reason
             a capital letter reverses"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close")]

    def __init__(self, below: Screen) -> None:
        super().__init__()
        self.below = below

    def compose(self) -> ComposeResult:
        lines = [f"keys on this screen ({type(self.below).__name__.removesuffix('Screen').lower()}):"]
        focused = self.below.focused
        widget_keys = [b for b in getattr(focused, "BINDINGS", ()) if isinstance(b, Binding) and b.description]
        for binding in [*widget_keys, *self.below.BINDINGS, *self.app.BINDINGS]:
            if isinstance(binding, Binding):
                keys = ", ".join(self.app.get_key_display(replace(binding, key=k)) for k in binding.key.split(","))
                lines.append(f"  {keys:<22} {binding.description or binding.action}")
        lines += ["  ctrl+p                 command palette: every action by name", "  esc                    back",
                  "", FILTERS if type(self.below).__name__ == "QueueScreen" else ""]
        with VerticalScroll(classes="dialog help"):
            yield Static("\n".join(lines))
