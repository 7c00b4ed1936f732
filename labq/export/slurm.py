"""A labq job as an sbatch script (``labq export ID --to slurm``).

GPUs become ``--gres=gpu[:TYPE]:N`` per node (the GPU model, lower-cased, as the GRES type: sites name their
types, so the script says to check it); the time limit ``--time``; the checkpoint signal and grace
``--signal=B:SIG@GRACE`` (Slurm sends it to the batch shell, which ``exec`` makes the job itself, a grace
before the time limit); a preemptible job ``--requeue``, so that a preemption requeues it as the same Slurm job
(same ``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT`` + 1), which is what the checkpoint contract's variables are
made of. A container job runs through pyxis (``--container-image``), Apptainer or Slurm's own OCI
``--container``. What Slurm cannot say, or says differently at each site, is listed in comments.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from labq.models.job import JobSpec, Runtime
from labq.models.spec import CONTAINER_ONLY
from labq.models.notify import NotifyEvent
from labq.models.priority import priority_name

CONTAINERS = ("pyxis", "apptainer", "oci")
#: labq's notification moments as Slurm's --mail-type
MAIL_TYPES = {NotifyEvent.START: "BEGIN", NotifyEvent.END: "END", NotifyEvent.FAIL: "FAIL",
              NotifyEvent.PREEMPT: "REQUEUE"}
MAX_SIGNAL_GRACE_S = 65535  #: --signal's @TIME is at most this many seconds


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    #: how a container job runs: ``pyxis`` (NVIDIA's Slurm plugin), ``apptainer`` (``apptainer exec --nv``), or
    #: ``oci`` (Slurm's own ``--container``, a bundle the site unpacks from the image: ``oci_bundle``)
    containers: str = "pyxis"
    oci_bundle: str | None = None
    #: where checkpoint folders live on the cluster: ``LABQ_CHECKPOINT_DIR`` is this plus the Slurm job id
    checkpoint_root: str = "$HOME/labq-checkpoints"


def _time(seconds: float) -> str:
    """``--time`` as D-HH:MM:SS, rounded up to the whole minute Slurm counts in."""
    minutes = -(-int(seconds) // 60)
    days, minutes = divmod(minutes, 24 * 60)
    return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def gres_type(model: str) -> str | None:
    """``A100`` -> ``a100``, ``RTX 3090`` -> ``rtx3090``: a GRES type name from labq's model filter; None if none
    can be made."""
    name = re.sub(r"[^a-z0-9_.-]", "", model.lower())
    return name or None


def _sbatch_value(value: str) -> str:
    """A value on an ``#SBATCH`` line: Slurm reads those lines itself, without a shell, up to the first space."""
    if not value or any(c.isspace() or c in "#\"'" for c in value):
        raise ValueError(f"{value!r} cannot be written on an #SBATCH line")
    return value


def to_sbatch(spec: JobSpec, job_id: int | None = None, options: SlurmOptions = SlurmOptions()) -> str:
    """The sbatch script for ``spec`` (``job_id``: labq's id, for the comments and the name)."""
    if options.containers not in CONTAINERS:
        raise ValueError(f"containers must be one of {', '.join(CONTAINERS)}")
    head, body, untranslated = ["#!/bin/bash"], [], []
    where = f"labq job {job_id}" if job_id is not None else "a labq job spec"
    head.append(f"# {where}, exported by labq export --to slurm")
    sbatch = head.append
    name = spec.name or (f"labq-{job_id}" if job_id is not None else "labq-job")
    sbatch(f"#SBATCH --job-name={_sbatch_value(re.sub(r'[^A-Za-z0-9_.-]', '-', name))}")
    if options.partition:
        sbatch(f"#SBATCH --partition={_sbatch_value(options.partition)}")
    sbatch(f"#SBATCH --nodes={spec.nodes}")
    sbatch("#SBATCH --ntasks-per-node=1")
    kind = gres_type(spec.gpu_model) if spec.gpu_model else None
    sbatch(f"#SBATCH --gres=gpu:{kind + ':' if kind else ''}{spec.gpus_per_node}")
    if kind:
        untranslated.append(f"GPU model {spec.gpu_model!r} (any model containing it) is GRES type {kind!r} here: "
                            "check your site's type names (sinfo -o '%G')")
    if spec.cpus is not None:
        sbatch(f"#SBATCH --cpus-per-task={max(1, round(spec.cpus))}")
    if spec.memory_mib is not None:
        sbatch(f"#SBATCH --mem={spec.memory_mib}M")
    if spec.time_limit_s is not None:
        sbatch(f"#SBATCH --time={_time(spec.time_limit_s)}")
    else:
        untranslated.append("no time limit: the partition's default limit applies")
    signal = spec.checkpoint_signal
    grace = min(MAX_SIGNAL_GRACE_S, max(1, round(spec.grace_s)))
    if signal is not None:
        sbatch(f"#SBATCH --signal=B:{signal.removeprefix('SIG')}@{grace}")
        untranslated.append(f"a preemption: Slurm sends {signal} only before the time limit (--signal); at a "
                            "preemption it sends TERM and waits the site's GraceTime, so have the job save on TERM "
                            "too")
    else:
        untranslated.append("no checkpoint signal declared: Slurm stops the job with TERM, and KILL after the "
                            "site's KillWait")
    sbatch("#SBATCH --requeue" if spec.preemptible else "#SBATCH --no-requeue")
    if spec.workdir and spec.runtime is Runtime.PROCESS:
        sbatch(f"#SBATCH --chdir={_sbatch_value(spec.workdir)}")
    if spec.notify:
        sbatch(f"#SBATCH --mail-type={','.join(sorted({MAIL_TYPES[e] for e in spec.notify if e in MAIL_TYPES}))}")
    command = shlex.join(spec.command)
    if spec.runtime is Runtime.DOCKER:
        command = _container(spec, options, sbatch, untranslated)
    untranslated += _untranslated(spec)
    body.append("# the checkpoint contract, from what Slurm knows: the same job id and one more restart after a "
                "requeue")
    for key, value in spec.env:
        body.append(f"export {key}={shlex.quote(value)}")
    body += [
        'export LABQ_JOB_ID="$SLURM_JOB_ID"',
        'export LABQ_ATTEMPT="$(( ${SLURM_RESTART_COUNT:-0} + 1 ))"',
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then export LABQ_RESUMED=1; else export LABQ_RESUMED=0; fi',
        f"export LABQ_PREEMPT_SIGNAL={signal or 'SIGTERM'}",
        f'export LABQ_CHECKPOINT_DIR="{options.checkpoint_root}/$SLURM_JOB_ID"',
        'mkdir -p "$LABQ_CHECKPOINT_DIR"',
        f"exec srun --kill-on-bad-exit=1 {command}" if spec.nodes > 1 else f"exec {command}",
    ]
    notes = ["# not translated (labq said it; Slurm cannot, or says it at each site):"]
    notes += [f"#   - {line}" for line in untranslated]
    return "\n".join(head + (notes if untranslated else []) + body) + "\n"


