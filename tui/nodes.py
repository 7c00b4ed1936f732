"""``n``: the nodes, one at a time: each GPU and who uses it, the node's health and lease, its link matrix.

The top line lists every node with its health; ``[`` and ``]`` (or the arrows) move between them. The
screen redraws when the leader says the nodes or the jobs changed (a job's start or end brings the nodes
too: who holds which GPU), and as the app's clock ticks, for the lease age: the time since the node's last
report, which the app asks for every few seconds.
Node names, GPU models and users are shown escaped (``escape_controls``), as text, never as markup.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Static

from labq.render.nodes import gpu_rows, models_text, sharing_text, topology_text
from labq.render.tables import format_duration, table
from labq.terminal_text import escape_controls
from labq.tui.common import KeyFooter

HEALTH_STYLES = {"up": "green", "draining": "yellow", "down": "dim", "lost": "bold red", "not admitted": "magenta"}
GRID_WIDTH = 78  #: 80 columns less the padding
LINK_LEGEND = ("NV<n>: n NVLink links; else PCIe: PIX one switch, PXB several, PHB host bridge, "
               "NODE same NUMA node, SYS across sockets")


class NodesScreen(Screen):
    DEFAULT_CSS = """
    NodesScreen #node-head, NodesScreen #gpu-grid, NodesScreen #link-matrix {
        padding: 0 1;
        height: auto;
    }
    NodesScreen #gpu-grid, NodesScreen #link-matrix {
        margin-top: 1;
    }
    """
    BINDINGS: ClassVar[list[Binding]] = [Binding("escape", "app.pop_screen", "back"),
                Binding("left_square_bracket,left", "previous_node", "prev node"),
                Binding("right_square_bracket,right", "next_node", "next node")]
    #: (title, help, method) for the command palette
    COMMANDS_LIST = (("Next node", "the GPUs of the next node", "action_next_node"),
                     ("Previous node", "the GPUs of the previous node", "action_previous_node"))

    node_name: reactive[str | None] = reactive(None, init=False)

    def compose(self) -> ComposeResult:
        yield Static("", id="banner")
        with VerticalScroll():
            yield Static("", id="node-head")
            yield Static("", id="gpu-grid")
            yield Static("", id="link-matrix")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.watch(self.app, "nodes_version", lambda _: self.redraw())
        self.watch(self.app, "jobs_version", lambda _: self.redraw())
        self.watch(self.app, "reservations_version", lambda _: self.redraw())
        self.watch(self.app, "connected", lambda _: self.call_after_refresh(self.redraw))  # after app.status
        self.watch(self.app, "now", lambda _: self.redraw())  # the lease age

    def watch_node_name(self) -> None:
        self.redraw()

    # -- moving between nodes -------------------------------------------------------------------

    @property
    def node(self) -> dict | None:
        """The node shown: the one chosen, or the first while none is (or the chosen one went away)."""
        nodes = self.app.nodes
        return next((n for n in nodes if n["name"] == self.node_name), nodes[0] if nodes else None)

    def _step(self, delta: int) -> None:
        names = [n["name"] for n in self.app.nodes]
        if not names:
            return
        current = self.node
        at = names.index(current["name"]) if current else 0
        self.node_name = names[(at + delta) % len(names)]

    def action_next_node(self) -> None:
        self._step(1)

    def action_previous_node(self) -> None:
        self._step(-1)

    # -- drawing --------------------------------------------------------------------------------

    def redraw(self) -> None:
        app = self.app
        node = self.node
        banner = self.query_one("#banner", Static)
        banner.set_class(not app.connected, "down")
        banner.update(node_list(app.nodes, node["name"] if node else None, self.size.width or 80)
                      if app.connected else Text(f" {app.status or 'connecting to the leader...'}"))
        if node is None:
            self.query_one("#node-head", Static).update(
                "no nodes: start `labq agent` on a workstation (or `labq up`)")
            self.query_one("#gpu-grid", Static).update("")
            self.query_one("#link-matrix", Static).update("")
            return
        now = app.clock()
        self.query_one("#node-head", Static).update(node_head(node, now))
        self.query_one("#gpu-grid", Static).update(gpu_grid(node, app.jobs, app.reservations, now))
        self.query_one("#link-matrix", Static).update(link_matrix(node.get("topology")))


def node_list(nodes: list[Mapping], current: str | None, width: int) -> Text:
    """`` nodes: ws1 up  ws2 lost`` with the node shown in reverse; nodes before it drop off when it would not fit."""
    at = next((i for i, n in enumerate(nodes) if n["name"] == current), 0)
    entries = [(escape_controls(n["name"]), escape_controls(n.get("health", "?"))) for n in nodes]
    if not entries:
        return Text(" nodes: none yet")
    first = 0
    while first < at and 8 + sum(len(a) + len(b) + 3 for a, b in entries[first:at + 1]) > width:
        first += 1
    out = Text(f" nodes {at + 1}/{len(entries)}:" + (" …" if first else ""))
    for i, (name, health) in enumerate(entries[first:], first):
        out.append(" ")
        out.append(f" {name} ", style="reverse bold" if i == at else "bold")
        out.append(health, style=HEALTH_STYLES.get(health, ""))
    return out


def node_head(node: Mapping, now: float) -> Text:
    """The node's name, health, lease age, GPUs and where it was found."""
    out = Text()
    out.append(escape_controls(node["name"]), style="bold")
    out.append("  ")
    out.append(escape_controls(node.get("health", "?")), style=HEALTH_STYLES.get(node.get("health"), ""))
    seen = node.get("last_seen")
    out.append(f"  lease age {format_duration(now - seen)}" if seen else "  never heard from")
    out.append(f"  {escape_controls(models_text(node.get('gpus') or []))}")
    if node.get("simulated"):
        out.append("  simulated", style="dim")
    found = escape_controls(" ".join(str(x) for x in (node.get("found"), node.get("address")) if x))
    out.append(f"\nlinks: {topology_text(node.get('topology'))}" + (f"  found: {found}" if found else ""))
    return out


