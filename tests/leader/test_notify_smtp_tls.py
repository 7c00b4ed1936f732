"""E-mail over STARTTLS with a login, as a lab's mail server asks for it: a real SMTP server (``aiosmtpd``) on
loopback that requires STARTTLS before AUTH, with a certificate of its own CA (made here with labq's own
``LabCA``). The channel checks the certificate against the admin's ``ca_file``, logs in, and delivers; a wrong
password or a certificate of another CA is a failed delivery, never a message sent in clear."""

from __future__ import annotations

import email
import email.policy
import smtplib
import socket
import ssl
import threading

import pytest

from labq.leader.certs import LabCA, serving_files
from labq.leader.channels import Email
from labq.leader.config import NotifyConfig
from labq.models.notify import Notice, NotifyEvent

pytestmark = pytest.mark.timeout(60)

USER, PASSWORD = "labq", "mail-s3cret"


class TlsSmtp:
    """aiosmtpd requiring STARTTLS, then AUTH, with the certificate of ``ca``; what it received and who logged in."""

    def __init__(self, folder) -> None:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult

        self.ca = LabCA.load_or_create(folder / "mail", "the lab's mail")
        cert, key = serving_files(self.ca, "127.0.0.1")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self.messages: list[tuple[str, list[str], object, bool]] = []
        self.logins: list[str] = []
        self.changed = threading.Condition()
        receiver = self

        def authenticator(server, session, envelope, mechanism, auth_data):
            ok = auth_data.login == USER.encode() and auth_data.password == PASSWORD.encode()
            if ok:
                receiver.logins.append(auth_data.login.decode())
            return AuthResult(success=ok, handled=False)  # aiosmtpd answers the refusal itself

        class Handler:
            async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
                with receiver.changed:
                    receiver.messages.append((envelope.mail_from, list(envelope.rcpt_tos),
                                              email.message_from_bytes(envelope.content, policy=email.policy.default),
                                              session.ssl is not None))
                    receiver.changed.notify_all()
                return "250 OK"

        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, tls_context=context,
                                     require_starttls=True, authenticator=authenticator, auth_require_tls=True)
        self.controller.start()

    def stop(self) -> None:
        self.controller.stop()


@pytest.fixture
def server(tmp_path):
    made = TlsSmtp(tmp_path)
    yield made
    made.stop()


def notice() -> Notice:
    return Notice("job-12.end", "ada", NotifyEvent.END, 1_790_000_000.0, "succeeded", job_id=12, job_name="train",
                  attempt=1, node="ws1")


def channel(server: TlsSmtp, **changes) -> Email:
    settings = dict(smtp_host="127.0.0.1", smtp_port=server.port, smtp_starttls=True, smtp_user=USER,
                    smtp_password=PASSWORD, email_from="labq@lab.example", smtp_ca_file=str(server.ca.folder / "ca.pem"))
    return Email(NotifyConfig(**(settings | changes)))


def test_a_notice_goes_over_starttls_with_a_login_checked_against_the_admins_ca(server):
    channel(server).send(notice(), "ada@lab.example")
    ((sender, to, message, encrypted),) = server.messages
    assert (sender, to, encrypted, server.logins) == ("labq@lab.example", ["ada@lab.example"], True, [USER])
    assert "job 12" in message["Subject"] and "succeeded" in message.get_content()


def test_a_wrong_password_or_an_unknown_ca_sends_nothing(server):
    with pytest.raises(smtplib.SMTPAuthenticationError):
        channel(server, smtp_password="wrong").send(notice(), "ada@lab.example")
    with pytest.raises(ssl.SSLCertVerificationError):
        channel(server, smtp_ca_file=None).send(notice(), "ada@lab.example")  # the system's CAs do not know it
    assert server.messages == [] and server.logins == []


def test_the_mail_servers_ca_is_read_from_the_settings(tmp_path):
    from labq.leader.config import ConfigError
    from labq.leader.config_file import load_config

    path = tmp_path / "leader.toml"
    path.write_text('[notify.email]\nhost = "smtp.lab.example"\nfrom = "labq@lab.example"\n'
                    'ca_file = "/etc/labq/mail-ca.pem"\n')
    assert load_config(path).notify.smtp_ca_file == "/etc/labq/mail-ca.pem"
    path.write_text('[notify.email]\nhost = "smtp.lab.example"\nfrom = "labq@lab.example"\nca_file = "mail-ca.pem"\n')
    with pytest.raises(ConfigError, match="ca_file.*absolute path"):
        load_config(path)
