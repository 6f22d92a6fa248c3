"""Requests whose text cannot be read faithfully are refused before any view sees them.

Django decodes query strings and form bodies leniently: invalid UTF-8 becomes U+FFFD (stored as if the person
typed it), and a NUL reaches the database, where PostgreSQL refuses it with a server error (an admin list filter
`?status__exact=%00`, a search box). The API answers such bodies with a 400; so does every page now, before
any view, form or filter runs.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.urls import Resolver404, resolve

FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
MULTIPART_CONTENT_TYPE = "multipart/form-data"
REPLACEMENT_CHARACTER_UTF8 = "\ufffd".encode()


def query_problem(raw: str) -> str | None:
    """Why a query string or a urlencoded form body cannot be read, or None."""
    if not raw:
        return None
    try:
        pairs = parse_qsl(raw, keep_blank_values=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        return "is not valid UTF-8"
    except ValueError:  # more fields than parse_qsl allows, or a malformed pair
        return None  # Django's own limits answer these
    if any("\x00" in key or "\x00" in value for key, value in pairs):
        return NUL_IN_FORM
    return None


NUL_IN_FORM = "contains a NUL character (U+0000)"


def form_checks_text(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Mark a view whose form checks every text field it reads (planner_site.validators.text_problem): a NUL in
    its urlencoded body reaches it, and the person gets a field error by the field instead of a plain 400 page."""
    view.form_checks_text = True  # type: ignore[attr-defined]
    return view


def view_checks_text(request: HttpRequest) -> bool:
    """Whether the view the request goes to is marked with form_checks_text (resolved only for a NUL: rare)."""
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return False
    return bool(getattr(match.func, "form_checks_text", False))


def request_problem(request: HttpRequest) -> str | None:
    """Why the request's query string or form body cannot be read, or None."""
    if problem := query_problem(request.META.get("QUERY_STRING", "")):
        return f"The address's query string {problem}."
    if request.method == "POST" and request.content_type == FORM_CONTENT_TYPE:
        try:
            body = request.body.decode("ascii")  # a urlencoded body is ASCII; anything else is not a form
        except UnicodeDecodeError:
            return "The form data is not valid UTF-8."
        except RequestDataTooBig:  # Django's own limit answers it in the view
            return None
        if problem := query_problem(body):
            if problem == NUL_IN_FORM and view_checks_text(request):
                return None  # its form says so by the field
            return f"The form data {problem}."
    if request.method == "POST" and request.content_type == MULTIPART_CONTENT_TYPE:
        return multipart_problem(request)
    return None


def multipart_problem(request: HttpRequest) -> str | None:
    """Django decodes a multipart field's invalid UTF-8 as U+FFFD: one that is not in the raw body came from it."""
    try:
        body = request.body
    except RequestDataTooBig:  # Django's own limit answers it in the view
        return None
    if REPLACEMENT_CHARACTER_UTF8 in body:
        return None  # typed as such; nothing to tell apart
    values = [v for _, values in request.POST.lists() for v in values]
    if any("\ufffd" in str(v) for v in values):  # a NUL is refused by the form, by the field's name
        return "The form data is not valid UTF-8."
    return None


def refusal(request: HttpRequest, problem: str) -> HttpResponse:
    message = f"{problem} Nothing was changed."
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": message}, status=400)
    return HttpResponse(message, status=400, content_type="text/plain; charset=utf-8")


class RequestTextMiddleware:
    """Refuse (400) a query string or form body with invalid UTF-8 or a NUL.

    Sync only, and last in MIDDLEWARE (settings): Django runs the middleware below the last one that cannot run
    async on the event loop and the rest in the request's thread, hopping between the two for every hook of
    every middleware in between. With this one last, the whole chain runs in the request's thread: 6 hops a
    request instead of 16, each a wait for the interpreter lock while 200 agents long-poll (tests/bench/load.py).
    Every hook that reads a request's text (CSRF's form check, the views) runs after it.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if problem := request_problem(request):
            return refusal(request, problem)
        return self.get_response(request)
