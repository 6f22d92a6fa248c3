"""The one way the server sends a request to an address a person typed (notification webhooks, Slack incoming
webhooks, the settings page's "Send a test"): nothing inside the deployment is reachable through it.

- `destination_check(url)` reads the URL (http or https, no `user:password@`, a host), resolves the name once
  and refuses it when any address it resolves to is not public: loopback, link-local (the cloud metadata
  services at 169.254.169.254 and fd00:ec2::254), private, unique-local, shared (100.64/10), multicast,
  unspecified (`0.0.0.0`, `[::]`), reserved or documentation ranges, and IPv4 mapped into IPv6 of those. A
  deployer who means to reach an internal receiver names it in OUTBOUND_ALLOWED_NETWORKS (CIDRs and host
  names, comma-separated). Used when a channel is saved and before every send.
- `post(url, body, headers)` checks again and connects to the very address it checked (no second resolution:
  the request goes to the IP, with the `Host` header and the TLS server name (SNI, and the certificate check)
  set to the name), so a DNS answer that changes between the check and the send cannot point it inside.
  Redirects are never followed. At most OUTBOUND_MAX_PER_MINUTE requests a minute go to one host and port.
- What a failure says does not tell an open port from a closed one or from one that does not speak HTTP: every
  failure to get an HTTP answer is the same class, "unreachable"."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.cache import cache

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# What a failed send is, as its owner sees it (never the receiver's body, never the transport's own words).
REFUSED = "refused"  # the guard refused the address: nothing was sent
UNREACHABLE = "unreachable"  # no HTTP answer (closed, filtered, timed out, not HTTP, TLS failed)
HTTP_STATUS = "http_status"  # an HTTP answer that is not 2xx
RATE_LIMITED = "rate_limited"  # too many requests to this destination this minute: not sent, tried later
ERROR_CLASSES = {REFUSED: "address not allowed", UNREACHABLE: "no HTTP answer from the receiver",
                 HTTP_STATUS: "the receiver answered with an error", RATE_LIMITED: "held back: too many this minute"}
EXCERPT_CHARS = 200  # of the receiver's answer, kept for administrators only
READ_BYTES = 4096


class OutboundRefused(ValueError):
    """The URL may not be requested; the message says why in words for the person who typed it."""


@dataclass(frozen=True)
class Destination:
    """A checked URL and the one address the request will go to."""

    url: str
    scheme: str
    host: str  # the name as typed (lower case), or the IP literal
    port: int
    target: str  # path and query
    address: IPAddress

    @property
    def pinned_url(self) -> str:
        host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"{self.scheme}://{host}:{self.port}{self.target}"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def key(self) -> str:
        """What the per-minute cap counts by: the host and port."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Answer:
    ok: bool
    status_code: int | None = None
    error_class: str = ""
    excerpt: str = ""  # the receiver's answer, first EXCERPT_CHARS characters: for administrators only
    duration_ms: int = 0

    @property
    def summary(self) -> str:
        """What the owner is shown: a status and an error class, never the receiver's body."""
        if self.ok:
            return f"HTTP {self.status_code}"
        if self.error_class == HTTP_STATUS:
            return f"HTTP {self.status_code}: {ERROR_CLASSES[HTTP_STATUS]}"
        return f"{self.error_class}: {ERROR_CLASSES.get(self.error_class, '')}"


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (the system resolver); tests replace this function."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def allowed_setting() -> tuple[list[IPNetwork], set[str]]:
    """OUTBOUND_ALLOWED_NETWORKS as networks and host names."""
    networks: list[IPNetwork] = []
    names: set[str] = set()
    for entry in settings.OUTBOUND_ALLOWED_NETWORKS:
        entry = entry.strip().lower().rstrip(".")
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            names.add(entry)
    return networks, names


