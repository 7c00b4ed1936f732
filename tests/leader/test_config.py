"""The leader's settings: the documented defaults are the real ones, and mistakes are named."""

from __future__ import annotations

import pytest

from labq.leader.config import ConfigError, LeaderConfig
from labq.leader.config_file import load_config
from labq.leader.default_config import DEFAULT_TOML


def test_the_documented_defaults_are_the_defaults(tmp_path):
    path = tmp_path / "leader.toml"
    path.write_text(DEFAULT_TOML)
    assert load_config(path) == load_config(None) == LeaderConfig()


def test_values_are_read_and_overrides_win(tmp_path):
    path = tmp_path / "leader.toml"
    path.write_text('[leader]\nlisten = "0.0.0.0:8000"\n[quotas]\nmax_gpus_per_user = 4\n[quotas.users]\nalice = 8\n'
                    '[scheduling]\nuser_max_priority = "low"\n[agents]\nlease = "10s"\n')
    config = load_config(path, port=9000)
    assert (config.host, config.port, config.max_gpus_per_user) == ("0.0.0.0", 9000, 4)
    assert config.user_gpu_quota == {"alice": 8} and config.user_max_priority == 100 and config.lease_s == 10
    assert config.url == "https://127.0.0.1:9000"  # another machine may reach it: TLS


def test_reservation_limits_and_groups_are_read(tmp_path):
    path = tmp_path / "leader.toml"
    path.write_text('[reservations]\nmax_gpu_hours_per_week = 96\nmax_lead_time = "14d"\nmax_duration = "0"\n'
                    'at_end = "keep"\n[groups]\nnlp = ["alice", "bob"]\n')
    config = load_config(path)
    assert (config.max_reserved_gpu_hours_per_week, config.max_reservation_lead_s) == (96.0, 14 * 86400)
    assert config.max_reservation_s is None and config.reservation_at_end == "keep"
    assert config.groups == {"nlp": ("alice", "bob")}


def test_queues_are_read_and_a_submit_finds_its_queue(tmp_path):
    path = tmp_path / "leader.toml"
    path.write_text('[groups]\nnlp = ["bob", "cy"]\n[queues]\ndefault = "shared"\nreclaim_grace = "2m"\n'
                    '[queues.nlp]\nmembers = ["ann", "@nlp"]\nguarantee = "50%"\ncap = 6\nmax_wait = "2d"\n'
                    '[queues.cv]\nmembers = ["ann", "dee"]\nguarantee = 2\nlend = false\nborrow = false\n'
                    '[queues.shared]\nguarantee = 0\n')
    config = load_config(path)
    nlp, cv, shared = config.queues
    assert (nlp.name, nlp.members, nlp.guarantee(8), nlp.cap, nlp.max_wait_s) == ("nlp", ("ann", "@nlp"), 4, 6, 172800)
    assert (cv.guarantee(8), cv.lends, cv.borrows) == (2, False, False)
    assert (config.default_queue, config.reclaim_grace_s, shared.guarantee(8)) == ("shared", 120.0, 0)
    assert config.queue_for("bob", None) == "nlp"  # by group: the only queue
    assert config.queue_for("dee", None) == "cv"
    assert config.queue_for("eve", None) == "shared"  # in no queue: the default
    with pytest.raises(ValueError, match="ann is in queues nlp, cv: say which with --queue"):
        config.queue_for("ann", None)
    assert config.queue_for("ann", "cv") == "cv"
    with pytest.raises(PermissionError, match="bob is not a member of queue cv; bob's queues: nlp"):
        config.queue_for("bob", "cv")
    assert config.queue_for("bob", "cv", admin=True) == "cv"
    with pytest.raises(LookupError, match="there is no queue 'ml'; queues: nlp, cv, shared"):
        config.queue_for("bob", "ml")
    assert LeaderConfig().queue_for("bob", None) is None  # no queues: one lab
    with pytest.raises(ValueError, match="this lab has no queues"):
        LeaderConfig().queue_for("bob", "nlp")


def test_preemption_policy_is_read(tmp_path):
    path = tmp_path / "leader.toml"
    path.write_text('[scheduling]\nmax_preemptions_per_day = 3\nnon_preemptible_users = ["alice"]\n'
                    '[scheduling.may_preempt]\nurgent = ["low", "normal"]\nhigh = []\n'
                    '[jobs]\ncheckpoint_root = "/shared/ckpt/"\n')
    config = load_config(path)
    assert config.max_preemptions_per_day == 3 and config.non_preemptible_users == ("alice",)
    assert config.may_preempt == {400: frozenset({100, 200}), 300: frozenset()}
    assert config.checkpoint_root == "/shared/ckpt"


