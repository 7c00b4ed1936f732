"""What every screen shares with the app: the footer of keys, and the message an action's answer comes back in.

The screens take these from here, not from ``labq.tui.app``: the app opens the screens, so a screen that
imported the app would tie the two into a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Footer
from textual.widgets._footer import FooterKey


@dataclass
class ActionDone(Message):
    """The answer to an action: what happened, or the leader's error."""

    text: str
    error: bool = False


class KeyFooter(Footer):
    """The footer, legible at 80 columns: the screen's keys in their order, as many as fit whole, then always
    ``? help`` (which lists every key) and ``q quit``. A key hidden by ``check_action`` (read-only) is left out."""

    ALWAYS = ("help", "quit")

    def __init__(self) -> None:
        super().__init__(compact=True, show_command_palette=False)
        self.laid_out_for = 0  #: the width the keys were chosen for

    def compose(self) -> ComposeResult:
        width = self.size.width or self.app.size.width
        self.laid_out_for = width
        keys: dict[str, tuple[Binding, bool, str]] = {}
        for _, binding, enabled, tooltip in self.screen.active_bindings.values():
            if binding.show and binding.action not in keys:
                keys[binding.action] = (binding, enabled, tooltip)
        always = [keys.pop(action) for action in self.ALWAYS if action in keys]
        room = width - sum(self._width(binding) for binding, _, _ in always)
        shown = []
        for item in keys.values():
            room -= self._width(item[0])
            if room < 0:
                break
            shown.append(item)
        for binding, enabled, tooltip in [*shown, *always]:
            yield FooterKey(binding.key, self.app.get_key_display(binding), binding.description, binding.action,
                            disabled=not enabled, tooltip=tooltip).data_bind(compact=Footer.compact)

    def _width(self, binding: Binding) -> int:
        """The cells a key takes in the compact footer: the key, a space, what it does, a space after."""
        return cell_len(self.app.get_key_display(binding)) + cell_len(binding.description) + 2

    def on_resize(self) -> None:
        if self.size.width != self.laid_out_for:
            self.call_after_refresh(self.recompose)
