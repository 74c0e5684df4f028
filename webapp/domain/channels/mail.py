"""`email`: one mail to one or more addresses, through Django's mail backend (SMTP when
EMAIL_HOST is set)."""

from __future__ import annotations

import smtplib

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email

from webapp.domain.channels import message
from webapp.domain.channels.base import PermanentError, TargetInvalid, TemporaryError, Transport


def addresses(target: str) -> list[str]:
    return [a.strip() for a in (target or "").split(",") if a.strip()]


class Email(Transport):
    kind = "email"
    label = "E-mail"
    target_help = "e-mail addresses separated by commas"

    @classmethod
    def clean_target(cls, target: str) -> str:
        given = addresses(target)
        bad = []
        for address in given:
            try:
                validate_email(address)
            except ValidationError:
                bad.append(address)
        if bad:
            raise TargetInvalid(f"Not an e-mail address: {', '.join(bad)}.")
        if not given:
            raise TargetInvalid("Give at least one e-mail address.")
        return ", ".join(given)

    def render(self, flip) -> tuple[str, str]:
        """The subject and the text."""
        subject = f"[Lifeboat {flip.project.slug}] {flip.get_kind_display()}"
        text = f"{flip.message}\n\n{message.url(flip)}\n"
        resume = message.resume_url(flip)
        if resume:
            text += f"\n{message.RESUME_LABEL}: {resume}\n"
        return subject, text

    def notify(self, flip, *, message_id: str) -> int | None:
        to = addresses(self.channel.target)
        if not to:
            raise PermanentError("the channel has no address")
        smtp = settings.EMAIL_BACKEND == "django.core.mail.backends.smtp.EmailBackend"
        if smtp and not settings.EMAIL_HOST:
            raise PermanentError("no EMAIL_HOST is configured: this server cannot send e-mail")
        subject, text = self.render(flip)
        try:
            send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, to, fail_silently=False)
        except (smtplib.SMTPException, OSError) as exc:
            raise TemporaryError(f"{type(exc).__name__}: {exc}") from None
        return None
