"""The leader's settings file with every key at its default and what each means: what ``labq leader
--print-config`` prints, for an admin to edit into their ``leader.toml``.

Read by ``labq.leader.config_file.load_config``, it gives ``labq.leader.config.LeaderConfig()`` (a test holds them
together): a default changed there is changed here too.
"""

DEFAULT_TOML = """\
# labq leader settings. Every key is optional; these are the defaults.

[leader]
listen = "127.0.0.1:7733"        # address:port of the API; "0.0.0.0:7733" to serve other machines
# data_dir = "~/.local/share/labq" # the database, its previous copy, the archive, the join token
request_timeout = "10s"          # a client silent this long while sending a request is disconnected
max_connections_per_address = 128 # open connections from one address; more are answered 503 and closed
tls = "auto"                     # "auto": TLS unless listening on loopback only; "on": always; "off": never
insecure = false                 # allow plain HTTP on an address other machines reach (tokens in clear!)
auth_failures_per_minute = 30    # failed authentications one address may make a minute, then 429; 0: no limit

[scheduling]
preemption = true                # higher-priority jobs may preempt lower, preemptible ones
min_runtime = "5m"               # a job runs at least this long before it can be preempted
max_preemptions_per_day = 0      # a job preempted this often in 24 h is left alone; 0: no cap
non_preemptible_users = []       # who besides admins may submit --no-preempt jobs; ["*"]: everyone
fair_share_half_life = "7d"      # how fast past GPU-hours stop counting against a user
hold_depth = 16                  # blocked jobs that hold GPUs for themselves (backfill respects them)
aging = "24h"                    # a job waiting longer goes before every low and normal job that has waited
                                 # less (the aged oldest first), never before high or urgent; "0": no aging
user_max_priority = "normal"     # the highest class users may use, unless granted more below
# [scheduling.class_grants]      # who besides admins may use a class above user_max_priority
# high = ["alice", "@nlp"]       # users, @groups from [groups], or ["*"] for everyone
# [scheduling.may_preempt]       # which classes may preempt which; default: every class all lower ones
# urgent = ["low", "normal", "high"]
# high = ["low"]                 # a class left out preempts nothing

[quotas]
max_gpus_per_user = 0            # GPUs one user may hold at once; 0: no limit
# [quotas.users]                 # per-user overrides
# alice = 8

[jobs]
default_grace = "60s"            # time a job gets to checkpoint after its signal
max_grace = "4m"                 # lease/2 + fence_after + max_grace + 12s must stay below requeue_after
max_time_limit = "0"             # the longest --time accepted; "0": no limit
# checkpoint_root = "/shared/labq/checkpoints" # LABQ_CHECKPOINT_DIR is ROOT/JOB_ID; put it on storage every
#                                # node mounts so a job resumes on any node. Default: each agent's own folder
allowed_mount_roots = []         # host folders containers may mount (docker runtime)
allowed_images = []              # images the docker runtime may run; empty: any
allow_root = false               # true: jobs may run as uid 0 (root); false: a job of root is refused
export = "ALL"                   # the environment a job gets from its submitter's shell when it says
#                                # nothing (--export): "ALL" as sbatch, or "NONE" (the node's standard one)
cpus_per_gpu = 0                 # a job's CPU cores per GPU when it does not say (--cpus); 0: its node's share
mem_per_gpu = "0"                # a job's memory per GPU when it does not say (--mem), e.g. "32G"; "0": its
#                                # node's share

[reservations]
max_gpu_hours_per_week = 0       # GPU-hours one user may book a week (from Monday 00:00 UTC); 0: no limit
max_lead_time = "30d"            # how far ahead a booking may start
max_duration = "7d"              # how long one booking may last
at_end = "stop"                  # jobs still running in it at its end: "stop" (like a time limit) or "keep"

# [groups]                       # for labq reserve --group NAME, queue members and class grants
# nlp = ["alice", "bob"]

# [queues]                       # teams that share the lab, each with a guaranteed share; none: one lab
# default = "shared"             # the queue of users in no queue; unset: their jobs use what queues leave idle
# reclaim_grace = "2m"           # only jobs with at most this grace borrow (default: jobs.max_grace), so a
#                                # queue gets borrowed GPUs back within it
# [queues.nlp]
# members = ["alice", "@nlp"]    # users and @groups; a user in several queues picks one with --queue
# guarantee = 4                  # GPUs, or "50%" of the lab's GPUs up
# cap = 8                        # the most GPUs its jobs hold at once, borrowed included; omitted: no cap
# lend = true                    # other queues' preemptible jobs may use its idle guarantee until it needs it
# borrow = true                  # its preemptible jobs may use other queues' idle GPUs
# max_wait = "48h"               # a job waiting longer preempts what stands in its way; omitted: no bound

[agents]
lease = "30s"                    # an agent silent this long is marked lost
fence_after = "10m"              # an agent that cannot reach the leader this long stops its jobs
requeue_after = "15m"            # the jobs of a lost agent are requeued after this long
auto_requeue = true              # false: an admin requeues them by hand

[usage]
everyone = false                 # true: every user sees the whole lab's `labq usage`, not only admins

[metrics]
# GET /metrics (Prometheus text) answers any person's token; a scrape token reads it and nothing else.
# Keep this file readable by the leader's account only when it holds one.
# scrape_token = "..."           # at least 24 characters: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'

[notify]
# Where the leader tells people of their jobs' moments (labq submit --notify end,fail; defaults: labq notify).
# A notice is kept in the database until it is delivered: retried, doubling, then given up (labq admin notify status).
retry_first = "5s"               # the first retry of a failed delivery comes this long after it
retry_max = "10m"                # the longest wait between retries
give_up_after = "1d"             # a notice this old is given up; its last error stays in the status
# [notify.webhook]               # an HTTP POST of JSON: {"text": ONE LINE, "labq": {...}}: Slack, Mattermost, ...
# url = "https://hooks.slack.com/services/..."   # a secret: never shown in full, never logged
# timeout = "10s"
# [notify.email]                 # e-mail over SMTP, to the address each person sets (labq notify --email)
# host = "smtp.lab.org"
# port = 587
# starttls = true                # false: plain SMTP (a relay on this machine or a trusted network only)
# ca_file = "/etc/labq/mail-ca.pem"   # the CA of a lab's own mail server (default: the system's CAs)
# user = "labq"                  # omit both for a relay that needs no login
# password = "..."               # keep this file readable by the leader's account only
# from = "labq@lab.org"
# timeout = "10s"
"""
