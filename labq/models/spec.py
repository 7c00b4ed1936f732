"""A job's spec, declared once: each field's wire name, type, default, bounds and its ``labq submit`` flag.

``FIELDS`` is the one declaration of what a submission may say. Everything that handles a job's fields is
derived from it:

- ``labq.models.job.JobSpec``, the frozen dataclass the leader keeps (its fields, types and defaults);
- ``labq submit``'s and ``labq edit``'s flags and their ``--help`` (``labq.cli.jobs``), with each flag's text
  read into a value by its kind (``labq.spec_text``), as the TUI's submit form does too;
- the request body and the leader's field-by-field checks (``labq.protocol.requests``);
- the stored document and the agent's order (``labq.protocol.codec``).

A new field is one ``Field`` here, plus the code that uses it. A field of a new *kind* also needs that kind's
reading in the three places above (each names its kinds in one table, and refuses a kind it does not know).

Plain classes, no ``dataclasses``: ``labq submit`` builds its flags from this table in its fast start.
"""

from __future__ import annotations

from enum import Enum

from labq.models.priority import PriorityClass

#: how a field's value is read and written. Plain values: a whole number (``count``), a number (``number``), MiB
#: read from ``40G`` (``size``), seconds read from ``90m`` (``duration``), a printable string (``text``), a name
#: of labq's one rule (``name``), an absolute path (``path``), true/false (``switch``), one of ``choices``
#: (``choice``), a catchable signal (``signal``). Shaped values, read by code of their own: the program and its
#: arguments (``argv``), variables (``env``), bind mounts (``mounts``), a priority (``priority``), job ids
#: (``ids``), and the moments that notify (``events``).
KINDS = ("count", "number", "size", "duration", "text", "name", "path", "switch", "choice", "signal",
         "argv", "env", "mounts", "priority", "ids", "events")


class Runtime(str, Enum):
    PROCESS = "process"  #: a plain process on the workstation
    DOCKER = "docker"  #: a container from ``image``


class AfterReservation(str, Enum):
    """What becomes of a job still waiting in its reservation when the booking ends or is cancelled."""

    QUEUE = "queue"  #: released to the normal queue, to run on any GPUs it fits
    CANCEL = "cancel"  #: cancelled, with the reservation's end as the reason


class Field:
    """One field of a job's spec.

    ``name`` is its attribute, its key in a request body and in the stored document. ``type`` is its Python
    type, as an annotation. ``low``/``high`` bound a number on the wire (seconds, MiB); ``max_len`` a string's
    bytes; ``what`` names a ``name`` in errors (``job name``). ``flag`` is its ``labq submit`` option (None: not
    a flag of its own), with ``metavar`` and ``help``; ``edit`` is ``labq edit``'s help for it (None: not
    editable). ``container``: only a container job may say it. ``sent``: a request may say it (else the lab
    sets it: who submitted, an array's task numbers). ``stored``: ``always`` writes it into every stored
    document (the fields of labq's first documents), ``set`` only when it is not its default, ``array`` into
    the document's ``array``.
    """

    __slots__ = ("name", "type", "default", "kind", "low", "high", "max_len", "what", "choices", "flag",
                 "metavar", "help", "edit", "container", "sent", "stored", "bare_seconds", "flag_kind", "label")

    def __init__(self, name: str, type: str, default: object = None, *, kind: str, low: float | None = None,
                 high: float | None = None, max_len: int = 128, what: str | None = None,
                 choices: type[Enum] | None = None, flag: str | None = None, metavar: str | None = None,
                 help: str | None = None, edit: str | None = None, container: bool = False,
                 sent: bool = True, stored: str = "set", bare_seconds: bool = False, flag_kind: str | None = None,
                 label: str | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"field {name}: unknown kind {kind!r}")
        self.name, self.type, self.default, self.kind = name, type, default, kind
        self.low, self.high, self.max_len, self.what, self.choices = low, high, max_len, what, choices
        self.flag, self.metavar, self.help, self.edit = flag, metavar, help, edit
        self.container, self.sent, self.stored = container, sent, stored
        self.bare_seconds = bare_seconds  #: a ``duration`` typed as a plain number is seconds (``--grace 90``)
        #: the kind of the flag's text, when not the field's own: ``--share`` is a switch (its size is --gpu-mem's)
        self.flag_kind = flag_kind or kind
        self.label = label or name.replace("_", " ")  #: what a form calls it

    @property
    def required(self) -> bool:
        """It has no default: every spec names it (the user, the command)."""
        return self.default is _REQUIRED

    def __repr__(self) -> str:
        return f"Field({self.name!r}, kind={self.kind!r})"


_REQUIRED = object()  #: the default of a field every spec must name
#: the PATH of a job whose submitter's shell gave it none (``--export NONE``)
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_GPUS = 64
MAX_TIME_LIMIT_S = 366 * 86400
MAX_GRACE_S = 3600

