"""Which addresses the scaler may scrape, checked on the address it really connects to.

A tenant names replicas (``endpoints``, ``dnsName``) or the cluster does (EndpointSlices, pods); either way
the scaler must never be made to fetch a cloud metadata service or another link-local host. Checking the
text of a URL is not enough: ``2852039166``, ``0xa9fea9fe``, ``169.254.43518`` and ``169。254。169。254``
are all 169.254.169.254 to the C library, and a host name can resolve anywhere, at any time. So:

* ``normalize_host`` turns every spelling the resolver accepts into one canonical form (IDNA, then the
  ``inet_aton`` numeric forms as dotted IPv4), and ``refusal`` says why an address or name is refused;
* ``AddressPolicy`` adds what the operator refuses on top (``--refuse-networks``, e.g. ``loopback``: the
  scaler's own pod) or confines scrapes to (``--allow-networks``, e.g. the pod CIDR), process-wide;
* ``GuardedBackend`` is the network backend of the scrape client: it resolves the host itself, drops
  refused addresses and connects to a checked one, so what was checked is what is connected to (no
  time-of-check/time-of-use gap through a DNS answer that changes).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import Final

import httpcore

__all__ = [
    "NETWORK_ALIASES",
    "REFUSED_NAMES",
    "AddressPolicy",
    "GuardedBackend",
    "RefusedAddress",
    "normalize_host",
    "parse_networks",
    "redact",
    "refusal",
    "set_policy",
]

# Names of metadata services that answer on link-local addresses (and some that resolve elsewhere).
REFUSED_NAMES: Final = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.tencentyun.com",
        "metadata.platformequinix.com",
    }
)
_LINK_LOCAL_V4: Final = ipaddress.ip_network("169.254.0.0/16")
_LINK_LOCAL_V6: Final = ipaddress.ip_network("fe80::/10")
_AWS_IMDS_V6: Final = ipaddress.ip_network("fd00:ec2::/32")
_NUMERIC: Final = frozenset("0123456789abcdefx.")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Names accepted by --refuse-networks / --allow-networks besides CIDRs.
NETWORK_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "loopback": ("127.0.0.0/8", "::1/128"),
    # RFC 1918, shared address space (RFC 6598, carrier NAT and some clusters' pod ranges), unique local v6
    "private": ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"),
}


def parse_networks(raw: str, flag: str) -> tuple[Network, ...]:
    """Comma-separated CIDRs or aliases (``loopback``, ``private``); ValueError naming ``flag``."""
    networks: list[Network] = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        for cidr in NETWORK_ALIASES.get(item.lower(), (item,)):
            try:
                networks.append(ipaddress.ip_network(cidr, strict=False))
            except ValueError:
                raise ValueError(
                    f"{flag} {item!r}: accepted: comma-separated CIDRs (10.244.0.0/16, fd00::/8) or "
                    f"{' | '.join(NETWORK_ALIASES)}"
                ) from None
    return tuple(networks)


class AddressPolicy:
    """What the operator refuses beyond the fixed rules, or confines scraping to."""

    def __init__(self, refuse: tuple[Network, ...] = (), allow: tuple[Network, ...] = ()) -> None:
        self.refuse = refuse
        self.allow = allow

    def refusal(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        for net in self.refuse:
            if ip.version == net.version and ip in net:
                return f"{ip} is in refused network {net} (--refuse-networks)"
        if self.allow and not any(ip.version == net.version and ip in net for net in self.allow):
            return f"{ip} is outside --allow-networks"
        return None


_policy = AddressPolicy()


def set_policy(policy: AddressPolicy) -> AddressPolicy:
    """Install the process-wide policy (``serve`` does, from its flags); returns the previous one."""
    global _policy
    previous, _policy = _policy, policy
    return previous


class RefusedAddress(httpcore.ConnectError):
    """The scrape client refused to connect (a ConnectError, so the scrape reports it as one)."""


def redact(url: str) -> str:
    """A URL fit for logs: no query string or credentials (a ``?token=`` must not end up in a log)."""
    base, sep, _ = url.partition("?")
    scheme, _, rest = base.partition("://")
    rest = rest.split("@", 1)[-1]
    return f"{scheme}://{rest}" + ("?…" if sep else "")


def normalize_host(host: str) -> str:
    """The canonical form of a URL host: no brackets or trailing dot, IDNA (so full-width and ideographic
    dots are dots), lower case, and any numeric IPv4 spelling ``inet_aton`` accepts as dotted quad."""
    h = host.strip().strip("[]").rstrip(".")
    if ":" in h:  # IPv6 literal (a zone id is not an address we scrape)
        try:
            return str(ipaddress.ip_address(h.split("%", 1)[0]))
        except ValueError:
            return h.lower()
    try:
        h = h.encode("idna").decode("ascii")
    except UnicodeError:
        return h.lower()
    h = h.lower()
    if h and set(h) <= _NUMERIC:
        try:
            return socket.inet_ntoa(socket.inet_aton(h))
        except OSError:
            pass
    return h


def refusal(host_or_ip: str) -> str | None:
    """Why this (normalised) host or address may not be scraped, or None."""
    h = normalize_host(host_or_ip)
    if h in REFUSED_NAMES:
        return f"{h} is a metadata service name"
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return None  # a name: checked again on what it resolves to
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip in _AWS_IMDS_V6:
            return f"{ip} is a metadata service address"
    if ip in _LINK_LOCAL_V4 or ip in _LINK_LOCAL_V6:
        return f"link-local address {ip}"
    if ip.is_multicast or ip.is_unspecified:
        return f"{ip} is not a unicast host"
    return _policy.refusal(ip)


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolve, check, then connect to the checked address."""

    def __init__(self, resolve_timeout_s: float = 5.0) -> None:
        self._inner = httpcore.AnyIOBackend()
        self._resolve_timeout_s = resolve_timeout_s

    async def _addresses(self, host: str, port: int, timeout: float | None) -> list[str]:
        h = normalize_host(host)
        try:
            ipaddress.ip_address(h)
            return [h]
        except ValueError:
            pass
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(h, port, type=socket.SOCK_STREAM), timeout or self._resolve_timeout_s
            )
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {h} timed out") from None
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"resolving {h}: {exc.strerror}") from None
        return list(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        why = refusal(host)
        if why is not None:
            raise RefusedAddress(f"refused: {why}")
        addresses = await self._addresses(host, port, timeout)
        reasons = {a: refusal(a) for a in addresses}
        allowed = [a for a, why in reasons.items() if why is None]
        if not allowed:
            first = next(iter(reasons.values()), None)
            raise RefusedAddress(f"refused: {normalize_host(host)} resolves only to refused addresses ({first})")
        error: Exception | None = None
        for address in allowed:
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise RefusedAddress("refused: unix sockets are not replicas")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
