"""A labq job as a Kubernetes ``batch/v1`` Job (``labq export ID --to k8s``), for Kueue or Volcano.

GPUs become ``nvidia.com/gpu`` limits, one pod per node the job spans (an Indexed Job); Kueue admits it
through its LocalQueue label (the job's labq queue, or ``--queue``) and the WorkloadPriorityClass label
``labq-<class>``, created suspended as Kueue wants; with Volcano the pods name ``volcano`` as their scheduler and
a PodGroup (the second document) holds them to all-or-nothing (``minMember``). The checkpoint contract: the
checkpoint signal reaches the job from a preStop hook, within ``terminationGracePeriodSeconds`` (its grace);
its checkpoint folder is a volume of the lab's claim (``--pvc``), one folder per job. What has no equivalent is
listed in comments at the top.

Printed as YAML: block style, every string value JSON-quoted (YAML is a superset of JSON), so no YAML library is
needed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from labq.models.job import JobSpec, Runtime
from labq.models.priority import priority_name

SCHEDULERS = ("kueue", "volcano")
CHECKPOINT_MOUNT = "/labq/checkpoint"


@dataclass(frozen=True)
class K8sOptions:
    namespace: str | None = None
    scheduler: str = "kueue"
    queue: str | None = None  #: the Kueue LocalQueue or Volcano queue; default: the job's labq queue, or "default"
    pvc: str = "labq-checkpoints"  #: the claim that keeps checkpoint folders
    image: str | None = None  #: for a process job, the image that has its environment


def dns_name(text: str, limit: int = 63) -> str:
    """A DNS-1123 label: lower case letters, digits and ``-``, at most ``limit`` long."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return name[:limit].rstrip("-") or "labq"


def to_k8s(spec: JobSpec, job_id: int | None = None, options: K8sOptions = K8sOptions()) -> str:
    """The YAML of the Job (and with Volcano, its PodGroup) for ``spec``; ValueError for what cannot be exported
    (a process job without ``options.image``)."""
    docs, untranslated = to_documents(spec, job_id, options)
    where = f"labq job {job_id}" if job_id is not None else "a labq job spec"
    head = [f"# {where}, exported by labq export --to k8s"]
    if untranslated:
        head.append("# not translated (labq said it; Kubernetes cannot, or the cluster says it its own way):")
        head += [f"#   - {line}" for line in untranslated]
    return "\n".join(head) + "\n" + "---\n".join(yaml(doc) for doc in docs)