def test_classes_above_normal_are_the_admins_to_grant(tmp_path):
    assert LeaderConfig().max_priority_for("anyone") == 200  # normal, by default
    path = tmp_path / "leader.toml"
    path.write_text('[scheduling.class_grants]\nhigh = ["alice", "@nlp"]\nurgent = ["carol"]\n'
                    '[groups]\nnlp = ["bob"]\n')
    config = load_config(path)
    assert config.class_grants == {300: ("alice", "@nlp"), 400: ("carol",)}
    assert {u: config.max_priority_for(u) for u in ("alice", "bob", "carol", "dave")} == {
        "alice": 300, "bob": 300, "carol": 400, "dave": 200}
    path.write_text('[scheduling]\nuser_max_priority = "high"\nclass_grants = {normal = ["*"], urgent = ["*"]}\n')
    assert load_config(path).max_priority_for("dave") == 400  # a grant at or below the ceiling changes nothing


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[leeder]\n", "unknown section [leeder]"),
        ("[agents]\nleese = 3\n", "unknown key agents.leese"),
        ('[agents]\nlease = "soon"\n', "agents.lease = 'soon': 'soon' is not a duration"),
        ('[leader]\nlisten = "7733"\n', "must be ADDRESS:PORT"),
        ('[scheduling]\npreemption = "yes"\n', "must be true or false"),
        ('[agents]\nrequeue_after = "5m"\n', "requeue_after must be longer than 867 s"),
        # a job that ignores TERM runs until half a lease + fence_after + max_grace + 10 s + looks after the last sync
        ('[agents]\nlease = "2m"\n', "requeue_after must be longer than 912 s"),
        ("not toml [", "is not valid TOML"),
        ('[scheduling.may_preempt]\nurgent = ["lowest"]\n', "'lowest' is not a class"),
        ('[scheduling.may_preempt]\nnormal = ["high"]\n', "normal may preempt only lower classes"),
        ('[scheduling.may_preempt]\nhigh = "low"\n', "high must list the classes it may preempt"),
        ("[scheduling]\nmax_preemptions_per_day = -1\n", "must be a whole number"),
        ('[scheduling]\nnon_preemptible_users = "alice"\n', "must be a list of user names"),
        ('[jobs]\ncheckpoint_root = "shared/ckpt"\n', "must be an absolute path"),
        ('[reservations]\nat_end = "explode"\n', "must be one of stop, keep"),
        ('[reservations]\nmax_gpu_hours_per_week = "lots"\n', "must be a number of GPU-hours"),
        ('[groups]\nnlp = "alice"\n', "must be a list of user names"),
        ('[scheduling.class_grants]\nhigh = "alice"\n', "high must list users or @groups"),
        ('[scheduling.class_grants]\nhighest = ["alice"]\n', "'highest' is not a class"),
        ('[scheduling.class_grants]\nhigh = ["@"]\n', "group name"),
        ('[queues.nlp]\nguarantee = "120%"\n', 'between "0%" and "100%"'),
        ('[queues.nlp]\nguarantee = "lots"\n', "a number of GPUs"),
        ('[queues.nlp]\nmembers = "alice"\n', "must list users and @groups"),
        ('[queues.nlp]\nshare = 4\n', "unknown key queues.nlp.share"),
        ('[queues.nlp]\nmembers = ["@nlp"]\n', "names @nlp, which is not in [groups]"),
        ('[queues]\ndefault = "cv"\n[queues.nlp]\nguarantee = 1\n', "queues.default = 'cv' names no queue"),
        ('[queues.a]\nguarantee = "60%"\n[queues.b]\nguarantee = "50%"\n', "add up to 110% of the lab"),
        ('[queues]\nreclaim_grace = "soon"\n', "is not a duration"),
        ('[notify]\nretry = "5s"\n', "unknown key notify.retry; keys: give_up_after, retry_first, retry_max"),
        ('[notify]\nretry_first = "1m"\nretry_max = "10s"\n', "retry_max must be at least notify.retry_first"),
        ('[notify]\nwebhook = "https://hooks.example/x"\n', "notify.webhook must be a table"),
        ('[notify.webhook]\nurl = "ftp://hooks.example/T0/secret"\n', "notify.webhook.url = .not shown: a secret.: "
                                                                      "must be an http:// or https:// URL"),
        ('[notify.webhook]\ntimeout = "5s"\n', "[notify.webhook] needs url"),
        ('[notify.email]\nhost = "smtp.lab.org"\n', "[notify.email] needs host and from"),
        ('[notify.email]\nhost = "smtp.lab.org"\nfrom = "labq"\n', "is not a plain address"),
        ('[notify.email]\nhost = "smtp.lab.org"\nfrom = "labq@lab.org"\nuser = "labq"\n',
         "needs user and password together"),
        ('[notify.email]\nhost = "h"\nport = 70000\nfrom = "labq@lab.org"\n', "must be a port"),
    ],
)
def test_mistakes_are_named(tmp_path, text, words):
    path = tmp_path / "leader.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_config(path)


def test_the_notification_channels_are_read_and_their_secrets_never_shown(tmp_path):
    path = tmp_path / "leader.toml"
    path.write_text('[notify]\nretry_first = "1s"\nretry_max = "2m"\ngive_up_after = "12h"\n'
                    '[notify.webhook]\nurl = "https://hooks.slack.com/services/T0/B0/hooksecret"\ntimeout = "3s"\n'
                    '[notify.email]\nhost = "smtp.lab.org"\nport = 465\nstarttls = false\nuser = "labq"\n'
                    'password = "pw-secret"\nfrom = "labq@lab.org"\n')
    config = load_config(path)
    n = config.notify
    assert (n.retry_first_s, n.retry_max_s, n.give_up_after_s, n.webhook_timeout_s) == (1, 120, 43200, 3)
    assert (n.smtp_host, n.smtp_port, n.smtp_starttls, n.smtp_user, n.email_from) == (
        "smtp.lab.org", 465, False, "labq", "labq@lab.org")
    assert n.channels == ("webhook", "email") and LeaderConfig().notify.channels == ()
    assert "pw-secret" not in repr(config) and "hooksecret" not in repr(config)
    path.write_text('[notify.email]\nhost = "h"\nfrom = "labq@lab.org"\nuser = "u"\npassword = ["pw-secret"]\n')
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert "notify.email.password = (not shown: a secret)" in str(refused.value)
    assert "pw-secret" not in str(refused.value)
