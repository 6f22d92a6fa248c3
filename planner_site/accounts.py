"""Signing in: the login page (with django-axes' lockout after repeated failures shown on it), password
change, and password reset only where mail can actually be sent."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.forms import AuthenticationForm
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.urls import path


def password_reset_enabled() -> bool:
    """Reset links go out by mail: without a mail server the offer would only fail or vanish."""
    return "default" in settings.MAILERS


def lockout_minutes() -> int:
    return int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)


def client_ip(request: HttpRequest) -> str | None:
    """The client's address for throttling: REMOTE_ADDR, or, behind TRUSTED_PROXY_COUNT proxies, the address
    the outermost trusted proxy saw (X-Forwarded-For is read from the right, so a client cannot forge it)."""
    proxies = settings.TRUSTED_PROXY_COUNT
    if proxies:
        forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if a.strip()]
        if len(forwarded) >= proxies:
            return forwarded[-proxies]
    return request.META.get("REMOTE_ADDR")


class LoginView(auth_views.LoginView):
    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return super().get_context_data(**kwargs) | {"password_reset_enabled": password_reset_enabled()}


@login_not_required
def login_locked_out(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict[str, Any] | None = None) -> HttpResponse:
    """django-axes calls this once a user or an address has failed too often: the login page, with why."""
    # Unbound: a bound form would authenticate again to show its errors, counting the attempt a second time.
    form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")[:150]})
    message = (f"Too many failed logins for this account or from this address. Logins are locked for "
               f"{lockout_minutes()} minutes; try again later.")
    context = {"form": form, "locked_out": message, "password_reset_enabled": password_reset_enabled(),
               "next": request.POST.get("next", "")}
    return render(request, "registration/login.html", context, status=429)


def mail_required[**P](view: Callable[P, HttpResponseBase]) -> Callable[P, HttpResponseBase]:
    @wraps(view)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> HttpResponseBase:
        if not password_reset_enabled():
            raise Http404("Password reset needs a mail server (EMAIL_HOST); ask an administrator.")
        return view(*args, **kwargs)

    return wrapper


# django.contrib.auth.urls, with our login page and password reset only when mail is configured.
urlpatterns = [
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password_change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path("password_change/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("password_reset/", login_not_required(mail_required(auth_views.PasswordResetView.as_view())),
         name="password_reset"),
    path("password_reset/done/", login_not_required(mail_required(auth_views.PasswordResetDoneView.as_view())),
         name="password_reset_done"),
    path("reset/<uidb64>/<token>/", login_not_required(mail_required(auth_views.PasswordResetConfirmView.as_view())),
         name="password_reset_confirm"),
    path("reset/done/", login_not_required(mail_required(auth_views.PasswordResetCompleteView.as_view())),
         name="password_reset_complete"),
]