def gpu_grid(node: Mapping, jobs: Mapping[int, Mapping], reservations: list[Mapping], now: float) -> Text:
    """One row per GPU: index, model, memory used/total, utilization, and the job on it, or why not free."""
    users = {job_id: job["spec"].get("user") for job_id, job in jobs.items()}
    reserved = {}
    for r in reservations:
        if r.get("node") == node["name"] and r["start"] <= now < r["end"]:
            reserved.update(dict.fromkeys(r.get("gpu_indices") or (), r["name"]))
    rows = []
    for g in gpu_rows([node], users):
        util = "-" if g.get("utilization_pct") is None else f"{g['utilization_pct']}%"
        if g["job"] is not None:
            job = jobs.get(g["job"]) or {}
            name = (job.get("spec") or {}).get("name") or ""
            who = f"job {g['job']}" + (f" {g['user']}" if g["user"] else "") + (f" {name}" if name else "")
        elif g.get("sharing"):
            who = sharing_text(g)
        elif g["busy_outside_labq"]:
            who = "busy (not labq)"
        else:
            who = "free"
        if g["index"] in reserved:
            who += f" [reserved: {reserved[g['index']]}]"
        rows.append([g["index"], g["model"].removeprefix("NVIDIA "), memory_text(g["memory_mib"],
                                                                                  g.get("memory_free_mib")), util, who])
    if not rows:
        return Text("this node reports no GPUs")
    headers = ("GPU", "MODEL", "MEMORY USED", "UTIL", "USED BY")
    widths = [max(len(h), *(min(len(str(r[i])), 20) for r in rows)) for i, h in enumerate(headers[:4])]
    room = max(20, GRID_WIDTH - sum(widths) - 2 * len(widths))  # what 80 columns leave for the job
    text = Text(table(headers, rows, max_width={"MODEL": 20, "USED BY": room}))
    text.stylize("bold", 0, text.plain.find("\n"))
    text.highlight_regex(r"\bfree\b", "green")
    text.highlight_regex(r"busy \(not labq\)", "yellow")
    text.highlight_regex(r"\bjob \d+", "cyan")
    return text


def memory_text(total_mib: int, free_mib: int | None) -> str:
    """``9.5/24 GiB`` used of total, ``-/24 GiB`` when the agent does not measure it."""
    used = "-" if free_mib is None else max(0, total_mib - free_mib)
    if total_mib >= 1024:
        return f"{_gib(used)}/{_gib(total_mib)} GiB"
    return f"{used}/{total_mib} MiB"


def _gib(mib: int | str) -> str:
    return mib if isinstance(mib, str) else f"{mib / 1024:.1f}".removesuffix(".0")


def link_matrix(topology: Mapping | None) -> Text:
    """The node's link matrix, as ``nvidia-smi topo -m`` prints it, under a one-line summary."""
    if not topology or not topology.get("pcie"):
        return Text("link matrix: not reported")
    from labq.protocol.codec import decode_topology

    topo = decode_topology(dict(topology))
    n = topo.size
    labels = [[topo.link_label(i, j) for j in range(n)] for i in range(n)]
    head = [f"GPU{j}" for j in range(n)]
    cell = max(len(x) for row in [*labels, head] for x in row) + 1
    if 6 + cell * n > 78:  # 80 columns: the short headers of a large node
        head = [str(j) for j in range(n)]
        cell = max(len(x) for row in labels for x in row) + 1
    numa = bool(topo.numa) and any(x is not None for x in topo.numa)
    lines = [f"link matrix ({topology_text(topology)}):", " " * 6 + "".join(h.rjust(cell) for h in head)
             + ("  NUMA" if numa else "")]
    for i in range(n):
        lines.append(f"GPU{i}".ljust(6) + "".join(x.rjust(cell) for x in labels[i])
                     + (f"  {topo.numa[i] if topo.numa[i] is not None else '-'}".ljust(6) if numa else ""))
    text = Text("\n".join([*lines, LINK_LEGEND]))
    text.stylize("bold", 0, len(lines[0]))
    text.highlight_regex(r"\bNV\d+\b", "green")
    text.stylize("dim", len(text.plain) - len(LINK_LEGEND))
    return text