def to_documents(spec: JobSpec, job_id: int | None, options: K8sOptions) -> tuple[list[dict], list[str]]:
    """The Kubernetes objects, as plain dicts, and what could not be said in them."""
    if options.scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}")
    image = spec.image if spec.runtime is Runtime.DOCKER else options.image
    if not image:
        raise ValueError("a process job runs on the host, and a Kubernetes pod needs an image: name the image that "
                         "has the job's environment (--image)")
    untranslated: list[str] = []
    name = dns_name(f"labq-{job_id}-{spec.name}" if job_id is not None else f"labq-{spec.name or 'job'}")
    queue = options.queue or spec.queue or "default"
    klass = f"labq-{dns_name(priority_name(spec.priority))}"
    labels = {"app.kubernetes.io/managed-by": "labq-export"}
    if job_id is not None:
        labels["labq.io/job-id"] = str(job_id)
    pod_labels = dict(labels)
    annotations: dict[str, str] = {}
    if options.scheduler == "kueue":
        labels.update({"kueue.x-k8s.io/queue-name": queue, "kueue.x-k8s.io/priority-class": klass})
        untranslated.append(f"priority {priority_name(spec.priority)} ({spec.priority}) is Kueue's "
                            f"WorkloadPriorityClass {klass!r}: the cluster admin creates it")
    else:
        annotations["scheduling.k8s.io/group-name"] = name
    container = _container(spec, image, untranslated)
    volumes = [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": options.pvc}}]
    if spec.runtime is Runtime.DOCKER:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{spec.shm_size_mib}Mi"}})
    for i, m in enumerate(spec.mounts):
        volumes.append({"name": f"mount-{i}", "hostPath": {"path": m.source}})
    if spec.mounts:
        untranslated.append("host folders are hostPath volumes: a cluster usually wants a claim (PVC) instead")
    pod = {"restartPolicy": "Never", "terminationGracePeriodSeconds": max(1, round(spec.grace_s)),
           "containers": [container], "volumes": volumes}
    if options.scheduler == "volcano":
        pod["schedulerName"] = "volcano"
    job_spec: dict = {"backoffLimit": 0, "completions": spec.nodes, "parallelism": spec.nodes,
                      "template": {"metadata": {"labels": pod_labels, **({"annotations": annotations}
                                                                           if annotations else {})},
                                   "spec": pod}}
    if spec.nodes > 1:
        job_spec["completionMode"] = "Indexed"
    if options.scheduler == "kueue":
        job_spec["suspend"] = True  # Kueue starts it once admitted
    if spec.time_limit_s is not None:
        job_spec["activeDeadlineSeconds"] = max(1, round(spec.time_limit_s))
    metadata: dict = {"name": name, "labels": labels}
    if options.namespace:
        metadata["namespace"] = options.namespace
    docs = [{"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}]
    if options.scheduler == "volcano":
        docs.append({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                     "metadata": {"name": name, **({"namespace": options.namespace} if options.namespace else {})},
                     "spec": {"minMember": spec.nodes, "queue": queue,
                              "minResources": {"nvidia.com/gpu": str(spec.gpus)}}})
    untranslated += _untranslated(spec)
    return docs, untranslated


def _container(spec: JobSpec, image: str, untranslated: list[str]) -> dict:
    signal = spec.checkpoint_signal
    env = [{"name": k, "value": v} for k, v in spec.env]
    env += [{"name": "LABQ_JOB_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}}},
            {"name": "LABQ_PREEMPT_SIGNAL", "value": signal or "SIGTERM"},
            {"name": "LABQ_CHECKPOINT_DIR", "value": CHECKPOINT_MOUNT}]
    untranslated.append("LABQ_ATTEMPT and LABQ_RESUMED: a pod is told neither; the job resumes when "
                        "$LABQ_CHECKPOINT_DIR holds its checkpoint")
    resources: dict = {"limits": {"nvidia.com/gpu": str(spec.gpus_per_node)}}  # a quantity: a string
    requests = {}
    if spec.cpus is not None:
        requests["cpu"] = f"{spec.cpus:g}"
    if spec.memory_mib is not None:
        requests["memory"] = f"{spec.memory_mib}Mi"
    if requests:
        resources["requests"] = requests
    mounts = [{"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT, "subPathExpr": "$(LABQ_JOB_ID)"}]
    if spec.runtime is Runtime.DOCKER:
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    mounts += [{"name": f"mount-{i}", "mountPath": m.target, "readOnly": m.read_only}
               for i, m in enumerate(spec.mounts)]
    container: dict = {"name": "job", "image": image, "command": list(spec.command), "env": env,
                       "resources": resources, "volumeMounts": mounts}
    if spec.workdir:
        container["workingDir"] = spec.workdir
    if signal is not None and signal != "SIGTERM":
        # Kubernetes sends TERM after the hook; the hook gives the job its own signal first, and the grace to save
        container["lifecycle"] = {"preStop": {"exec": {"command": [
            "sh", "-c", f"kill -s {signal.removeprefix('SIG')} 1; sleep {max(1, round(spec.grace_s))}"]}}}
        untranslated.append(f"the preStop hook sends {signal} to the container's first process with the image's "
                            "sh: the job must be that process (exec form, as exported)")
    return container


def _untranslated(spec: JobSpec) -> list[str]:
    lines = []
    if spec.gpu_model:
        lines.append(f"GPU model {spec.gpu_model!r}: select nodes by your GPU label (e.g. a nodeSelector on "
                     "nvidia.com/gpu.product)")
    if spec.min_gpu_memory_mib:
        lines.append(f"GPUs with at least {spec.min_gpu_memory_mib} MiB: select nodes by your GPU memory label "
                     "(nvidia.com/gpu.memory)")
    if spec.node:
        lines.append(f"only on labq node {spec.node}: a nodeSelector on kubernetes.io/hostname, if it matters")
    if spec.depends_on:
        lines.append(f"runs after labq jobs {', '.join(map(str, spec.depends_on))}: Kubernetes Jobs have no "
                     "dependencies (a workflow engine such as Argo does)")
    if spec.reservation:
        lines.append(f"labq reservation {spec.reservation!r}: no Kubernetes equivalent")
    if spec.notify:
        lines.append("notifications: none from Kubernetes itself")
    if spec.requeue_on_timeout:
        lines.append("requeue at the time limit: activeDeadlineSeconds ends the Job")
    if spec.share_mib is not None:
        lines.append(f"shares a GPU by memory ({spec.share_mib} MiB): Kubernetes shares GPUs only through the "
                     "device plugin's time-slicing or MPS, where the cluster configures them")
    if spec.array_id is not None:
        lines.append(f"task {spec.array_index} of labq array {spec.array_id}: exported as one Job")
    return lines


def yaml(value, indent: int = 0) -> str:
    """Block-style YAML of plain data (dicts, lists, strings, numbers, booleans), strings JSON-quoted."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            name = key if _PLAIN_KEY.fullmatch(key) else json.dumps(key)
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{name}:\n{yaml(item, indent + 2)}")
            else:
                out.append(f"{pad}{name}: {_scalar(item)}\n")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        out = []
        for item in value:
            if isinstance(item, (dict, list)) and item:
                text = yaml(item, indent + 2)
                out.append(f"{pad}- {text[indent + 2:]}")
            else:
                out.append(f"{pad}- {_scalar(item)}\n")
        return "".join(out)
    return pad + _scalar(value) + "\n"


_PLAIN_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  #: a key YAML reads as this string without quotes


def _scalar(value) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return json.dumps(value)