def _container(spec: JobSpec, options: SlurmOptions, sbatch, untranslated: list[str]) -> str:
    """The #SBATCH lines (or the command) that run ``spec``'s image; returns the command to exec."""
    command = shlex.join(spec.command)
    image = spec.image or ""
    if options.containers == "pyxis":
        sbatch(f"#SBATCH --container-image={_sbatch_value(image)}")
        if spec.mounts:
            sbatch("#SBATCH --container-mounts=" + _sbatch_value(",".join(
                f"{m.source}:{m.target}{':ro' if m.read_only else ''}" for m in spec.mounts)))
        if spec.workdir:
            sbatch(f"#SBATCH --container-workdir={_sbatch_value(spec.workdir)}")
        for field in CONTAINER_ONLY:  # pyxis takes the image, the folder and the mounts, and no other setting
            if field.name != "mounts":
                value = getattr(spec, field.name)
                untranslated.append(f"{field.label} of {value}{' MiB' if field.kind == 'size' else ''} "
                                    f"({field.flag}): pyxis gives the node's own")
        return command
    if options.containers == "apptainer":
        binds = "".join(f" --bind {shlex.quote(f'{m.source}:{m.target}' + (':ro' if m.read_only else ''))}"
                        for m in spec.mounts)
        cwd = f" --pwd {shlex.quote(spec.workdir)}" if spec.workdir else ""
        return f"apptainer exec --nv{binds}{cwd} {shlex.quote('docker://' + image)} {command}"
    bundle = options.oci_bundle or f"$HOME/oci/{re.sub(r'[^A-Za-z0-9_.-]', '_', image)}"
    sbatch(f"#SBATCH --container={_sbatch_value(bundle)}")
    untranslated.append(f"image {image}: Slurm's --container runs an OCI bundle the site unpacked from it "
                        f"(e.g. umoci unpack --image {image} {bundle}); mounts and /dev/shm are the bundle's config")
    return command


def _untranslated(spec: JobSpec) -> list[str]:
    lines = []
    if spec.depends_on:
        kind = "afterany" if spec.after_any else "afterok"
        lines.append(f"runs after labq jobs {', '.join(map(str, spec.depends_on))}: Slurm's ids differ; add "
                     f"#SBATCH --dependency={kind}:<their Slurm ids>")
    if spec.node:
        lines.append(f"only on labq node {spec.node}: add #SBATCH --nodelist=<the Slurm node> if it matters")
    if spec.min_gpu_memory_mib:
        lines.append(f"GPUs with at least {spec.min_gpu_memory_mib} MiB: no sbatch option says that; pick the GRES "
                     "type (or --constraint) of GPUs that big")
    if spec.priority != 200:
        lines.append(f"priority {priority_name(spec.priority)} ({spec.priority}): Slurm's priorities are the "
                     "site's; ask for the QOS that matches (#SBATCH --qos=...)")
    if spec.reservation:
        lines.append(f"labq reservation {spec.reservation!r}: a Slurm reservation is the admin's "
                     "(#SBATCH --reservation=NAME)")
    if spec.queue:
        lines.append(f"labq queue {spec.queue!r}: your Slurm account or partition (#SBATCH --account=...)")
    if spec.requeue_on_timeout:
        lines.append("requeue at the time limit: Slurm ends a job at its limit; resubmit it to resume")
    if spec.share_mib is not None:
        lines.append(f"shares a GPU by memory ({spec.share_mib} MiB): Slurm shares GPUs only through MPS or "
                     "shards (--gres=shard:N) where the site configures them")
    if spec.array_id is not None:
        lines.append(f"task {spec.array_index} of labq array {spec.array_id}: exported as one job (a Slurm array "
                     "is --array=0-N with $SLURM_ARRAY_TASK_ID)")
    return lines
