"""The capture email backend: mails are kept in the database instead of being sent.

The default when no SMTP host is configured (`console/settings.py`), so the demo (`make run`)
shows on the console's "Outbox of notifications" page exactly what would have been mailed —
notifications and the runs' own email outbox items alike. Never used once
`SAFESTOP_EMAIL_HOST` is set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import EmailMessage, EmailMultiAlternatives

from notifications.models import CapturedMail


class CaptureEmailBackend(BaseEmailBackend):
    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        for message in email_messages:
            # Built as SMTP would build it: a message SMTP could never send (a line break in a
            # header) fails here too, instead of the demo showing it as sent.
            message.message()
        rows = [_captured(message) for message in email_messages]
        CapturedMail.objects.bulk_create(rows)
        return len(rows)


def _captured(message: EmailMessage) -> CapturedMail:
    html = ""
    if isinstance(message, EmailMultiAlternatives):
        for content, mimetype in message.alternatives:
            if mimetype == "text/html":
                html = str(content)
    headers: dict[str, Any] = {str(key): str(value) for key, value in message.extra_headers.items()}
    return CapturedMail(
        from_email=str(message.from_email)[:254],
        to=[str(address) for address in message.to],
        subject=str(message.subject)[:300],
        text=str(message.body),
        html=html,
        headers=headers,
    )
