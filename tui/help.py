"""``?``: the keys that work on the screen below (its focused widget's, its own, the app's), each key once."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

FILTERS = """filters (/): user:alice  state:running  node:ws1  class:high  name:bert  id:12  free text
             a leading ! negates a word (!state:held); all words must hold
sort (o then a letter): i id, u user, n name, s state, c class, g gpus, p placement, t time, r reason
             a capital letter reverses
sort (one capital letter): I id, U user, N name, S state, C class, D gpus, O node, T time, W reason;
             the same letter again reverses
the strip over the queue: each GPU's index, memory used and utilisation in % (bars; - where not
             measured), and who holds it: user #job, free, or busy (a process labq did not start)"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close")]

    def __init__(self, below: Screen) -> None:
        super().__init__()
        self.below = below

    def compose(self) -> ComposeResult:
        lines = [f"keys on this screen ({type(self.below).__name__.removesuffix('Screen').lower()}):"]
        listed = keys_that_work(self.below)
        for keys, what in listed:
            lines.append(f"  {', '.join(self.app.get_key_display(Binding(key, '')) for key in keys):<22} {what}")
        taken = {key for keys, _ in listed for key in keys}
        lines += [f"  {shown:<22} {what}" for key, shown, what in EXTRA if key not in taken]
        lines += ["", FILTERS if type(self.below).__name__ == "QueueScreen" else ""]
        with VerticalScroll(classes="dialog help"):
            yield Static("\n".join(lines))


#: keys every screen has that no binding of labq's declares (unless the screen binds them to something else)
EXTRA = (("ctrl+p", "ctrl+p", "command palette: every action by name"), ("escape", "esc", "back"))


def keys_that_work(screen: Screen) -> list[tuple[list[str], str]]:
    """(keys, what they do) for the bindings of the focused widget, of the screen and of the app that a key
    press on ``screen`` reaches, in that order.

    A key bound in more than one of them is listed once, for the binding Textual runs (the focused widget's
    before the screen's before the app's: the log's ``n`` is "next match", not the app's "nodes"); a
    binding the screen turns off or dims for now (``check_action``) is left out.
    """
    active = screen.active_bindings
    focused = screen.focused
    widget_keys = [b for b in getattr(focused, "BINDINGS", ()) if isinstance(b, Binding) and b.description]
    listed: list[tuple[list[str], str]] = []
    seen: set[str] = set()
    for binding in [*widget_keys, *screen.BINDINGS, *screen.app.BINDINGS]:
        if not isinstance(binding, Binding):
            continue
        works = [one for one in Binding.make_bindings([binding]) if one.key not in seen and _runs(active, one)]
        if works:
            seen.update(one.key for one in works)
            listed.append(([one.key for one in works], binding.description or binding.action))
    return listed


def _runs(active: dict, binding: Binding) -> bool:
    """Whether a press of ``binding.key`` runs ``binding``, which is enabled now."""
    now = active.get(binding.key)
    return now is not None and now.enabled and (now.binding.action, now.binding.description) == (
        binding.action, binding.description)
