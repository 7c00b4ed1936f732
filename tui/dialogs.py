"""Small modal screens: confirm, ask for one value, and the submit form.

Questions quote names (``Cancel reservation NAME?``): they are shown escaped and as text, never as
markup. So are the values a form starts with (a resubmitted job's name and command): a control
character in them shows as ``\\n`` or ``\\x1b``, and is submitted so unless the user edits it.
"""

from __future__ import annotations

import os

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from labq.models.spec import BY_NAME
from labq.terminal_text import escape_controls


class Confirm(ModalScreen[bool]):
    """Yes or no; y/n/Enter/Esc."""

    BINDINGS = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text(escape_controls(self.question)), classes="question")
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", id="no")

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class Ask(ModalScreen[str | None]):
    """One line of input; Enter answers, Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, question: str, value: str = "", placeholder: str = "") -> None:
        super().__init__()
        self.question, self.value, self.placeholder = question, value, placeholder

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(Text(escape_controls(self.question)), classes="question")
            yield Input(self.value, placeholder=self.placeholder, id="answer")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SubmitForm(ModalScreen[dict | None]):
    """A new job: command, GPUs, class, time limit, name, folder; the answer is a submit body. Each field but
    the command is a field of the job's spec (``labq.models.spec``), labelled and read as its declaration says."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]
    #: the form's keys, the spec's fields they are, and what each shows while empty
    SPEC = (("gpus", "gpus", "1"), ("class", "priority", "normal"), ("time", "time_limit_s", "6h (empty: none)"),
            ("name", "name", ""), ("workdir", "workdir", "empty: the current folder"))
    FIELDS = (("command", "command (as in a shell)", "python train.py --lr 3e-4"),
              *((key, BY_NAME[name].label, hint) for key, name, hint in SPEC))

    def __init__(self, values: dict | None = None) -> None:
        super().__init__()
        self.values = values or {}

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog form"):
            yield Label("submit a job (Enter in the last field submits; Esc cancels)", classes="question")
            with Grid(classes="fields"):
                for key, label, hint in self.FIELDS:
                    yield Label(label)
                    yield Input(escape_controls(self.values.get(key, "")), placeholder=hint, id=f"f-{key}")
            yield Static("", id="form-error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Submit", variant="primary", id="submit")
                yield Button("Cancel", id="cancel")

    def body(self) -> dict:
        """The submit body, or ValueError saying which field is wrong."""
        import shlex

        from labq import spec_text
        from labq.protocol.requests import submit_request

        get = {key: self.query_one(f"#f-{key}", Input).value.strip() for key, _, _ in self.FIELDS}
        if not get["command"]:
            raise ValueError("command: say what to run")
        values = {}
        for key, name, _ in self.SPEC:
            field = BY_NAME[name]
            if get[key]:
                try:
                    values[name] = spec_text.read(field, get[key])
                except ValueError as err:  # it names the flag: the form names its own field
                    raise ValueError(f"{field.label}: {str(err).removeprefix(field.flag or '').lstrip(': ')}") \
                        from None
        # as `labq submit` does: the folder the TUI runs in, a relative folder from there, ~ expanded
        values["workdir"] = os.path.abspath(os.path.join(os.getcwd(), os.path.expanduser(get["workdir"] or ".")))
        return submit_request(shlex.split(get["command"]), **values)

    @on(Input.Submitted)
    @on(Button.Pressed, "#submit")
    def submit(self) -> None:
        try:
            self.dismiss(self.body())
        except ValueError as err:
            self.query_one("#form-error", Static).update(Text(escape_controls(err)))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
