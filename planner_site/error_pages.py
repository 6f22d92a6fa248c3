"""Error pages and their logging: a refused request (403) is an answer, not a crash, so it is logged as one
line without a traceback. The pages themselves are templates/403.html, 404.html and 500.html, rendered by
Django's default handlers."""

from __future__ import annotations

import logging


class QuietForbidden(logging.Filter):
    """Drop the traceback Django attaches to "Forbidden (Permission denied)" log lines; keep the line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) == 403:
            record.exc_info = None
            record.exc_text = None
        return True