def address_public(address: IPAddress) -> bool:
    """Whether the address is on the public internet (unicast, globally routed)."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return address_public(mapped)
        if address.teredo is not None:
            return False
    return address.is_global and not (address.is_multicast or address.is_unspecified or address.is_reserved
                                      or address.is_loopback or address.is_link_local or address.is_private)


def address_allowed(address: IPAddress, host: str) -> bool:
    networks, names = allowed_setting()
    if host in names:
        return True
    if any(address.version == n.version and address in n for n in networks):
        return True
    return address_public(address)


def destination_check(url: str, *, hosts: list[str] | None = None) -> Destination:
    """The URL checked and resolved once, or OutboundRefused. `hosts`: the only host names allowed (Slack's)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise OutboundRefused("is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise OutboundRefused("must start with http:// or https://")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise OutboundRefused("must not carry a user name or password (user:password@)")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise OutboundRefused("has no host")
    if hosts is not None and host not in hosts:
        raise OutboundRefused(f"must be on {' or '.join(hosts)}")
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        try:
            addresses = [ipaddress.ip_address(a.split("%")[0]) for a in resolve(host, port)]
        except (OSError, UnicodeError, ValueError):
            raise OutboundRefused("has a host name that does not resolve") from None
    if not addresses:
        raise OutboundRefused("has a host name that does not resolve")
    if not all(address_allowed(a, host) for a in addresses):
        raise OutboundRefused("points at an address inside this network (loopback, private, link-local, "
                              "multicast or metadata), which the server does not call")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return Destination(url=url, scheme=parts.scheme, host=host, port=port, target=target, address=addresses[0])


def url_problem(url: str, *, hosts: list[str] | None = None) -> str | None:
    """Why the URL cannot be a destination (for a form), or None."""
    try:
        destination_check(url, hosts=hosts)
    except OutboundRefused as exc:
        return str(exc)
    return None


def minute_now() -> int:
    """The minute the per-minute cap counts in."""
    return int(time.time() // 60)


def attempt_allowed(destination: Destination) -> bool:
    """One more request to this host and port this minute, unless OUTBOUND_MAX_PER_MINUTE were made (the cache:
    Redis shared by every process in scale-out, the process's own memory in the embedded stack)."""
    limit = settings.OUTBOUND_MAX_PER_MINUTE
    if limit <= 0:
        return True
    key = f"outbound:{destination.key}:{minute_now()}"
    cache.add(key, 0, timeout=120)
    try:
        count = cache.incr(key)
    except ValueError:  # expired between the two calls
        cache.add(key, 1, timeout=120)
        count = 1
    return count <= limit


_client: httpx.Client | None = None
_client_lock = threading.Lock()


def http_client() -> httpx.Client:
    """One client per process (thread-safe): making one loads the TLS certificates, each time. It never
    follows redirects and ignores proxy variables (a proxy would resolve the name again)."""
    global _client
    with _client_lock:
        if _client is None:
            # No kept-alive connections: a pooled connection is keyed by address, and one opened (and its
            # certificate checked) for one name must not carry a request for another name on the same address.
            _client = httpx.Client(timeout=settings.NOTIFY_TIMEOUT_SECONDS, follow_redirects=False, trust_env=False,
                                   limits=httpx.Limits(max_keepalive_connections=0))
        return _client


def post(url: str, body: bytes, headers: dict[str, str], *, hosts: list[str] | None = None) -> Answer:
    """POST `body` to `url` through the guard: checked, resolved once, sent to the address checked."""
    started = time.monotonic()

    def took() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        destination = destination_check(url, hosts=hosts)
    except OutboundRefused as exc:
        return Answer(ok=False, error_class=REFUSED, excerpt=str(exc)[:EXCERPT_CHARS], duration_ms=took())
    if not attempt_allowed(destination):
        return Answer(ok=False, error_class=RATE_LIMITED, duration_ms=took())
    extensions = {"sni_hostname": destination.host} if destination.scheme == "https" else {}
    try:
        with http_client().stream("POST", destination.pinned_url, content=body, extensions=extensions,
                                  headers={"Content-Type": "application/json", **headers,
                                           "Host": destination.host_header}) as response:
            read = b""
            for chunk in response.iter_bytes():  # a few kB at most: never a receiver's whole answer
                read += chunk
                if len(read) >= READ_BYTES:
                    break
    except httpx.HTTPError:  # refused, reset, timed out, not HTTP, TLS: all alike, on purpose
        return Answer(ok=False, error_class=UNREACHABLE, duration_ms=took())
    excerpt = read.decode("utf-8", errors="replace")[:EXCERPT_CHARS]
    if response.is_success:
        return Answer(ok=True, status_code=response.status_code, excerpt=excerpt, duration_ms=took())
    return Answer(ok=False, status_code=response.status_code, error_class=HTTP_STATUS, excerpt=excerpt,
                  duration_ms=took())
