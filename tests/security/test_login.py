"""Signing in: lockout after repeated failures (per username and per address) shown on the login page,
a full set of password validators, password reset only with mail, HTTPS-only with HSTS under HTTPS=1."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import AsyncClient, Client, override_settings

from tests.factories import UserFactory

LOGIN = "/accounts/login/"
PASSWORD = "pw-for-tests-123"  # UserFactory's


def login(client: Client, username: str, password: str, address: str = "10.0.0.1") -> Any:
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.django_db
def test_login_locks_a_username_after_repeated_failures_and_says_so() -> None:
    UserFactory(username="olga")
    attacker = Client()
    for attempt in range(settings.AXES_FAILURE_LIMIT):
        login(attacker, "olga", f"guess-{attempt}", address=f"10.0.1.{attempt}")  # from many addresses
    response = login(attacker, "olga", PASSWORD, address="10.0.2.1")
    assert response.status_code == 429
    page = response.content.decode()
    assert "Too many failed logins" in page and f"{settings.AXES_COOLOFF_TIME.seconds // 60} minutes" in page
    assert 'name="password"' in page  # still the login page, with the form
    assert not logged_in(attacker)


@pytest.mark.django_db
def test_login_locks_an_address_trying_many_usernames() -> None:
    UserFactory(username="olga")
    attacker = Client()
    for attempt in range(settings.AXES_FAILURE_LIMIT):
        login(attacker, f"user-{attempt}", "guess", address="10.9.9.9")
    assert login(attacker, "olga", PASSWORD, address="10.9.9.9").status_code == 429
    assert not logged_in(attacker)
    someone_else = Client()
    assert login(someone_else, "olga", PASSWORD, address="10.0.0.7").status_code == 302
    assert logged_in(someone_else)


@pytest.mark.django_db
def test_login_below_the_limit_succeeds_and_starts_counting_afresh() -> None:
    UserFactory(username="olga")
    client = Client()
    for attempt in range(settings.AXES_FAILURE_LIMIT - 1):
        assert login(client, "olga", f"typo-{attempt}").status_code == 200
    assert login(client, "olga", PASSWORD).status_code == 302
    client.logout()
    for attempt in range(settings.AXES_FAILURE_LIMIT - 1):
        login(client, "olga", f"typo-{attempt}")
    assert login(client, "olga", PASSWORD).status_code == 302  # the success reset the count


@pytest.mark.django_db(transaction=True)
async def test_login_lockout_holds_through_the_asgi_server_path() -> None:
    """The real server runs Django under ASGI, where django-axes takes its async middleware path."""
    from asgiref.sync import sync_to_async

    await sync_to_async(UserFactory)(username="olga")
    client = AsyncClient()
    for attempt in range(settings.AXES_FAILURE_LIMIT):
        await client.post(LOGIN, {"username": "olga", "password": f"guess-{attempt}"})
    response = await client.post(LOGIN, {"username": "olga", "password": PASSWORD})
    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(("password", "why"), [
    ("operator1", "too similar"),
    ("48213957610", "entirely numeric"),
    ("Zq8#pL", "too short"),
    ("password123", "too common"),
])
def test_weak_passwords_are_refused(password: str, why: str) -> None:
    user = UserFactory(username="operator")
    with pytest.raises(ValidationError, match=why):
        validate_password(password, user=user)


@pytest.mark.django_db
def test_a_strong_password_is_accepted() -> None:
    validate_password("plum-harbor-47-quietly", user=UserFactory(username="operator"))


@pytest.mark.django_db
@override_settings(MAILERS={})
def test_password_reset_is_hidden_without_mail() -> None:
    client = Client()
    assert "Forgot" not in client.get(LOGIN).content.decode()
    for url in ("/accounts/password_reset/", "/accounts/password_reset/done/", "/accounts/reset/done/"):
        assert client.get(url).status_code == 404, url
    assert client.post("/accounts/password_reset/", {"email": "a@example.com"}).status_code == 404


@pytest.mark.django_db
@override_settings(MAILERS={"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}})
def test_password_reset_is_offered_with_mail() -> None:
    client = Client()
    assert 'href="/accounts/password_reset/"' in client.get(LOGIN).content.decode()
    assert client.get("/accounts/password_reset/").status_code == 200


def https_settings(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The settings module as it reads with HTTPS=1 in the environment."""
    monkeypatch.setenv("HTTPS", "1")
    values = runpy.run_path(str(Path(settings.BASE_DIR) / "planner_site" / "settings.py"))
    return {k: v for k, v in values.items() if k.startswith(("SECURE_", "SESSION_COOKIE_", "CSRF_COOKIE_"))}


def test_https_setting_turns_on_redirect_hsts_and_secure_cookies(monkeypatch: pytest.MonkeyPatch) -> None:
    values = https_settings(monkeypatch)
    assert values["SECURE_SSL_REDIRECT"] is True
    assert values["SECURE_HSTS_SECONDS"] >= 365 * 24 * 3600
    assert values["SESSION_COOKIE_SECURE"] and values["CSRF_COOKIE_SECURE"]


@pytest.mark.django_db
def test_https_redirects_plain_http_except_the_health_check(monkeypatch: pytest.MonkeyPatch) -> None:
    with override_settings(**https_settings(monkeypatch)):
        client = Client()
        response = client.get(LOGIN)
        assert response.status_code == 301 and response["Location"].startswith("https://")
        assert client.get("/healthz").status_code in (200, 503)  # the load balancer's probe is answered
        secure = client.get(LOGIN, headers={"x-forwarded-proto": "https"})
        assert secure.status_code == 200
        assert secure["Strict-Transport-Security"].startswith("max-age=31536000")


@pytest.mark.django_db
def test_admin_login_is_throttled_too() -> None:
    UserFactory(username="root", is_staff=True, is_superuser=True)
    client = Client()
    for attempt in range(settings.AXES_FAILURE_LIMIT):
        client.post("/admin/login/", {"username": "root", "password": f"guess-{attempt}"})
    response = client.post("/admin/login/", {"username": "root", "password": PASSWORD})
    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()
    assert not logged_in(client)


@pytest.mark.django_db
def test_login_counts_each_failed_attempt_once_even_when_locked() -> None:
    from axes.models import AccessAttempt

    UserFactory(username="olga")
    attacker = Client()
    for attempt in range(settings.AXES_FAILURE_LIMIT):
        login(attacker, "olga", f"guess-{attempt}")
    assert AccessAttempt.objects.get().failures_since_start == settings.AXES_FAILURE_LIMIT
    response = login(attacker, "olga", "one more guess")
    assert response.status_code == 429 and 'value="olga"' in response.content.decode()
    assert AccessAttempt.objects.get().failures_since_start == settings.AXES_FAILURE_LIMIT + 1