#: the fields in the order of ``labq submit --help``; the dataclass takes them in this order too
FIELDS: tuple[Field, ...] = (
    Field("user", "str", _REQUIRED, kind="text", sent=False, stored="always"),
    Field("command", "tuple[str, ...]", _REQUIRED, kind="argv", stored="always"),
    Field("gpus", "int", 1, kind="count", low=1, high=MAX_GPUS, flag="--gpus", metavar="N", label="GPUs",
          help="GPUs the job needs (default 1)", edit="GPUs the job needs", stored="always"),
    Field("min_gpu_memory_mib", "int", 0, kind="size", low=0, high=10**7, flag="--gpu-mem", metavar="SIZE",
          help="least memory per GPU: 40G, 24GiB, 8000M (plain number: GiB); with --share, the most GPU memory "
               "the job uses", stored="always"),
    #: the GPU memory it says it uses (``--share --gpu-mem 10G``): it shares one GPU with other jobs that declare
    #: theirs (``labq.models.sharing``); None: its GPUs are its own. Read from ``--share`` and ``--gpu-mem``
    Field("share_mib", "int | None", None, kind="size", low=1, high=10**7, flag="--share", flag_kind="switch",
          help="share one GPU with other jobs by memory: placed where --gpu-mem fits beside the jobs there "
               "(and beside programs outside labq), and stopped through its checkpoint signal, then "
               "requeued, if it uses more than that by over the margin (5%% of the GPU, at least 512 MiB)"),
    #: substring of the GPU model name, case-insensitive (``A100``, ``3090``)
    Field("gpu_model", "str | None", None, kind="text", flag="--gpu-model", metavar="MODEL",
          help="part of the GPU model name: A100, 3090", stored="always"),
    #: CPUs (cores, a fraction allowed) and memory it needs on each of its nodes; None: the lab's default for its
    #: GPUs (``[jobs] cpus_per_gpu``, ``mem_per_gpu``; by default the node's share per GPU). Enforced by the kernel
    Field("cpus", "float | None", None, kind="number", low=0.1, high=4096, flag="--cpus", metavar="N",
          help="CPU cores it needs on each node (1.5 allowed; default: the lab's per GPU, else the node's share "
               "per GPU): a CPU set near its GPUs, and a quota", stored="always"),
    Field("memory_mib", "int | None", None, kind="size", low=16, high=1 << 32, flag="--mem", metavar="SIZE",
          help="memory it needs on each node: 32G, 500M (plain number: GiB; default: the lab's per GPU, else the "
               "node's share per GPU); past it the kernel kills the job, and labq says so", stored="always"),
    Field("priority", "int", int(PriorityClass.NORMAL), kind="priority", flag="--priority", metavar="INT|NAME",
          label="class",
          help="priority 0-1000 or a class name (normal is 200)", edit="priority 0-1000 or a class name",
          stored="always"),
    Field("time_limit_s", "float | None", None, kind="duration", low=1, high=MAX_TIME_LIMIT_S, flag="--time",
          label="time limit",
          metavar="DURATION", help="time limit: 90m, 2h, 1d, 1:30:00; the checkpoint signal comes a grace before "
          "it", edit="time limit: 90m, 2h, 1d, 1:30:00; none removes it", stored="always"),
    #: at the time limit, requeue (attempt + 1, resumed) instead of ending as timeout
    Field("requeue_on_timeout", "bool", False, kind="switch", flag="--requeue-on-timeout",
          help="at the time limit, checkpoint and requeue (resume later) instead of ending", stored="always"),
    Field("name", "str", "", kind="name", what="job name", flag="--name", help="a name to find the job by",
          edit="a new name ('' removes it)", stored="always"),
    Field("env", "tuple[tuple[str, str], ...]", (), kind="env", flag="--env", metavar="K=V",
          help="set a variable; --env K copies K from this shell (repeatable)", stored="always"),
    #: what of the submitting shell's environment the job gets, as sbatch's ``--export``: ``ALL`` (the default),
    #: ``NONE``, or ``VAR,VAR=value`` (``ALL,VAR=value`` adds); None: the lab's default (``[jobs] export``)
    Field("export", "str | None", None, kind="text", max_len=4096, flag="--export", metavar="ALL|NONE|VAR[,VAR=V]",
          help="the environment it gets from this shell (PATH, a venv or conda, your variables): ALL (the "
               "default), NONE, or a list of names (VAR=value sets one; ALL,VAR=value adds it); never "
               "credentials such as LABQ_TOKEN or SSH_AUTH_SOCK. A container job gets its image's environment "
               "and --env instead"),
    #: the submitting shell's variables that ``export`` chose (as ``env``: its values shown to its owner and admins)
    Field("environment", "tuple[tuple[str, str], ...]", (), kind="env"),
    Field("workdir", "str | None", None, kind="path", max_len=4096, flag="--workdir", metavar="DIR", label="folder",
          help="where it runs (default: the current folder)", stored="always"),
    Field("preemptible", "bool", True, kind="switch", flag="--no-preempt",
          help="never stop this job for a higher-priority one (admins, and users the admin allows)",
          stored="always"),
    Field("image", "str | None", None, kind="text", max_len=512, flag="--image", metavar="IMAGE",
          help="run in a container from IMAGE (present on the nodes)", stored="always"),
    Field("mounts", "tuple[Mount, ...]", (), kind="mounts", flag="--mount", metavar="SRC:DST[:ro]",
          help="bind a host folder into the container (under the admin's allowed roots); repeatable",
          container=True, stored="always"),
    #: /dev/shm of a container job (dataloaders need more than Docker's 64 MiB)
    Field("shm_size_mib", "int", 1024, kind="size", low=64, high=1 << 20, flag="--shm-size", metavar="SIZE",
          help="the container's /dev/shm (default 1G)", label="/dev/shm", container=True, stored="always"),
    Field("depends_on", "tuple[int, ...]", (), kind="ids", flag="--after", metavar="ID[,ID]",
          help="start only after these jobs have succeeded (if one fails, this job is cancelled)", stored="always"),
    #: start once every job in ``depends_on`` has ended, however it ended (``--after-any``); else each must succeed
    Field("after_any", "bool", False, kind="switch", flag="--after-any", flag_kind="ids", metavar="ID[,ID]",
          help="start after these jobs have ended, however they ended", stored="always"),
    #: spread over this many nodes, ``gpus // nodes`` on each; 1 keeps the job on one node
    Field("nodes", "int", 1, kind="count", low=1, high=MAX_GPUS, flag="--nodes", metavar="N",
          help="spread the GPUs evenly over N nodes", stored="always"),
    Field("node", "str | None", None, kind="name", what="node name", flag="--node", metavar="NAME",
          help="run only on this node", stored="always"),
    #: the lab queue (team) it is served in (``labq.models.queues``); None: outside every queue
    Field("queue", "str | None", None, kind="name", what="queue name", flag="--queue", metavar="NAME",
          help="the lab queue (team) to serve it in (default: your only queue, or the lab's default; "
               "`labq queues` lists them)", stored="always"),
    Field("reservation", "str | None", None, kind="name", what="reservation name", flag="--reservation",
          metavar="NAME", help="run on a reservation's GPUs (you must be one of its users); waits for its start",
          stored="always"),
    #: when the reservation ends (or is cancelled) before the job started: queue normally or cancel
    Field("after_reservation", "AfterReservation", AfterReservation.QUEUE, kind="choice", choices=AfterReservation,
          flag="--after-reservation", help="if the reservation ends (or is cancelled) before the job starts: "
          "queue it normally on any GPUs (default) or cancel it", stored="always"),
    Field("grace_s", "float", 60.0, kind="duration", low=0, high=MAX_GRACE_S, flag="--grace", metavar="DURATION",
          help="time to checkpoint before a stop (default 60s)", stored="always", bare_seconds=True),
    #: the signal the job handles by saving and exiting 0 (``--checkpoint-signal``); None: it declared none,
    #: so a stop is TERM and its grace, never a signal it would die of
    Field("checkpoint_signal", "str | None", None, kind="signal", max_len=16, flag="--checkpoint-signal",
          metavar="SIGNAL", help="signal the job saves and exits 0 on (e.g. SIGUSR1; default: what its image's "
          "label labq.checkpoint-signal or the job's own `labq checkpoint --signal` declares, else a stop is TERM "
          "and the grace)", stored="always"),
    #: the moments of its life that notify its owner (``--notify end,fail``); () none; None: the owner's defaults
    Field("notify", "tuple[NotifyEvent, ...] | None", None, kind="events", flag="--notify", metavar="WHEN[,WHEN]",
          help="tell you when it starts, ends (succeeds), fails (times out, its node is lost, or someone else or "
               "the lab cancels it) or is preempted (requeued): start, end, fail, preempt; several with commas; "
               "none: not at all (default: what `labq notify` set)"),
    #: where it runs: a container of ``image``, else a process; a request's ``image`` says it
    Field("runtime", "Runtime", Runtime.PROCESS, kind="choice", choices=Runtime, stored="always"),
    #: a task of an array (``labq submit --array``/``--grid``): the array's id (a job id of its own, no job's),
    #: this task's index (``12.3``), how many of the array's tasks may hold GPUs at once (``%N``; None: any), and
    #: how many tasks the array has (job ids ``array_id + 1`` to ``+ array_tasks``); stored as one ``array``
    Field("array_id", "int | None", None, kind="count", sent=False, stored="array"),
    Field("array_index", "int | None", None, kind="count", sent=False, stored="array"),
    Field("array_cap", "int | None", None, kind="count", sent=False, stored="array"),
    Field("array_tasks", "int | None", None, kind="count", sent=False, stored="array"),
)

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
#: what a request body may set (the rest the lab sets: who submitted, an array's task numbers)
SENT: tuple[Field, ...] = tuple(f for f in FIELDS if f.sent)
#: what only a container job may say (``--image``)
CONTAINER_ONLY: tuple[Field, ...] = tuple(f for f in FIELDS if f.container)
#: the priority classes as ``--class`` offers them, lowest first
CLASSES: tuple[str, ...] = tuple(c.name.lower() for c in PriorityClass)