# -- the GPU strip at the top of the queue screen -----------------------------------------------------

STRIP_MIN_CELL, STRIP_MAX_CELL = 17, 28  #: a GPU's cell: index, memory, use, who holds it (5 letters at least)
BAR = 3  #: the cells of a memory or use bar: the percentage (0-100) written over a bar of its length
TRACK = Style(color="grey62", bgcolor="grey23")


def gpu_strip(nodes: list[Mapping], jobs: Mapping[int, Mapping], width: int, max_lines: int) -> Text:
    """A line (or more: it wraps) per node, a cell per GPU: ``0  62  97 alice``: its index, memory used and
    utilisation as bars with their percentages (``-`` where the agent does not measure them), and who holds
    it: the job's user (and job, where there is room), ``shared N +40G`` (N jobs sharing it by memory, and the GiB one
    more may declare, where there is room), ``free``, or ``busy`` (a process labq did not start).
    Past ``max_lines`` the last line counts the GPUs left out."""
    if not nodes:
        return Text(" no GPUs yet: `labq agent` on a workstation adds its GPUs", style="dim")
    users = {job_id: (job.get("spec") or {}).get("user") for job_id, job in jobs.items()}
    label = min(8, max(len(escape_controls(n["name"])) for n in nodes)) + 1
    lines: list[tuple[Text, int]] = []  #: each line and the GPUs on it
    for node in nodes:
        lines += _node_lines(node, gpu_rows([node], users), width, label)
    if len(lines) > max_lines:
        kept = lines[:max(0, max_lines - 1)]
        left = sum(n for _, n in lines) - sum(n for _, n in kept)
        lines = [*kept, (Text(f" … {left} more GPUs: n shows every node", style="dim"), 0)]
    out = Text("\n").join(line for line, _ in lines)
    out.no_wrap = True
    return out


def _node_lines(node: Mapping, gpus: list[dict], width: int, label: int) -> list[tuple[Text, int]]:
    name = escape_controls(node["name"])
    name = (name if len(name) < label else name[:label - 2] + "…").ljust(label)
    health = node.get("health", "?")
    if health != "up" or not gpus:
        line = Text(name, style="bold")
        line.append(f"{escape_controls(health)}, {len(gpus)} GPUs" if gpus else "reports no GPUs",
                    style=HEALTH_STYLES.get(health, "dim"))
        return [(line, len(gpus))]
    most = max(1, (width - label) // STRIP_MIN_CELL)
    per_line = -(-len(gpus) // -(-len(gpus) // most))  # as few lines as fit, as even as can be: 8 GPUs are 4 + 4
    cell = min(STRIP_MAX_CELL, (width - label) // per_line)
    digits = len(str(max(g["index"] for g in gpus)))
    lines = []
    for start in range(0, len(gpus), per_line):
        line = Text(name if start == 0 else " " * label, style="bold")
        for g in gpus[start:start + per_line]:
            line.append_text(_gpu_cell(g, cell, digits))
        lines.append((line, len(gpus[start:start + per_line])))
    return lines


def _gpu_cell(g: Mapping, cell: int, digits: int) -> Text:
    total, free, util = g["memory_mib"], g.get("memory_free_mib"), g.get("utilization_pct")
    memory = None if free is None or not total else round(100 * max(0, total - free) / total)
    out = Text(str(g["index"]).rjust(digits) + " ")
    out.append_text(_bar(memory, Style(color="white", bgcolor="blue")))
    out.append(" ")
    out.append_text(_bar(util, Style(color="black", bgcolor="green" if util is None or util < 50 else
                                     "yellow" if util < 85 else "red")))
    room = cell - digits - 2 * BAR - 5  # the spaces: after the index and each bar, two after who
    if g["job"] is not None:
        who, style = escape_controls(g["user"] or f"job {g['job']}"), "cyan"
        if g["user"] and len(who) + len(str(g["job"])) + 2 <= room:
            who += f" #{g['job']}"
    elif g.get("sharing"):  # jobs sharing it by memory: how many, and what one more may declare
        who, style = f"shared {len(g['sharing'])}", "magenta"
        left = f" +{round((g.get('share_free_mib') or 0) / 1024)}G"
        if len(who) + len(left) <= room:
            who += left
    elif g["busy_outside_labq"]:
        who, style = "busy", "yellow"
    else:
        who, style = "free", "green"
    out.append(" " + (who if len(who) <= room else who[:room - 1] + "…").ljust(room), style=style)
    out.append("  ")
    return out


def _bar(pct: int | None, fill: Style) -> Text:
    """``pct`` written over a bar as long as it is, on a grey track: `` 62`` with its first 2 of 3 cells coloured."""
    if pct is None:
        return Text("-".rjust(BAR), style=TRACK)
    text = str(pct).rjust(BAR)
    filled = min(BAR, round(pct * BAR / 100))
    return Text.assemble((text[:filled], fill), (text[filled:], TRACK))
