"""``labq export``: a job (or a spec file) as the same job for Slurm or Kubernetes (``labq.export``)."""

from __future__ import annotations

import argparse
import json
import sys

from labq.cli.common import command, job_ref_arg, leader_client, leader_option
from labq.cli.errors import CliError

EXAMPLES = """\
  labq export 12 --to slurm > train.sbatch   then on the cluster: sbatch train.sbatch
  labq export 12 --to slurm --partition gpu --containers apptainer
  labq export 12.3 --to k8s --image ghcr.io/lab/train:1.4 | kubectl apply -f -
  labq export 12 --to k8s --scheduler volcano --namespace nlp
  labq export --from-spec job.json --to slurm   a submit body, or a job from labq show --json
"""


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "export", "a job as an sbatch script or a Kubernetes Job",
                "Print a job's spec as the same job for a bigger cluster: an sbatch script for Slurm (GPUs as "
                "--gres, the time limit, the checkpoint signal and grace as --signal, preemptible as --requeue, "
                "the environment, container jobs through pyxis, Apptainer or Slurm's --container) or a "
                "Kubernetes batch/v1 Job for Kueue or Volcano (nvidia.com/gpu limits, queue and priority "
                "labels, the grace and a preStop hook for the checkpoint signal, the checkpoint folder as a "
                "volume). The checkpoint contract's variables are filled from what that cluster knows. What has "
                "no equivalent there is listed in comments at the top, never dropped silently.",
                EXAMPLES, _export, [leader_option()])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("id", nargs="?", type=job_ref_arg, metavar="ID", help="a job, or an array's task (12.3)")
    what.add_argument("--from-spec", metavar="FILE", help="a JSON file: a submit body (POST /v1/jobs), or a job "
                      "as labq show --json prints it; - reads stdin")
    p.add_argument("--to", required=True, choices=("slurm", "k8s"), help="the cluster to run it on")
    slurm = p.add_argument_group("Slurm")
    slurm.add_argument("--partition", metavar="NAME", help="#SBATCH --partition")
    slurm.add_argument("--containers", choices=("pyxis", "apptainer", "oci"), default="pyxis",
                       help="how a container job runs (default pyxis: --container-image)")
    slurm.add_argument("--oci-bundle", metavar="DIR", help="with --containers oci: the unpacked image's bundle")
    slurm.add_argument("--checkpoint-root", metavar="DIR", default="$HOME/labq-checkpoints",
                       help="checkpoint folders on the cluster (default $HOME/labq-checkpoints/SLURM_JOB_ID)")
    k8s = p.add_argument_group("Kubernetes")
    k8s.add_argument("--scheduler", choices=("kueue", "volcano"), default="kueue", help="default kueue")
    k8s.add_argument("--queue", metavar="NAME", help="the Kueue LocalQueue or Volcano queue (default: the job's "
                     "labq queue, or default)")
    k8s.add_argument("--namespace", metavar="NAME")
    k8s.add_argument("--pvc", metavar="CLAIM", default="labq-checkpoints",
                     help="the claim that keeps checkpoint folders (default labq-checkpoints)")
    k8s.add_argument("--image", metavar="IMAGE", help="for a job that runs on the host: the image with its "
                     "environment (a container job keeps its own)")


def _export(args: argparse.Namespace) -> int:
    from labq.export import K8sOptions, SlurmOptions, to_k8s, to_sbatch

    spec, job_id = _spec(args)
    try:
        if args.to == "slurm":
            text = to_sbatch(spec, job_id, SlurmOptions(args.partition, args.containers, args.oci_bundle,
                                                        args.checkpoint_root))
        else:
            text = to_k8s(spec, job_id, K8sOptions(args.namespace, args.scheduler, args.queue, args.pvc,
                                                   args.image))
    except ValueError as err:
        raise CliError(str(err)) from None
    sys.stdout.write(text)
    return 0


def _spec(args: argparse.Namespace):
    """The spec to export and its labq id (None for a file that is a submit body)."""
    from labq.protocol.codec import HIDDEN, decode_spec

    if args.from_spec is None:
        doc, _ = leader_client(args).job(args.id)
        job_id = doc["id"]
    else:
        try:
            text = sys.stdin.read() if args.from_spec == "-" else open(args.from_spec, encoding="utf-8").read()
            doc = json.loads(text)
        except OSError as err:
            raise CliError(f"--from-spec {args.from_spec}: {err.strerror}") from None
        except ValueError as err:
            raise CliError(f"--from-spec {args.from_spec}: not JSON ({err})") from None
        doc = doc.get("job", doc) if isinstance(doc, dict) else doc
        job_id = doc.get("id") if isinstance(doc, dict) and "spec" in doc else None
    if isinstance(doc, dict) and isinstance(doc.get("spec"), dict):
        try:
            spec = decode_spec(doc["spec"])
        except (KeyError, TypeError, ValueError) as err:
            raise CliError(f"the job's spec is not one labq reads: {type(err).__name__}: {err}") from None
    else:
        spec = _submit_body(doc)
    hidden = sorted(k for k, v in spec.env if v == HIDDEN)
    if hidden:
        print(f"labq: the values of {', '.join(hidden)} are hidden from you (not your job): the export says "
              f"{HIDDEN}; set them yourself", file=sys.stderr)
    return spec, job_id


def _submit_body(doc: object):
    """A submit body as the spec it asks for (checked as the leader checks it; the user: whoever runs it)."""
    import getpass

    from labq.protocol.errors import ApiError
    from labq.protocol.requests import parse_submit

    try:
        request = parse_submit(doc)
    except ApiError as err:
        raise CliError(f"--from-spec: {err.message}") from None
    if request.sweep is not None:
        raise CliError("--from-spec: an array or grid exports one task at a time: submit it, then labq export 12.3")
    try:
        return request.spec_for(getpass.getuser())
    except ApiError as err:
        raise CliError(f"--from-spec: {err.message}") from None
